"""The environment contract shared by real and synthetic environments (Gymnasium-shaped).

`reset(task) -> (observation, info)` and `step(action) -> (observation, reward, terminated,
truncated, info)`, where the observation is the abstract textual state of `dreamgym.state`.
`terminated` means the episode reached an end state of the task (won or lost); `truncated`
means it was cut at the step limit. The two are never merged into one `done` flag.

Every `info` carries at least the keys in `REQUIRED_INFO_KEYS`; `check_env` verifies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from dreamgym.errors import DreamgymError

# won/lost: whether the episode ended in success or failure; score/max_score: the game's
# points so far and at best; expert_action: the next action of the environment's own expert
# from the current state, or None where the environment has no expert (synthetic ones).
REQUIRED_INFO_KEYS = ("won", "lost", "score", "max_score", "expert_action")


@dataclass(frozen=True)
class Task:
    """One task: what the agent is asked to do and where it starts.

    A real TextWorld task is a compiled game (`game_file`); a synthetic task carries its
    initial abstract state instead (`initial_state`).
    """

    task_id: str
    instruction: str
    env: str
    game_file: str | None = None
    initial_state: str | None = None
    max_score: int | None = None  # where known without playing (a synthetic task's real origin)
    # The score its initial state holds (ScienceWorld credits the subgoals a start already meets).
    start_score: float = 0.0


Info = dict[str, Any]
StepResult = tuple[str, float, bool, bool, Info]


@runtime_checkable
class Env(Protocol):
    """What every environment provides; see the module docstring for the meaning of each value."""

    name: str
    max_steps: int

    def reset(self, task: Task) -> tuple[str, Info]: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


class EnvError(DreamgymError):
    """An environment was used wrongly (stepped before reset or after the episode ended)."""


def check_step_call(started: bool, ended: bool, action: object) -> None:
    """The errors a real environment's `step` raises when used wrongly (`check_env` checks them)."""
    if not started:
        raise EnvError("step() called before reset(); reset the environment with a task first")
    if ended:
        raise EnvError("step() called after the episode ended; call reset() to start another")
    if not isinstance(action, str):
        raise EnvError(f"actions are text, got {type(action).__name__}")


class EnvCrashed(EnvError):
    """The process behind an environment died (ScienceWorld's JVM): the running episode is lost,
    and the next `reset` starts the process again."""


class GameFileError(DreamgymError):
    """A game file is missing, unreadable or not a TextWorld game."""
