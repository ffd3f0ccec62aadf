"""PPO for multi-turn agents (Schulman et al. 2017), with a value head on the policy's LM.

Per-step rewards (`rl.reward`) are turned into advantages with GAE(γ, λ):

    δ_t = r_t + γ V(s_{t+1}) - V(s_t),    A_t = δ_t + γλ A_{t+1},    R_t = A_t + V(s_t)

where V after the last step is 0 if the episode terminated and the value of the state it was cut
at if it was truncated (the game would have gone on). Advantages are normalised over the batch.
The loss per decision: the clipped surrogate, plus `value_coef` × the clipped value loss, plus
β KL(π || π_ref) to the reference policy, minus an entropy bonus. Steps whose synthetic prediction
failed are left out of the loss but still pass rewards and values along the episode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dreamgym.policy.model import Observation, Policy
from dreamgym.rl.common import Sample, policy_terms
from dreamgym.rl.config import RLConfig
from dreamgym.rl.losses import clip_fraction, clipped_surrogate, clipped_value_loss, normalise
from dreamgym.rl.rollout import Episode


def gae(
    rewards: Sequence[float], values: Sequence[float], last_value: float, gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """Generalised advantage estimates and return targets of one episode (see the module docstring)."""
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards but {len(values)} values")
    advantages = [0.0] * len(rewards)
    running, next_value = 0.0, last_value
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t], next_value = running, values[t]
    return advantages, [a + v for a, v in zip(advantages, values)]


class PPO:
    uses_values = True

    def __init__(self, config: RLConfig):
        self.config = config

    def _bootstrap_values(self, episodes: Sequence[Episode], policy: Policy) -> dict[int, float]:
        """V of the state each truncated episode stopped at, in one batched pass."""
        truncated = [
            i
            for i, episode in enumerate(episodes)
            if episode.truncated and not episode.terminated and episode.final_state
        ]
        if not truncated:
            return {}
        observations = [
            Observation(episodes[i].task.instruction, episodes[i].actions, episodes[i].final_state) for i in truncated
        ]
        decisions = policy.act(observations, greedy=True, with_values=True)
        return {i: decision.value for i, decision in zip(truncated, decisions)}

    def samples(self, episodes: Sequence[Episode], policy: Policy) -> list[Sample]:
        learnable = [episode for episode in episodes if not episode.cut and episode.steps]
        bootstrap = self._bootstrap_values(learnable, policy)
        raw = []
        for i, episode in enumerate(learnable):
            values = [decision.value for decision in episode.decisions]
            advantages, targets = gae(
                episode.step_rewards(self.config.reward),
                values,
                bootstrap.get(i, 0.0),
                self.config.gamma,
                self.config.lam,
            )
            raw += [
                (decision, advantage, target)
                for decision, advantage, target, failed in zip(
                    episode.decisions, advantages, targets, episode.model_failures
                )
                if not failed
            ]
        if not raw:
            return []
        normalised = normalise(torch.tensor([advantage for _, advantage, _ in raw])).tolist()
        return [
            Sample(decision, advantage, target, decision.value)
            for (decision, _, target), advantage in zip(raw, normalised)
        ]

    def loss(
        self, policy: Policy, reference: Policy | None, samples: Sequence[Sample]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        terms = policy_terms(policy, reference, samples, self.config.temperature, with_values=True)
        device = terms.logp.device
        advantages = torch.tensor([sample.advantage for sample in samples], device=device)
        targets = torch.tensor([sample.target for sample in samples], device=device)
        old_values = torch.tensor([sample.old_value for sample in samples], device=device)
        surrogate = clipped_surrogate(terms.logp, terms.old_logp, advantages, self.config.clip)
        value_loss = clipped_value_loss(terms.values, old_values, targets, self.config.clip)
        loss = (
            surrogate
            + self.config.value_coef * value_loss
            + self.config.kl_coef * terms.kl
            - self.config.entropy_coef * terms.entropy
        ).mean()
        return loss, {
            "policy_loss": surrogate.mean().item(),
            "value_loss": value_loss.mean().item(),
            "kl": terms.kl.mean().item(),
            "entropy": terms.entropy.mean().item(),
            "clip_fraction": clip_fraction(terms.logp.detach(), terms.old_logp, self.config.clip).item(),
        }
