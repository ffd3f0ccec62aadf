"""What GRPO and PPO share between rollouts and losses: the learning sample, and the policy's
log-probabilities, KL and entropy on a minibatch of decisions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dreamgym.policy.model import Decision, Policy
from dreamgym.rl.losses import entropy, kl_divergence, sampled_kl


@dataclass(frozen=True)
class Sample:
    """One decision to learn from, with its advantage (and PPO's return target and old value).
    `weight` is the decision's share in the loss (GRPO: 1/episode length)."""

    decision: Decision
    advantage: float
    target: float | None = None
    old_value: float | None = None
    weight: float = 1.0


def weighted_mean(values: torch.Tensor, samples: Sequence[Sample]) -> torch.Tensor:
    weights = torch.tensor([sample.weight for sample in samples], device=values.device)
    return (values * weights).sum() / weights.sum()


@dataclass
class PolicyTerms:
    """Per-decision tensors of one minibatch under the current policy."""

    logp: torch.Tensor  # log π(chosen), differentiable
    old_logp: torch.Tensor  # log π_old(chosen), as recorded while acting
    kl: torch.Tensor  # KL(π || π_ref)
    entropy: torch.Tensor  # entropy of π (nats; sampled estimate for free-text actions)
    values: torch.Tensor | None


def policy_terms(
    policy: Policy, reference: Policy | None, samples: Sequence[Sample], temperature: float, with_values: bool = False
) -> PolicyTerms:
    """Recompute the minibatch's probabilities with gradients (and the reference's without)."""
    prompts = [sample.decision.prompt for sample in samples]
    candidates = [sample.decision.candidates for sample in samples]
    chosen = [sample.decision.chosen for sample in samples]
    distributions, values = policy.log_probs(prompts, candidates, temperature, with_values)
    logp = torch.stack([dist[i] for dist, i in zip(distributions, chosen)])
    free_text = policy.config.mode == "generate"
    if reference is None:
        kl = torch.zeros_like(logp)
    else:
        with torch.no_grad():
            reference_distributions, _ = reference.log_probs(prompts, candidates, temperature)
        if free_text:
            kl = sampled_kl(logp, torch.stack([dist[i] for dist, i in zip(reference_distributions, chosen)]))
        else:
            kl = torch.stack([kl_divergence(dist, ref) for dist, ref in zip(distributions, reference_distributions)])
    spread = -logp.detach() if free_text else torch.stack([entropy(dist) for dist in distributions])
    old_logp = torch.tensor([sample.decision.logprob for sample in samples], device=logp.device)
    return PolicyTerms(logp, old_logp, kl, spread, values)
