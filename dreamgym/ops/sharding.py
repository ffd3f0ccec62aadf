"""Cutting fanned-out work into pieces, and putting the pieces' results back together.

On a Ray cluster (`compute.task_runner: ray`, flows/compute.py) each piece is one Prefect task,
run by whichever worker is free, finishing in any order. What comes back must be what one process
makes, record for record, so:

- a piece is a contiguous run of the work in its order, and results are concatenated in piece
  order, never in order of completion (`split`, `merge`);
- an evaluation is cut only where its batches are cut (`evaluation_shards`): the policy decides
  for a whole batch in one forward pass of left-padded prompts, and another batch mix is another
  sum order in the padded matrix products, which can flip a greedy argmax between near-equal
  actions. Cut at batch boundaries, every batch holds the very episodes it holds in one process;
- a sampled evaluation (`greedy: false`) is not cut at all: its actions are drawn in turn from
  one generator seeded once (dreamgym/evaluation.py), so a piece starting mid-way would need the
  generator's state after the episodes before it, known only by playing them. Re-seeding per
  piece would make the report depend on the number of workers, and change the outcomes a
  champion was measured with on the same evaluation set (the promotion gate pairs them).

Pure functions: the flows decide where the pieces run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def split(items: Sequence[T], pieces: int, unit: int = 1) -> list[list[T]]:
    """`items` as at most `pieces` contiguous runs, in order, as even as blocks of `unit` items
    allow: every run but the last is a whole number of blocks (the last takes the remainder).
    No empty runs: fewer blocks than `pieces` gives one run per block; no items gives none."""
    if pieces < 1 or unit < 1:
        raise ValueError(f"pieces and unit must be at least 1, got {pieces} and {unit}")
    blocks = math.ceil(len(items) / unit)
    count = min(pieces, blocks)
    if not count:
        return []
    # Run i holds blocks [i * blocks // count, (i + 1) * blocks // count): sizes differ by one block at most.
    bounds = [min(len(items), (i * blocks // count) * unit) for i in range(count + 1)]
    return [list(items[start:end]) for start, end in itertools.pairwise(bounds)]


def merge(parts: Iterable[Sequence[T]]) -> list[T]:
    """The pieces' results back in one list, in piece order (the inverse of `split`)."""
    return [item for part in parts for item in part]


def evaluation_unit(episodes_per_game: int, batch: int) -> int:
    """Games in the smallest block an evaluation can be cut after: episodes are played game by
    game (`episodes_per_game` each) in batches of `batch`, so a cut after g games falls on a batch
    boundary when g * episodes_per_game is a multiple of `batch`."""
    if episodes_per_game < 1 or batch < 1:
        raise ValueError(f"episodes_per_game and batch must be at least 1, got {episodes_per_game} and {batch}")
    return batch // math.gcd(batch, episodes_per_game)


def evaluation_shards(
    games: Sequence[T], pieces: int, episodes_per_game: int, batch: int, greedy: bool
) -> list[list[T]]:
    """The games of an evaluation in at most `pieces` shards, each evaluated on its own with the
    same settings, whose records `merge` back into the one-process report: cut only at batch
    boundaries, and not at all when sampling (see the module docstring)."""
    if not greedy:
        return [list(games)] if games else []
    return split(games, pieces, evaluation_unit(episodes_per_game, batch))
