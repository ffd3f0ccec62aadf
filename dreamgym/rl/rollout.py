"""Multi-turn rollouts of a policy in any environment that passes `check_env`.

Episodes run side by side in lock step: each step, the policy decides for every running episode
in one batched pass, and the environments step (DreamEnvs that share an experience model in one
batched model call, `step_together`). Real transitions are counted against a `RealBudget`; when it
runs out, the episodes still running are cut (`Episode.cut`) and left out of learning, since
their outcome is unknown.

`play_groups` plays the G rollouts of each task; with `deny_lost_moves` it plays them one wave
after another, and a move that lost a game (the last action of an episode the game ended without
a win) is denied to the later rollouts of that task when they reach the same state. The games are
deterministic, so that move from that state can only lose again; and a policy that loses a game
is sure of the move that loses it (p ~0.99 at the losing step of the headroom games BC lost,
measured: results log, 2026-12-05, late night), so sampled rollouts repeat it, every rollout of the
group ends alike, and GRPO learns nothing there. Denying it makes the group try the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from dreamgym.envs.base import Env, Task
from dreamgym.envs.dream_env import DreamEnv, step_together
from dreamgym.policy.model import Decision, Observation, Policy

# state -> the actions by which a rollout lost from it
LostMoves = dict[str, set[str]]


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

    def groups_that_fit(self, drawn: int, group_size: int, episode_steps: float) -> int:
        """How many of an epoch's `drawn` task groups to play: all while the budget is unlimited or
        covers them at `episode_steps` per episode, else as many as it covers, and at least one (a
        budget smaller than one group is still spent, though the budget may cut that group)."""
        if self.limit is None:
            return drawn
        fitting = int((self.limit - self.used) // (group_size * max(episode_steps, 1.0)))
        return max(1, min(drawn, fitting))


@dataclass
class Episode:
    """One episode as the learner needs it."""

    task: Task
    decisions: list[Decision] = field(default_factory=list)
    states: list[str] = field(default_factory=list)  # the state each decision was taken from
    rewards: list[float] = field(default_factory=list)  # the environment's step rewards
    model_failures: list[bool] = field(default_factory=list)  # DreamEnv steps whose prediction failed
    won: bool = False
    terminated: bool = False
    truncated: bool = False
    cut: bool = False  # stopped by the real budget: outcome unknown, not learned from
    final_state: str | None = None
    real: bool = True

    @property
    def actions(self) -> tuple[str, ...]:
        """The actions played, in order (`states[i]` is the state `actions[i]` was taken from)."""
        return tuple(decision.action for decision in self.decisions)

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
    lost_moves: Sequence[LostMoves] | None = None,
) -> list[Episode]:
    """Play `tasks[i]` in `envs[i]` until every episode ends (or the budget cuts it). With
    `lost_moves`, slot i is denied the actions `lost_moves[i]` holds for its state, and adds the
    move it loses by, if it loses (slots of one task may share one)."""
    if len(envs) != len(tasks):
        raise ValueError(f"{len(envs)} environments for {len(tasks)} tasks")
    if lost_moves is not None and len(lost_moves) != len(tasks):
        raise ValueError(f"{len(lost_moves)} sets of lost moves for {len(tasks)} tasks")
    episodes, states = [], []
    for env, task in zip(envs, tasks):
        state, _ = env.reset(task)
        episodes.append(Episode(task, real=not isinstance(env, DreamEnv)))
        states.append(state)
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
            Observation(
                tasks[i].instruction,
                episodes[i].actions,
                states[i],
                tuple(episodes[i].states),
                frozenset(lost_moves[i].get(states[i], ())) if lost_moves is not None else frozenset(),
            )
            for i in running
        ]
        decisions = policy.act(
            observations, greedy=greedy, generator=generator, temperature=temperature, with_values=with_values
        )
        results = _step([envs[i] for i in running], [decision.action for decision in decisions])
        for i, decision, (state, reward, terminated, truncated, info) in zip(running, decisions, results):
            episode = episodes[i]
            episode.decisions.append(decision)
            episode.states.append(states[i])
            episode.rewards.append(float(reward))
            episode.model_failures.append(bool(info.get("model_failure")))
            episode.terminated, episode.truncated, episode.won = terminated, truncated, bool(info["won"])
            states[i] = state
            if terminated or truncated:
                episode.final_state = state
            if episode.lost and lost_moves is not None:
                lost_moves[i].setdefault(episode.states[-1], set()).add(decision.action)


def play_groups(
    policy: Policy,
    make_envs: Callable[[int], Sequence[Env]],
    tasks: Sequence[Task],
    group_size: int,
    *,
    deny_lost_moves: bool = False,
    **play_options,
) -> list[Episode]:
    """`group_size` rollouts of every task: side by side (`make_envs(n)` gives n environments), or
    with `deny_lost_moves` in waves of one rollout per task, each denied the moves by which the
    task's earlier rollouts lost (module docstring). `play_options` go to `play`."""
    if not deny_lost_moves:
        slots = [task for task in tasks for _ in range(group_size)]
        return play(policy, make_envs(len(slots)), slots, **play_options)
    lost: list[LostMoves] = [{} for _ in tasks]
    episodes: list[Episode] = []
    for _ in range(group_size):
        episodes += play(policy, make_envs(len(tasks)), tasks, lost_moves=lost, **play_options)
    return episodes
