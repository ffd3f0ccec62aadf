"""The loss terms GRPO and PPO share, as small pure functions of tensors (tested by hand values).

Conventions: `logp` tensors are log-probabilities of the chosen actions (one per decision) or,
for the distribution terms, a log-probability vector over one decision's candidate actions.
Every function returns a per-decision tensor; the algorithms average it.
"""

from __future__ import annotations

import torch


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip: float
) -> torch.Tensor:
    """PPO's clipped objective as a loss: -min(ρA, clip(ρ, 1-ε, 1+ε)A), ρ = π/π_old."""
    ratio = torch.exp(logp - old_logp)
    return -torch.minimum(ratio * advantages, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages)


def clip_fraction(logp: torch.Tensor, old_logp: torch.Tensor, clip: float) -> torch.Tensor:
    """Share of decisions whose ratio left [1-ε, 1+ε] (a diagnostic of the update size)."""
    return ((torch.exp(logp - old_logp) - 1.0).abs() > clip).float().mean()


def kl_divergence(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Exact KL(π || π_ref) = Σ_a π(a)(log π(a) - log π_ref(a)) over one decision's candidates."""
    return (logp.exp() * (logp - ref_logp)).sum(-1)


def sampled_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """KL(π || π_ref) estimated from the sampled action alone (Schulman's k3, unbiased and ≥ 0):
    r - 1 - log r with r = π_ref/π; for free-text actions, whose distribution cannot be listed."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - 1.0 - log_ratio


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """Entropy of one decision's action distribution, in nats."""
    return -(logp.exp() * logp).sum(-1)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> torch.Tensor:
    """PPO's value loss: ½ max((V - R)², (V_old + clip(V - V_old, ±ε) - R)²), so one update
    cannot move the value far from where the rollouts measured it."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)


def normalise(values: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit standard deviation (unchanged scale when all are equal)."""
    if values.numel() < 2:
        return values - values.mean()
    return (values - values.mean()) / (values.std(unbiased=False) + eps)
