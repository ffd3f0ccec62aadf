"""Multi-turn rollouts of a policy in any environment that passes `check_env`.

Episodes run side by side in lock step: each step, the policy decides for every running episode
in one batched pass, and the environments step (DreamEnvs that share an experience model in one
batched model call, `step_together`). Real transitions are counted against a `RealBudget`; when it
runs out, the episodes still running are cut (`Episode.cut`) and left out of learning, since
their outcome is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dreamgym.envs.base import Env, Task
from dreamgym.envs.dream_env import DreamEnv, step_together
from dreamgym.policy.model import Decision, Observation, Policy


@dataclass
class RealBudget:
    """Real-environment transitions a run may consume, and how many it has."""

    limit: int | None  # None: unlimited (evaluation)
    used: int = 0

    def take(self, wanted: int) -> int:
        """Transitions granted now (at most `wanted`), counted as used."""
        granted = wanted if self.limit is None else max(0, min(wanted, self.limit - self.used))
        self.used += granted
        return granted

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.used >= self.limit


@dataclass
class Episode:
    """One episode as the learner needs it."""

    task: Task
    decisions: list[Decision] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # the environment's step rewards
    model_failures: list[bool] = field(default_factory=list)  # DreamEnv steps whose prediction failed
    won: bool = False
    terminated: bool = False
    truncated: bool = False
    cut: bool = False  # stopped by the real budget: outcome unknown, not learned from
    final_state: str | None = None
    real: bool = True

    @property
    def steps(self) -> int:
        return len(self.decisions)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated or self.cut

    @property
    def lost(self) -> bool:
        """Ended by the game without a win (a step limit is not a loss)."""
        return self.terminated and not self.won

    def step_rewards(self, reward: str) -> list[float]:
        """'outcome': 1 on the last step of a won episode, else 0 (the paper's reward);
        'score': the environment's rewards (the game's score increases); 'progress': the score's
        increases, all taken back on the last step of a lost episode (its return is 0)."""
        if reward == "score":
            return list(self.rewards)
        if reward == "progress":
            taken_back = -sum(self.rewards) if self.lost else 0.0
            return [*self.rewards[:-1], self.rewards[-1] + taken_back] if self.steps else []
        return [0.0] * (self.steps - 1) + [1.0 if self.won else 0.0] if self.steps else []

    def episode_return(self, reward: str) -> float:
        return float(sum(self.step_rewards(reward)))


def _step(envs: Sequence[Env], actions: Sequence[str]) -> list[tuple]:
    if envs and all(isinstance(env, DreamEnv) for env in envs):
        return step_together(envs, actions)
    return [env.step(action) for env, action in zip(envs, actions)]


def play(
    policy: Policy,
    envs: Sequence[Env],
    tasks: Sequence[Task],
    *,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
    budget: RealBudget | None = None,
    with_values: bool = False,
) -> list[Episode]:
    """Play `tasks[i]` in `envs[i]` until every episode ends (or the budget cuts it)."""
    if len(envs) != len(tasks):
        raise ValueError(f"{len(envs)} environments for {len(tasks)} tasks")
    episodes, states = [], []
    for env, task in zip(envs, tasks):
        state, _ = env.reset(task)
        episodes.append(Episode(task, real=not isinstance(env, DreamEnv)))
        states.append(state)
    actions_taken: list[list[str]] = [[] for _ in tasks]
    states_left: list[list[str]] = [[] for _ in tasks]  # the state each action was taken from
    while True:
        running = [i for i, episode in enumerate(episodes) if not episode.done]
        if not running:
            return episodes
        real = [i for i in running if episodes[i].real]
        granted = budget.take(len(real)) if budget is not None and real else len(real)
        for i in real[granted:]:
            episodes[i].cut, episodes[i].final_state = True, states[i]
        running = [i for i in running if not episodes[i].cut]
        if not running:
            return episodes
        observations = [
            Observation(tasks[i].instruction, tuple(actions_taken[i]), states[i], tuple(states_left[i]))
            for i in running
        ]
        decisions = policy.act(
            observations, greedy=greedy, generator=generator, temperature=temperature, with_values=with_values
        )
        results = _step([envs[i] for i in running], [decision.action for decision in decisions])
        for i, decision, (state, reward, terminated, truncated, info) in zip(running, decisions, results):
            episode = episodes[i]
            episode.decisions.append(decision)
            episode.rewards.append(float(reward))
            episode.model_failures.append(bool(info.get("model_failure")))
            episode.terminated, episode.truncated, episode.won = terminated, truncated, bool(info["won"])
            actions_taken[i].append(decision.action)
            states_left[i].append(states[i])
            states[i] = state
            if terminated or truncated:
                episode.final_state = state
