"""ScienceWorld tasks as small files, so that they are versioned, listed and split like games.

A ScienceWorld task is a task type, one of its variations and a simplification; its file
(`<name>.swtask`, JSON) holds those and the task's text, read once when the file is written, so
that listing tasks needs no JVM. ScienceWorld splits each type's variations into train, dev and
test sets itself: the project's `train` games come from the train variations, its `test` games
from the test variations, so no held-out variation is ever played in collection or training.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dreamgym.envs.base import GameFileError, Task

if TYPE_CHECKING:
    from dreamgym.curriculum import WriteVariations

ENV_NAME = "scienceworld"
SUFFIX = ".swtask"
SIMPLIFICATION = "easy"  # doors stand open, teleporting is allowed, no electrical subtleties


@dataclass(frozen=True)
class TaskSpec:
    """One ScienceWorld task: what `load` needs, and the task's text."""

    task: str
    variation: int
    simplification: str
    instruction: str

    @property
    def name(self) -> str:
        return task_name(self.task, self.variation)


def task_name(task: str, variation: int) -> str:
    """A task's id and its file's stem: 'sw-find-animal-v12'."""
    return f"sw-{task}-v{variation}"


def task_type(task_id: str) -> str | None:
    """The task type of a ScienceWorld task id ('sw-find-animal-v12' -> 'find-animal'), None for another id."""
    if not task_id.startswith("sw-") or "-v" not in task_id:
        return None
    return task_id[len("sw-") :].rsplit("-v", 1)[0]


def read_spec(path: str | Path) -> TaskSpec:
    path = Path(path)
    if path.suffix != SUFFIX or not path.is_file():
        raise GameFileError(
            f"{path} is not a ScienceWorld task file; write them with `dreamgym games --env scienceworld`"
        )
    try:
        return TaskSpec(**json.loads(path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as error:
        raise GameFileError(f"{path} is not a valid ScienceWorld task file ({error}); write it again") from None


def load_task(path: str | Path) -> Task:
    """The task a `.swtask` file poses (its id is the file's stem)."""
    path = Path(path).resolve()
    spec = read_spec(path)
    return Task(task_id=path.stem, instruction=spec.instruction, env=ENV_NAME, game_file=str(path), max_score=100)


def variations(backend, task: str, split: str) -> list[int]:
    """ScienceWorld's own variation split of `task`: 'train' or 'test' ('dev' too)."""
    backend.load(task, 0, SIMPLIFICATION)
    return list(
        {"train": backend.get_variations_train, "dev": backend.get_variations_dev, "test": backend.get_variations_test}[
            split
        ]()
    )


def ordered_variations(backend, task: str, split: str, seed: int) -> list[int]:
    """`task`'s `split` variations in the order `seed` shuffles them: the project takes its
    training tasks, then the ones RL practises, then the curriculum's, from the front."""
    order = variations(backend, task, split)
    random.Random(f"{seed}-{task}-{split}").shuffle(order)
    return order


def _write_spec(backend, task: str, variation: int, path: Path) -> None:
    backend.load(task, variation, SIMPLIFICATION)
    spec = TaskSpec(task, variation, SIMPLIFICATION, " ".join(backend.get_task_description().split()))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(spec), indent=1) + "\n")
    tmp.replace(path)


def write_tasks(
    task_types: Sequence[str], split: str, per_type: int, seed: int, out_dir: str | Path, first: int = 0
) -> list[Path]:
    """`per_type` variations of each type of `task_types` from the type's `split` variations, in
    the order `seed` shuffles them, from the `first`-th on (the training tasks, then the ones RL
    practises after them), written to `out_dir` (a file that exists is kept). Returns every path."""
    from dreamgym.envs.scienceworld.env import started_backend

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = started_backend()
    paths = []
    try:
        known = set(backend.get_task_names())
        for task in task_types:
            if task not in known:
                raise GameFileError(f"ScienceWorld has no task type {task!r}; choose from {', '.join(sorted(known))}")
            pool = ordered_variations(backend, task, split, seed)
            if first + per_type > len(pool):
                raise GameFileError(
                    f"{task} has {len(pool)} {split} variations, fewer than the {first + per_type} asked "
                    f"(first {first} + {per_type}); ask for fewer"
                )
            for variation in sorted(pool[first : first + per_type]):
                path = out_dir / f"{task_name(task, variation)}{SUFFIX}"
                if not path.is_file():
                    _write_spec(backend, task, variation, path)
                paths.append(path)
    finally:
        backend.close()
    return paths


def unseen_variation_writer(out_dir: str | Path, seed: int, first: int) -> WriteVariations:
    """`write_variations` for `Curriculum` (`curriculum.variations: games`): for each seed task, train
    variations of its task type that the project has not used (those after the `first` of the seed's
    order: the training tasks and the ones RL practises), real tasks that the offline data never
    showed, valid and solvable by construction (ScienceWorld made them, with a gold path). The seeds
    are taken in turn, each type's variations in the order `seed` shuffles them, made `count` at a
    time as far as the curriculum reads; a variation read once is not offered again. Each comes as a
    Task with its seed's id (the curriculum names the variation), its task file in `out_dir` and its
    initial state read by a reset."""
    from dreamgym.envs.real import tasks_at_start
    from dreamgym.envs.scienceworld.env import started_backend

    out_dir = Path(out_dir)
    offered: set[str] = set()
    unused: dict[str, list[int]] = {}  # each task type's variations after the project's, in order

    def orders(seeds: Sequence[Task]) -> list[tuple[Task, str, list[int]]]:
        kinds = {task_type(origin.task_id) for origin in seeds} - {None} - set(unused)
        if kinds:
            backend = started_backend()
            try:
                for kind in sorted(kinds):
                    unused[kind] = ordered_variations(backend, kind, "train", seed)[first:]
            finally:
                backend.close()
        return [(origin, kind, unused[kind]) for origin in seeds if (kind := task_type(origin.task_id))]

    def candidates(seeds: Sequence[Task]) -> Iterator[tuple[Task, str, int]]:
        chosen, seen = orders(seeds), set()
        for turn in itertools.count():
            row = [(origin, kind, order[turn]) for origin, kind, order in chosen if turn < len(order)]
            if not row:
                return
            for origin, kind, variation in row:
                if (kind, variation) not in seen and task_name(kind, variation) not in offered:
                    seen.add((kind, variation))
                    yield origin, kind, variation

    def write(seeds: Sequence[Task], count: int) -> Iterator[Task]:
        out_dir.mkdir(parents=True, exist_ok=True)
        pending = candidates(seeds)
        while batch := list(itertools.islice(pending, max(count, 1))):
            paths = [out_dir / f"{task_name(kind, variation)}{SUFFIX}" for _, kind, variation in batch]
            if missing := [(item, path) for item, path in zip(batch, paths) if not path.is_file()]:
                backend = started_backend()
                try:
                    for (_, kind, variation), path in missing:
                        _write_spec(backend, kind, variation, path)
                finally:
                    backend.close()
            for (origin, _, _), path, start in zip(batch, paths, tasks_at_start(paths), strict=True):
                offered.add(path.stem)  # when read: one made but not read is offered again
                yield dataclasses.replace(start, task_id=origin.task_id)

    return write
