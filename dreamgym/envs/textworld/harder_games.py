"""Curriculum variations as real games one step harder than their seed (`curriculum.variations:
games`).

The curriculum asks for variations of the seed tasks the policy is least sure of. This writer
answers with a game tw-cooking makes from the seed's own spec (its split and seed, read back from
the game's name) with one setting raised: one more ingredient in the recipe, one more of them to
find, or the next size of map (1, 6, 9, 12 rooms). The variation is the new game's initial state,
read by one reset and no step, so it is valid by construction (a real start, real actions) and
solvable (tw-cooking makes a game with its walkthrough); and it asks for more than the seed did,
which the offline data, the seeds and the backbone's own variations never reach.

A variation is made in the seed's split: a training game's variation never becomes a held-out
game (the test split has other foods and its own file names). Games already made are reused, and a
resumed run takes the same variations (`harder_game_writer`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from dreamgym.curriculum import WriteVariations
from dreamgym.envs.base import Task
from dreamgym.envs.real import tasks_at_start
from dreamgym.envs.textworld.games import GameSpec, generate_games, spec_of

logger = logging.getLogger(__name__)

MAX_RECIPE = 5  # tw-cooking's largest recipe
ROOMS = (1, 6, 9, 12)  # tw-cooking's map sizes (--go)


def harder_specs(spec: GameSpec) -> list[GameSpec]:
    """The specs one step harder than `spec`: a larger recipe, more of it to find (never more than
    the recipe holds), the next map size. Empty at tw-cooking's largest game."""
    steps = []
    if spec.recipe < MAX_RECIPE:
        steps.append(dataclasses.replace(spec, recipe=spec.recipe + 1))
    if spec.take < spec.recipe:
        steps.append(dataclasses.replace(spec, take=spec.take + 1))
    larger = [rooms for rooms in ROOMS if rooms > spec.go]
    if larger:
        steps.append(dataclasses.replace(spec, go=larger[0]))
    return steps


def harder_game_writer(out_dir: str | Path, seed: int = 0, workers: int = 1) -> WriteVariations:
    """`write_variations` for `Curriculum`: the seeds' one-step-harder games not offered before,
    the seeds taken in turn, each seed's in an order fixed by `seed` and the seed alone; made into
    `out_dir` `count` at a time, as far as the curriculum reads, each a Task with its seed's id (the
    curriculum names the variation), the new game's file, initial state and max score. A seed whose
    name is not a game's, or whose harder games were all offered, gets none. A resumed run's new
    writer offers the games its pool holds first; they are rejected as duplicates and it goes on to
    the ones the uninterrupted run would have offered next."""
    offered: set[str] = set()

    def candidates(seeds: Sequence[Task]) -> Iterator[tuple[Task, GameSpec]]:
        orders = []
        for task in seeds:
            spec = spec_of(task.task_id)
            if spec is None:
                logger.warning("no harder game for %s: its id is not a game's name", task.task_id)
                continue
            steps = harder_specs(spec)
            random.Random(f"{seed}:harder:{task.task_id}").shuffle(steps)
            orders.append((task, steps))
        # The whole order first, what was offered skipped after: a resumed run's new writer then
        # walks the same order as the uninterrupted one's.
        for turn in itertools.count():
            row = [(task, steps[turn]) for task, steps in orders if turn < len(steps)]
            if not row:
                return
            yield from ((task, step) for task, step in row if step.name not in offered)

    def write(seeds: Sequence[Task], count: int) -> Iterator[Task]:
        pending = candidates(seeds)
        while batch := list(itertools.islice(pending, max(count, 1))):
            paths, _ = generate_games([spec for _, spec in batch], out_dir, workers=workers, progress=False)
            for (origin, spec), start in zip(batch, tasks_at_start(paths)):
                offered.add(spec.name)  # when read: one made but not read is offered again
                yield dataclasses.replace(start, task_id=origin.task_id)

    return write
