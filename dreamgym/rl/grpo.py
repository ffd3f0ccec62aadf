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

Step-level advantages (GiGPO, Feng et al. 2025), weighted by `rl.step_weight` (ω): an episode's
advantage says only whether the whole episode was better than its group's others, so every step of
a lost episode is blamed, the right ones before the fatal step too. Rollouts of one task often
pass through the same state (the start, and wherever they have not diverged yet); the decisions
taken in one such *anchor state*, across the group's episodes, are compared by their discounted
returns from there, G_t = Σ_k γ^k r_{t+k}: A_step = (G - mean) / std within the anchor. The
decision's advantage is A_episode + ω A_step. A state met once, or whose decisions all returned
the same, adds nothing. The anchor is the abstract state itself, so no extra rollout is needed.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Hashable, Sequence

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


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = r_t + γ G_{t+1} for every step of one episode (G after the last step is 0)."""
    returns, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def step_advantages(anchors: Sequence[Hashable], returns: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GiGPO's step-level advantages: decisions with the same anchor (state) form a group, and each
    gets (G - mean) / std of its group's returns (`group_advantages`); a lone decision gets 0."""
    if len(anchors) != len(returns):
        raise ValueError(f"{len(anchors)} anchors but {len(returns)} returns")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, anchor in enumerate(anchors):
        members[anchor].append(i)
    advantages = [0.0] * len(returns)
    for indices in members.values():
        for i, advantage in zip(indices, group_advantages([returns[i] for i in indices], eps)):
            advantages[i] = advantage
    return advantages


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
            per_step = self._step_advantages(group)
            for episode, advantage, steps in zip(group, group_advantages(returns), per_step):
                samples += [
                    Sample(decision, advantage + step, weight=1.0 / episode.steps)
                    for decision, failed, step in zip(episode.decisions, episode.model_failures, steps)
                    if not failed and advantage + step != 0.0
                ]
        return samples

    def _step_advantages(self, group: Sequence[Episode]) -> list[list[float]]:
        """ω × each decision's step-level advantage, episode by episode (zeros when ω is 0)."""
        if self.config.step_weight == 0.0:
            return [[0.0] * episode.steps for episode in group]
        anchors = [state for episode in group for state in episode.states]
        returns = [
            value
            for episode in group
            for value in discounted_returns(episode.step_rewards(self.config.reward), self.config.gamma)
        ]
        flat = iter(step_advantages(anchors, returns))
        return [[self.config.step_weight * next(flat) for _ in range(episode.steps)] for episode in group]

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
