"""The dream-vs-real gap: how the policy RL trains in DreamEnv does in the real game, epoch by epoch.

A policy that learns in a learned simulator can learn the simulator's mistakes: a success the
experience model grants for a step the game would refuse. Success in DreamEnv then rises while
success in the real game does not. `RealCheck` plays the tasks an epoch drew in their real games
(those that have one: seed tasks and `games` variations, not variations written as text), with the same policy,
temperature and group size as the dream rollouts, so that the two success rates compare like with
like. These real transitions are measurements, never learned from: they are logged per epoch
(`real_check_transitions`) apart from any real-transition budget. The loop checks every
`rl.real_check_every`-th epoch: where the real game is slow (ScienceWorld), every epoch is costly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dreamgym.envs.base import Env, Task
from dreamgym.policy.model import Policy
from dreamgym.rl.rollout import Episode, RealBudget, play

# Dream success this far above real success on the same tasks reads as simulator exploitation.
GAP_WARNING = 0.25


class RealCheck:
    """Real success of a policy on the real games behind an epoch's tasks."""

    def __init__(
        self,
        make_env: Callable[[], Env],
        real_task: Callable[[Task], Task | None],
        group_size: int,
        temperature: float,
        seed: int,
    ):
        self.make_env, self.real_task = make_env, real_task
        self.group_size, self.temperature, self.seed = group_size, temperature, seed
        self.envs: list[Env] = []

    def __call__(self, policy: Policy, tasks: Sequence[Task], epoch: int) -> list[Episode]:
        """Episodes of each task that has a real game, `group_size` each (none: no real game)."""
        real = [task for task in map(self.real_task, tasks) if task is not None]
        slots = [task for task in real for _ in range(self.group_size)]
        if not slots:
            return []
        while len(self.envs) < len(slots):
            self.envs.append(self.make_env())
        generator = torch.Generator().manual_seed(self.seed * 100_019 + epoch)
        return play(
            policy,
            self.envs[: len(slots)],
            slots,
            generator=generator,
            temperature=self.temperature,
            budget=RealBudget(None),
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


def gap_metrics(dream: Sequence[Episode], real: Sequence[Episode]) -> dict[str, float]:
    """Success in DreamEnv and in the real game on the same tasks (those `real` played), and the
    gap between them; {} when no task had a real game."""
    checked = {episode.task.task_id for episode in real}
    same = [episode for episode in dream if episode.task.task_id in checked and not episode.cut]
    if not real or not same:
        return {}
    dream_success = sum(episode.won for episode in same) / len(same)
    real_success = sum(episode.won for episode in real) / len(real)
    return {
        "dream_success_checked": dream_success,
        "real_success_rate": real_success,
        "dream_real_gap": dream_success - real_success,
        "real_check_transitions": float(sum(episode.steps for episode in real)),
    }


def gap_warning(metrics: dict[str, float]) -> str | None:
    """A warning when the policy succeeds in the dream far more often than in the real game."""
    gap = metrics.get("dream_real_gap")
    if gap is None or gap < GAP_WARNING:
        return None
    return (
        f"epoch {metrics['epoch']:.0f}: success {metrics['dream_success_checked']:.2f} in DreamEnv but "
        f"{metrics['real_success_rate']:.2f} in the real games of the same tasks: RL may be exploiting "
        "the experience model's mistakes; stop earlier (rl.epochs), raise rl.kl_coef, or improve the "
        "experience model"
    )
