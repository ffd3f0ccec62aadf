"""GRPO for multi-turn agents (Shao et al. 2024, as used by DreamGym).

Each task is played by a group of G rollouts. An episode's advantage is its return normalised
within its group, A_i = (R_i - mean(R)) / std(R), and every decision of the episode shares it: no
value function. A group whose rollouts all scored the same teaches nothing (all advantages 0),
which is why the curriculum looks for tasks with uncertain outcomes.

The loss per decision is the clipped surrogate on π/π_old, plus β KL(π || π_ref) to the
reference (behaviour-cloned) policy, minus an entropy bonus. As in GRPO's 1/|o_i| term, each
episode weighs the same whatever its length: a decision weighs 1/(its episode's decisions).
Without it a long failed episode (all steps to the limit) outweighs a short won one many times
over, and the policy learns mostly to avoid what the failures did, right steps included.
Decisions whose synthetic step failed to parse are left out (the environment did nothing with
them).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

import torch

from dreamgym.policy.model import Policy
from dreamgym.rl.common import Sample, policy_terms, weighted_mean
from dreamgym.rl.config import RLConfig
from dreamgym.rl.losses import clip_fraction, clipped_surrogate
from dreamgym.rl.rollout import Episode


def group_advantages(returns: Sequence[float], eps: float = 1e-6) -> list[float]:
    """(R - mean) / std within one group (population std); all zeros when the returns are equal."""
    mean = statistics.fmean(returns)
    std = statistics.pstdev(returns)
    if std < eps:
        return [0.0] * len(returns)
    return [(value - mean) / std for value in returns]


class GRPO:
    uses_values = False

    def __init__(self, config: RLConfig):
        self.config = config

    def samples(self, episodes: Sequence[Episode], policy: Policy) -> list[Sample]:
        groups: dict[str, list[Episode]] = defaultdict(list)
        for episode in episodes:
            if not episode.cut:
                groups[episode.task.task_id].append(episode)
        samples = []
        for group in groups.values():
            returns = [episode.episode_return(self.config.reward) for episode in group]
            for episode, advantage in zip(group, group_advantages(returns)):
                if advantage == 0.0:
                    continue
                samples += [
                    Sample(decision, advantage, weight=1.0 / episode.steps)
                    for decision, failed in zip(episode.decisions, episode.model_failures)
                    if not failed
                ]
        return samples

    def loss(
        self, policy: Policy, reference: Policy | None, samples: Sequence[Sample]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        terms = policy_terms(policy, reference, samples, self.config.temperature)
        advantages = torch.tensor([sample.advantage for sample in samples], device=terms.logp.device)
        surrogate = clipped_surrogate(terms.logp, terms.old_logp, advantages, self.config.clip)
        loss = weighted_mean(
            surrogate + self.config.kl_coef * terms.kl - self.config.entropy_coef * terms.entropy, samples
        )
        return loss, {
            "policy_loss": surrogate.mean().item(),
            "kl": terms.kl.mean().item(),
            "entropy": terms.entropy.mean().item(),
            "clip_fraction": clip_fraction(terms.logp.detach(), terms.old_logp, self.config.clip).item(),
        }
