"""DreamEnv: the experience model as an environment, under the same contract as the real one.

A task gives the instruction and an initial abstract state (`Task.initial_state`: a real initial
state from the buffer, or a curriculum variation). Each step asks the experience model, with the
episode's history and retrieved neighbours, for the next state, reward and whether the episode
ended; the available actions are those of the predicted state.

Rules the model is not asked about, as in the real game:
- an action that is not among the available ones changes nothing and earns nothing (TextWorld
  answers such a command without changing the world);
- the step limit: `truncated` at `max_steps`, never a prediction.

When the model's answer does not parse after its retries (`ExperienceModel.predict`), the step
changes nothing, earns nothing and does not end the episode, and says so: `info["model_failure"]`
holds the parser's reason and `failures` counts them, so that RL code can leave such steps out of
its losses and metrics can report them. Nothing is made up in their place.

Dynamics may answer a step with the outcome the real game gave it before (`dreamgym.envs.recall`,
rl.recall_real): such a step counts in `recalled_steps`, not `model_steps`, and is not written
back as synthetic (it is a real row already).

`step_together` steps many environments that share one experience model with one batched model
call: a group of G rollouts costs one generation per step, not G.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dreamgym.data.schema import content_hash, trajectory_id
from dreamgym.envs.base import EnvError, Info, StepResult, Task
from dreamgym.envs.dynamics import Dynamics, Query, Step
from dreamgym.state import AbstractState, StateParseError, format_state, parse_state

ENV_NAME = "dream"


@dataclass
class _Episode:
    task: Task
    trajectory_id: str
    state: AbstractState
    history: list[Step] = field(default_factory=list)
    earlier: list[tuple[AbstractState, str]] = field(default_factory=list)
    steps: int = 0
    score: float = 0.0
    done: bool = False


class DreamEnv:
    """One synthetic episode at a time, stepped by an experience model.

    `slot` tells apart environments that play the same task side by side (a GRPO group); it goes
    into the trajectory id with the task, model version, policy, run id and episode number, so
    a re-run of the same rollouts gives the same ids and its write-back adds nothing.
    """

    name = ENV_NAME

    def __init__(
        self,
        model: Dynamics,
        max_steps: int = 50,
        *,
        slot: int = 0,
        model_version: str = "unversioned",
        policy: str = "unknown",
        run_id: str | None = None,
        record: bool = True,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.model, self.max_steps, self.slot = model, max_steps, slot
        self.model_version, self.policy, self.run_id, self.record = model_version, policy, run_id, record
        self.failures = 0  # steps whose prediction did not parse, over this env's life
        self.model_steps = 0  # steps the model predicted (failures included)
        self.recalled_steps = 0  # steps answered with a recorded real outcome (`dreamgym.envs.recall`)
        self._episode: _Episode | None = None
        self._episodes = 0
        self._recorded: list[dict] = []

    def reset(self, task: Task) -> tuple[str, Info]:
        if not task.initial_state:
            raise EnvError(
                f"task {task.task_id} has no initial_state: DreamEnv starts from one "
                "(seed tasks come from the buffer's real initial states)"
            )
        try:
            state = parse_state(task.initial_state)
        except StateParseError as error:
            raise EnvError(f"task {task.task_id}: initial_state is not an abstract state ({error})") from None
        self._episodes += 1
        tid = trajectory_id(
            ENV_NAME, task.task_id, self.model_version, self.policy, self.run_id, self.slot, self._episodes
        )
        self._episode = _Episode(task, tid, state, score=task.start_score)
        return format_state(state), self._info(None)

    def step(self, action: str) -> StepResult:
        return step_together([self], [action])[0]

    def close(self) -> None:
        self._episode = None

    @property
    def task(self) -> Task | None:
        """The task of the current (or last) episode."""
        return self._episode.task if self._episode else None

    def take_transitions(self) -> list[dict]:
        """The transitions stepped by the model since the last call, as buffer rows
        (`source="synthetic"`), and forget them."""
        taken, self._recorded = self._recorded, []
        return taken

    # --- used by step_together -------------------------------------------------------------

    def _running(self) -> _Episode:
        if self._episode is None:
            raise EnvError("step() called before reset(); reset the environment with a task first")
        if self._episode.done:
            raise EnvError("step() called after the episode ended; call reset() to start another")
        return self._episode

    def _query(self, action: str) -> Query:
        episode = self._episode
        return Query(
            instruction=episode.task.instruction,
            state=episode.state,
            action=action,
            history=tuple(episode.history[-self.model.history :]) if self.model.history else (),
            trajectory_id=episode.trajectory_id,
            task_id=episode.task.task_id,
            earlier=tuple(episode.earlier),
            score=episode.score,
        )

    def _advance(
        self,
        action: str,
        next_state: AbstractState,
        reward: float,
        terminated: bool,
        failure: str | None,
        predicted: bool,
        reasoning: str | None = None,
    ) -> StepResult:
        episode = self._episode
        state = episode.state
        episode.steps += 1
        episode.score += reward
        truncated = not terminated and episode.steps >= self.max_steps
        episode.done = terminated or truncated
        won = terminated and reward > 0
        if predicted and self.record:
            self._recorded.append(
                self._row(episode, state, action, next_state, reward, terminated, truncated, won, reasoning)
            )
        episode.history.append(Step(action, reward, state.location))
        episode.earlier.append((state, action))
        episode.state = next_state
        info = self._info(failure)
        info.update(won=won, lost=terminated and not won, reasoning=reasoning)
        return format_state(next_state), float(reward), terminated, truncated, info

    def _info(self, failure: str | None) -> Info:
        episode = self._episode
        info: Info = {
            "won": False,
            "lost": False,
            "score": episode.score,
            "max_score": float(episode.task.max_score or 0),
            "expert_action": None,
            "task_id": episode.task.task_id,
            "step": episode.steps,
            "model_failure": failure,
            "reasoning": None,
            "model_failures": self.failures,
        }
        return info

    def _row(
        self,
        episode: _Episode,
        state: AbstractState,
        action: str,
        next_state: AbstractState,
        reward: float,
        terminated: bool,
        truncated: bool,
        won: bool,
        reasoning: str | None,
    ) -> dict:
        row = {
            "env": episode.task.env,
            "task_id": episode.task.task_id,
            "instruction": episode.task.instruction,
            "trajectory_id": episode.trajectory_id,
            "step": episode.steps - 1,
            "state": format_state(state),
            "action": action,
            "next_state": format_state(next_state),
            "reward": float(reward),
            "terminated": terminated,
            "truncated": truncated,
            "won": won,
            "lost": terminated and not won,
            "score": round(episode.score),
            "max_score": int(episode.task.max_score or 0),
            "reasoning": reasoning,
            "source": "synthetic",
            "policy": self.policy,
            "model_version": self.model_version,
            "run_id": self.run_id,
            "created_at": datetime.now(UTC),
        }
        row["content_hash"] = content_hash(row)
        return row


def step_together(envs: Sequence[DreamEnv], actions: Sequence[str]) -> list[StepResult]:
    """Step each env with its action; every model prediction in one batched call."""
    if len(envs) != len(actions):
        raise ValueError(f"{len(envs)} environments but {len(actions)} actions")
    if len({id(env) for env in envs}) != len(envs):
        raise ValueError("an environment appears twice in one step_together call")
    models = {id(env.model) for env in envs}
    if len(models) > 1:
        raise ValueError("step_together needs environments that share one experience model")
    for action in actions:
        if not isinstance(action, str):
            raise EnvError(f"actions are text, got {type(action).__name__}")
    episodes = [env._running() for env in envs]
    asked = [i for i, (episode, action) in enumerate(zip(episodes, actions)) if action in episode.state.actions]
    predictions = envs[asked[0]].model.predict([envs[i]._query(actions[i]) for i in asked]) if asked else []
    by_index = dict(zip(asked, predictions))
    results = []
    for i, (env, episode, action) in enumerate(zip(envs, episodes, actions)):
        prediction = by_index.get(i)
        if prediction is None:  # not an available action: nothing happens
            results.append(env._advance(action, episode.state, 0.0, False, None, predicted=False))
            continue
        if prediction.recalled:
            env.recalled_steps += 1
        else:
            env.model_steps += 1
        if not prediction.ok:
            env.failures += 1
            results.append(env._advance(action, episode.state, 0.0, False, prediction.error, predicted=False))
            continue
        completion = prediction.completion
        results.append(
            env._advance(
                action,
                completion.next_state,
                completion.reward,
                completion.done,
                None,
                predicted=not prediction.recalled,  # a recalled step is real data already: not written back
                reasoning=completion.reasoning,
            )
        )
    return results
