"""What DreamEnv needs from a learned model of an environment: the `Dynamics` protocol.

DreamEnv asks, for a batch of (task, recent history, state, action) queries, what happens next:
the next abstract state, the reward, whether the episode ends, and optionally the reasoning that
led there. The experience model (`dreamgym.experience.generate.ExperienceModel`) is one such
model; anything else that answers the same questions (another model, a served one, the real
transitions already recorded: `dreamgym.envs.recall`) drives DreamEnv unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dreamgym.state import AbstractState


@dataclass(frozen=True)
class Step:
    """One earlier step of the episode, as a query carries it."""

    action: str
    reward: float
    location: str


@dataclass(frozen=True)
class Query:
    instruction: str
    state: AbstractState
    action: str
    history: tuple[Step, ...] = ()
    trajectory_id: str | None = None  # a model with a memory never recalls the query's own trajectory
    task_id: str | None = None  # the task (game) being played: the real outcome of a step depends on it
    # Every earlier (state, action) of the episode, oldest first: the places it has shown.
    earlier: tuple[tuple[AbstractState, str], ...] = ()
    # The game's score before the action (None: unknown): how far the task has come, on which
    # the reward of a move can hang (ScienceWorld pays a subgoal once).
    score: float | None = None


@dataclass(frozen=True)
class Completion:
    """What the model says happens: the reasoning (None without reasoning) and the predicted step."""

    reasoning: str | None
    next_state: AbstractState
    reward: float
    done: bool


@dataclass(frozen=True)
class Prediction:
    completion: Completion | None  # None: no attempt gave a usable answer
    text: str  # the model's last raw answer
    attempts: int
    error: str | None = None  # why the last attempt was not usable
    recalled: bool = False  # a recorded real outcome, not the model's (`dreamgym.envs.recall`)

    @property
    def ok(self) -> bool:
        return self.completion is not None


class Dynamics(Protocol):
    """A learned environment model, as DreamEnv uses it."""

    @property
    def history(self) -> int:
        """How many earlier steps of the episode a query should carry (0: none)."""
        ...

    def predict(self, queries: Sequence[Query]) -> list[Prediction]:
        """One prediction per query, in order; a failure is a `Prediction` with no completion and
        its reason, never an exception or a made-up outcome."""
        ...
