"""ScienceWorld tasks as small files, so that they are versioned, listed and split like games.

A ScienceWorld task is a task type, one of its variations and a simplification; its file
(`<name>.swtask`, JSON) holds those and the task's text, read once when the file is written, so
that listing tasks needs no JVM. ScienceWorld splits each type's variations into train, dev and
test sets itself: the project's `train` games come from the train variations, its `test` games
from the test variations, so no held-out variation is ever played in collection or training.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dreamgym.envs.base import GameFileError, Task

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
        return f"sw-{self.task}-v{self.variation}"


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
            pool = variations(backend, task, split)
            if first + per_type > len(pool):
                raise GameFileError(
                    f"{task} has {len(pool)} {split} variations, fewer than the {first + per_type} asked "
                    f"(first {first} + {per_type}); ask for fewer"
                )
            random.Random(f"{seed}-{task}-{split}").shuffle(pool)
            for variation in sorted(pool[first : first + per_type]):
                path = out_dir / f"sw-{task}-v{variation}{SUFFIX}"
                if not path.is_file():
                    backend.load(task, variation, SIMPLIFICATION)
                    spec = TaskSpec(task, variation, SIMPLIFICATION, " ".join(backend.get_task_description().split()))
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(asdict(spec), indent=1) + "\n")
                    tmp.replace(path)
                paths.append(path)
    finally:
        backend.close()
    return paths
