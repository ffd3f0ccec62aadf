"""The stages that fan out, played in pieces that run elsewhere: game generation, trajectory
collection, real-environment evaluation.

Each `*_in_pieces` function makes what its one-process counterpart makes (`generate_games`,
`collect`, `evaluate_policy`), from the same inputs: it cuts the work with `dreamgym.ops.sharding`,
hands the pieces to a `Fanout` (flows/compute.py runs them as Prefect tasks on Ray workers) and
puts their results back in order. A piece is a module-level function of plain, small arguments
(paths, settings) returning small values (paths, records): a worker on another machine loads the
policy and reads the games itself, from a filesystem the machines share.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from dreamgym.data.collect import (
    CollectionResult,
    CollectionSettings,
    collect_game,
    plan_collection,
    summarize,
)
from dreamgym.data.schema import read_transitions, to_table, write_transitions
from dreamgym.errors import DreamgymError
from dreamgym.evaluation import BATCH, EvaluationReport, evaluate_policy
from dreamgym.evaluation import summarize as summarize_episodes
from dreamgym.ops.sharding import evaluation_shards, merge, split
from dreamgym.policy.model import load_policy

if TYPE_CHECKING:  # game generation is TextWorld's: its module is imported where games are made
    from dreamgym.envs.textworld.games import GameSpec

R = TypeVar("R")


class Fanout(Protocol):
    """Runs the pieces of a stage somewhere, all at once as far as `width` allows."""

    @property
    def width(self) -> int:
        """Pieces worth cutting a stage into: how many run at once."""
        ...

    def map(self, fn: Callable[..., R], calls: Sequence[dict[str, Any]]) -> list[R]:
        """`fn(**call)` for every call, in any order or place; the results in the calls' order."""
        ...


class InProcess:
    """Every piece in this process, one after the other: the pieces' logic without a cluster."""

    def __init__(self, width: int = 1) -> None:
        self.width = width

    def map(self, fn: Callable[..., R], calls: Sequence[dict[str, Any]]) -> list[R]:
        return [fn(**call) for call in calls]


# --- game generation -----------------------------------------------------------------------------


def make_games_piece(specs: list[GameSpec], out_dir: str) -> list[str]:
    """A piece: compile `specs` into `out_dir` one after the other (in one child process)."""
    from dreamgym.envs.textworld.games import make_games

    return [str(path) for path in make_games(specs, out_dir)]


def generate_in_pieces(specs: Sequence[GameSpec], out_dir: str | Path, fanout: Fanout) -> tuple[list[Path], int]:
    """`generate_games` in pieces: the same games (a game depends on its spec alone), the paths
    in spec order and how many were made now."""
    from dreamgym.envs.textworld.games import is_complete

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{spec.name}.z8" for spec in specs]
    todo = [spec for spec, path in zip(specs, paths) if not is_complete(path)]
    fanout.map(make_games_piece, [{"specs": piece, "out_dir": str(out_dir)} for piece in split(todo, fanout.width)])
    return paths, len(todo)


# --- trajectory collection -----------------------------------------------------------------------


def collect_piece(games: list[str], out: str, settings: CollectionSettings, run_id: str | None) -> str:
    """A piece: every episode of `games`, in their order, written to the part file `out`."""
    rows = [row for game in games for row in collect_game(game, settings, run_id)]
    return str(write_transitions(to_table(rows), out))


def collect_in_pieces(
    games: Sequence[str | Path],
    out: str | Path,
    settings: CollectionSettings,
    fanout: Fanout,
    run_id: str | None = None,
) -> CollectionResult:
    """`collect` in pieces: the same rows in the same order, the same file metadata (so either
    way reuses what the other collected). Each episode's random stream is seeded from (seed, task,
    episode), so where it is played changes nothing. The pieces write part files in a scratch
    folder beside `out` (on the shared filesystem), read back here and removed."""
    out = Path(out)
    games, metadata, reused = plan_collection(games, out, settings)
    if reused:
        return reused
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.parts-", dir=out.parent) as scratch:
        calls = [
            {
                "games": piece,
                "out": str(Path(scratch) / f"part-{index:04d}.parquet"),
                "settings": settings,
                "run_id": run_id,
            }
            for index, piece in enumerate(split([str(game) for game in games], fanout.width))
        ]
        parts = fanout.map(collect_piece, calls)
        rows = merge(read_transitions(part).to_pylist() for part in parts)
    table = to_table(rows, metadata)
    write_transitions(table, out)
    return CollectionResult(path=str(out), seconds=time.perf_counter() - started, reused=False, **summarize(table))


# --- real-environment evaluation -----------------------------------------------------------------


def evaluate_piece(
    policy_dir: str, games: list[str], episodes_per_game: int, seed: int, max_steps: int, greedy: bool
) -> list[dict]:
    """A piece: the policy saved in `policy_dir` evaluated on `games`; its per-episode records."""
    report = evaluate_policy(
        load_policy(policy_dir), games, episodes_per_game, seed, max_steps, greedy=greedy, batch=BATCH, progress=False
    )
    return report.records


def evaluate_in_pieces(
    policy_dir: str | Path,
    games: Sequence[str | Path],
    episodes_per_game: int,
    seed: int,
    max_steps: int,
    greedy: bool,
    fanout: Fanout,
) -> EvaluationReport:
    """`evaluate_policy(load_policy(policy_dir), ...)` in shards: the same records in the same
    order, so the same summary. Greedy evaluations are cut at batch boundaries; a sampled one is
    one piece (dreamgym/ops/sharding.py says why)."""
    if not games:
        raise DreamgymError("no games to evaluate on; generate held-out games with `dreamgym games --split test`")
    shards = evaluation_shards([str(game) for game in games], fanout.width, episodes_per_game, BATCH, greedy)
    common = {
        "policy_dir": str(policy_dir),
        "episodes_per_game": episodes_per_game,
        "seed": seed,
        "max_steps": max_steps,
        "greedy": greedy,
    }
    records = merge(fanout.map(evaluate_piece, [common | {"games": shard} for shard in shards]))
    return EvaluationReport(summarize_episodes(records), records)
