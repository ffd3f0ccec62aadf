"""The real environments, reached by the kind of file a task comes in: the one module that names them.

Collection, evaluation, real-environment RL and the initial states of DreamEnv's seed tasks need
a real environment; they ask this module for the task files of a folder (`list_games`), the task
a file poses and an environment that plays it, and never import an environment's package. A
TextWorld cooking game is a compiled `.z8` story (`envs/textworld/`); a ScienceWorld task is a
`.swtask` file naming a task type and variation (`envs/scienceworld/`). A folder of tasks holds one
kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from dreamgym.envs.base import Env, GameFileError, Task
from dreamgym.errors import DreamgymError

# suffix of a task file -> the environment that plays it
ENVIRONMENTS = {".z8": "textworld", ".swtask": "scienceworld"}


def environment_of(path: str | Path) -> str:
    """The environment whose task `path` is."""
    name = ENVIRONMENTS.get(Path(path).suffix)
    if name is None:
        raise GameFileError(
            f"{path} is no task file: a TextWorld game ends in .z8, a ScienceWorld task in .swtask "
            "(make them with `dreamgym games`)"
        )
    return name


def load_task(path: str | Path) -> Task:
    """The task a file poses, checked (a corrupt game is refused here, not in the middle of a run)."""
    if environment_of(path) == "scienceworld":
        from dreamgym.envs.scienceworld.tasks import load_task as load_scienceworld_task

        return load_scienceworld_task(path)
    from dreamgym.envs.textworld.env import load_task as load_textworld_task

    return load_textworld_task(path)


def real_env(name: str, max_steps: int, expert: bool = False) -> Env:
    """A fresh real environment of kind `name` ('textworld' or 'scienceworld'). `expert`: whether
    `info["expert_action"]` must be given where the environment has to work it out (collection
    needs it; evaluation and RL do not, and ScienceWorld's costs ~0.1 s a step)."""
    if name == "scienceworld":
        from dreamgym.envs.scienceworld.env import ScienceWorldEnv

        return ScienceWorldEnv(max_steps=max_steps, expert=expert)
    if name == "textworld":
        from dreamgym.envs.textworld.env import TextWorldEnv

        return TextWorldEnv(max_steps=max_steps)
    raise ValueError(f"{name!r} names no real environment: use one of {', '.join(sorted(set(ENVIRONMENTS.values())))}")


def env_for(paths: Iterable[str | Path], max_steps: int, expert: bool = False) -> Env:
    """A real environment that plays every task of `paths` (one kind: a mixed folder is refused)."""
    kinds = {environment_of(path) for path in paths}
    if len(kinds) != 1:
        raise GameFileError(
            f"tasks of {len(kinds) or 'no'} environments ({', '.join(sorted(kinds))}) were given to be played "
            "together: keep one environment's tasks per folder"
        )
    return real_env(kinds.pop(), max_steps, expert)


def task_files(folder: str | Path) -> list[Path]:
    """The task files in `folder` (any environment's), sorted."""
    folder = Path(folder)
    return sorted(path for suffix in ENVIRONMENTS for path in folder.glob(f"*{suffix}"))


def games_if_any(games_dir: str | Path | None) -> list[Path]:
    """The games (`.z8`) or tasks (`.swtask`) in a folder, sorted; none where no folder is given, it
    is not there or it is empty (`games.task_count: 0` makes an empty one)."""
    if games_dir is None or not Path(games_dir).is_dir():
        return []
    return task_files(games_dir)


def list_games(games_dir: str | Path) -> list[Path]:
    """The games or tasks in a folder, sorted; an error if there are none."""
    games_dir = Path(games_dir)
    if not games_dir.is_dir():
        raise DreamgymError(f"games folder {games_dir} does not exist; generate games with `dreamgym games --out DIR`")
    games = games_if_any(games_dir)
    if not games:
        raise DreamgymError(f"no games (.z8) or tasks (.swtask) in {games_dir}; generate them with `dreamgym games`")
    return games


def task_setting(task_id: str) -> str:
    """What kind of task `task_id` is, for reports by setting: a TextWorld game's settings ("recipe 2,
    take 1, rooms 6, open/cook/cut"), a ScienceWorld task's type ("find-animal"); "other" else."""
    from dreamgym.envs.scienceworld.tasks import task_type
    from dreamgym.envs.textworld.games import game_setting

    return task_type(task_id) or game_setting(task_id)


def tasks_at_start(paths: Iterable[str | Path]) -> list[Task]:
    """The tasks `paths` pose, each with its initial state, read by one reset and no step: seed
    tasks of RL in DreamEnv for tasks no trajectory was collected from."""
    paths = list(paths)
    if not paths:
        return []
    env, tasks = env_for(paths, max_steps=1), []
    try:
        for path in paths:
            task = load_task(path)
            initial_state, info = env.reset(task)
            tasks.append(
                dataclasses.replace(
                    task,
                    initial_state=initial_state,
                    max_score=int(info["max_score"]),
                    start_score=float(info["score"]),
                )
            )
    finally:
        env.close()
    return tasks
