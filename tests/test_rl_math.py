"""Hand-computed checks of the RL math: losses, GRPO group advantages and samples, GAE, episode
rewards, the real budget and the collapse warnings. Pure functions on tiny tensors, no model."""

from __future__ import annotations

import math

import pytest
import torch

from dreamgym.envs.base import Task
from dreamgym.policy.model import Decision
from dreamgym.rl.config import RLConfig
from dreamgym.rl.grpo import GRPO, group_advantages
from dreamgym.rl.loop import ENTROPY_FLOOR, collapse_warnings, episode_metrics
from dreamgym.rl.losses import (
    clip_fraction,
    clipped_surrogate,
    clipped_value_loss,
    entropy,
    kl_divergence,
    normalise,
    sampled_kl,
)
from dreamgym.rl.ppo import gae
from dreamgym.rl.rollout import Episode, RealBudget

CLIP = 0.2


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def close(actual, expected, tol: float = 1e-6) -> None:
    assert torch.allclose(torch.as_tensor(actual, dtype=torch.float64), t(expected), atol=tol, rtol=0), (
        f"{actual} != {expected}"
    )


# --- losses -------------------------------------------------------------------------------------


def _surrogate(ratio: float, advantage: float) -> float:
    loss = clipped_surrogate(t([math.log(ratio)]), t([0.0]), t([advantage]), CLIP)
    return float(loss[0])


def test_surrogate_inside_the_clip_range_is_minus_ratio_times_advantage():
    # ρ = 1.1 ∈ [0.8, 1.2]: both terms are 1.1 × 2 = 2.2, loss = -2.2
    assert _surrogate(1.1, 2.0) == pytest.approx(-2.2)
    # ρ = 0.9, A = -1: both terms -0.9, loss = +0.9
    assert _surrogate(0.9, -1.0) == pytest.approx(0.9)


def test_surrogate_clips_a_ratio_above_one_plus_eps_with_positive_advantage():
    # ρ = 1.5, A = 1: min(1.5 × 1, clip(1.5) = 1.2 × 1) = 1.2, loss = -1.2
    assert _surrogate(1.5, 1.0) == pytest.approx(-1.2)


def test_surrogate_clips_a_ratio_below_one_minus_eps_with_negative_advantage():
    # ρ = 0.5, A = -1: min(0.5 × -1 = -0.5, clip(0.5) = 0.8 × -1 = -0.8) = -0.8, loss = +0.8
    assert _surrogate(0.5, -1.0) == pytest.approx(0.8)


def test_surrogate_min_keeps_the_unclipped_term_when_it_is_smaller():
    # ρ = 1.5, A = -1: min(-1.5, 1.2 × -1 = -1.2) = -1.5 (unclipped), loss = +1.5
    assert _surrogate(1.5, -1.0) == pytest.approx(1.5)
    # ρ = 0.5, A = +1: min(0.5, 0.8) = 0.5 (unclipped), loss = -0.5
    assert _surrogate(0.5, 1.0) == pytest.approx(-0.5)


def test_surrogate_is_elementwise_over_a_batch():
    ratios, advantages = [1.1, 1.5, 0.5, 1.5], [2.0, 1.0, -1.0, -1.0]
    loss = clipped_surrogate(t(ratios).log(), t([0.0] * 4), t(advantages), CLIP)
    close(loss, [-2.2, -1.2, 0.8, 1.5])


def test_surrogate_uses_the_ratio_of_probabilities_not_the_log_difference_alone():
    # logp = log 0.3, old = log 0.2: ρ = 1.5 -> clipped to 1.2 with A = 1, loss = -1.2
    loss = clipped_surrogate(t([math.log(0.3)]), t([math.log(0.2)]), t([1.0]), CLIP)
    close(loss, [-1.2])


def test_clip_fraction_counts_ratios_outside_the_range():
    # ratios 1.1, 1.5, 0.5, 1.0: |ρ-1| = 0.1, 0.5, 0.5, 0 -> two of four exceed 0.2 -> 0.5
    fraction = clip_fraction(t([1.1, 1.5, 0.5, 1.0]).log(), t([0.0] * 4), CLIP)
    assert float(fraction) == pytest.approx(0.5)
    assert float(clip_fraction(t([0.0, 0.0]), t([0.0, 0.0]), CLIP)) == 0.0


def test_exact_kl_of_two_small_distributions():
    # p = (1/2, 1/2), q = (1/4, 3/4):
    # KL = ½ ln(0.5/0.25) + ½ ln(0.5/0.75) = ½ (ln 2 + ln 2/3) = ½ ln(4/3) = 0.1438410362
    p, q = t([0.5, 0.5]).log(), t([0.25, 0.75]).log()
    assert float(kl_divergence(p, q)) == pytest.approx(0.5 * math.log(4 / 3))
    assert float(kl_divergence(p, q)) == pytest.approx(0.1438410362)
    # The other direction: ¼ ln(0.25/0.5) + ¾ ln(0.75/0.5) = ¼ ln ½ + ¾ ln 1.5
    #   = -0.1732867951 + 0.3040988106 = 0.1308120155
    assert float(kl_divergence(q, p)) == pytest.approx(0.1308120155)


def test_exact_kl_is_zero_for_identical_distributions_and_batched_over_the_last_dim():
    p = t([0.2, 0.3, 0.5]).log()
    assert float(kl_divergence(p, p)) == pytest.approx(0.0, abs=1e-12)
    batch = torch.stack([t([0.5, 0.5]).log(), t([0.25, 0.75]).log()])
    reference = torch.stack([t([0.25, 0.75]).log(), t([0.25, 0.75]).log()])
    close(kl_divergence(batch, reference), [0.5 * math.log(4 / 3), 0.0])


def test_sampled_kl_k3():
    # logp = ln 0.5, ref = ln 0.25: r = π_ref/π = 0.5, k3 = r - 1 - ln r = -0.5 + ln 2 = 0.1931471806
    value = sampled_kl(t([math.log(0.5)]), t([math.log(0.25)]))
    close(value, [0.1931471806])
    # r = 2 (ref more likely): 2 - 1 - ln 2 = 0.3068528194
    close(sampled_kl(t([math.log(0.25)]), t([math.log(0.5)])), [1 - math.log(2)])


def test_sampled_kl_is_zero_when_equal_and_never_negative():
    same = t([-0.1, -1.0, -3.0])
    close(sampled_kl(same, same), [0.0, 0.0, 0.0], tol=1e-12)
    logp = t([-0.1, -2.0, -0.5, -5.0, -1e-3])
    ref = t([-3.0, -0.2, -0.5001, -0.01, -7.0])
    assert (sampled_kl(logp, ref) >= 0).all()
    assert (sampled_kl(ref, logp) >= 0).all()


def test_entropy_of_uniform_and_one_hot():
    # uniform over n: -Σ (1/n) ln(1/n) = ln n
    for n in (1, 2, 4, 7):
        assert float(entropy(torch.full((n,), -math.log(n), dtype=torch.float64))) == pytest.approx(math.log(n))
    # one-hot (the other entries' log-probs very negative, as log_softmax gives): 0
    one_hot = torch.log_softmax(t([0.0, -1e4, -1e4]), dim=0)
    assert float(entropy(one_hot)) == pytest.approx(0.0, abs=1e-12)
    # (½, ¼, ¼): ½ ln 2 + 2 × ¼ ln 4 = 1.5 ln 2 = 1.0397207708
    assert float(entropy(t([0.5, 0.25, 0.25]).log())) == pytest.approx(1.5 * math.log(2))


def test_clipped_value_loss():
    # ε = 0.2. Columns: V, V_old, R.
    # 1) V=1.0, V_old=0.5, R=0: (1-0)² = 1; clipped V = 0.5+0.2 = 0.7, (0.7)² = 0.49; ½ max = 0.5
    # 2) V=0.0, V_old=0.5, R=1: (0-1)² = 1; clipped 0.5-0.2 = 0.3, (0.3-1)² = 0.49;   ½ max = 0.5
    # 3) V=1.0, V_old=0.5, R=1: (1-1)² = 0; clipped 0.7, (0.7-1)² = 0.09;           ½ max = 0.045
    # 4) V=0.6, V_old=0.5, R=1: within the clip, both (0.4)² = 0.16;                  ½ × 0.16 = 0.08
    loss = clipped_value_loss(t([1.0, 0.0, 1.0, 0.6]), t([0.5, 0.5, 0.5, 0.5]), t([0.0, 1.0, 1.0, 1.0]), CLIP)
    close(loss, [0.5, 0.5, 0.045, 0.08])


def test_normalise():
    # [1,2,3,4]: mean 2.5, population std sqrt((2.25+0.25+0.25+2.25)/4) = sqrt(1.25) = 1.1180339887
    # -> ±1.5/1.118 = ±1.3416407865, ±0.5/1.118 = ±0.4472135955
    out = normalise(t([1.0, 2.0, 3.0, 4.0]))
    close(out, [-1.3416407865, -0.4472135955, 0.4472135955, 1.3416407865])
    assert float(out.mean()) == pytest.approx(0.0, abs=1e-9)
    assert float(out.std(unbiased=False)) == pytest.approx(1.0, abs=1e-6)


def test_normalise_all_equal_and_single_element():
    close(normalise(t([3.0, 3.0, 3.0])), [0.0, 0.0, 0.0])
    close(normalise(t([5.0])), [0.0])


# --- GRPO ---------------------------------------------------------------------------------------


def test_group_advantages_hand_example():
    # [1,0,0,1]: mean 0.5, population std 0.5 -> [1,-1,-1,1]
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1.0, -1.0, -1.0, 1.0])
    # [3,1]: mean 2, population std 1 -> [1,-1]
    assert group_advantages([3.0, 1.0]) == pytest.approx([1.0, -1.0])


def test_group_advantages_use_the_population_std():
    # [1,0,0]: mean 1/3; population std sqrt(((2/3)² + 2 (1/3)²)/3) = sqrt(2/9) = 0.4714045208
    # -> (2/3)/0.4714 = 1.4142135624 = √2, (-1/3)/0.4714 = -0.7071067812
    # (the sample std sqrt(1/3) would give 1.1547 and -0.5774 instead)
    assert group_advantages([1.0, 0.0, 0.0]) == pytest.approx([math.sqrt(2), -math.sqrt(0.5), -math.sqrt(0.5)])


def test_group_advantages_all_equal_are_zeros():
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.0, 0.0]) == [0.0, 0.0]
    assert group_advantages([0.7]) == [0.0]


def _task(task_id: str) -> Task:
    return Task(task_id, f"instruction of {task_id}", "textworld")


def _decision(name: str, chosen: int = 0) -> Decision:
    return Decision(
        prompt=f"prompt {name}", candidates=("go north", "take apple"), chosen=chosen, logprob=-0.6931, value=None
    )


def _episode(
    task_id: str, name: str, steps: int, won: bool, *, failures: list[bool] | None = None, cut: bool = False
) -> Episode:
    decisions = [_decision(f"{name}/{i}") for i in range(steps)]
    return Episode(
        _task(task_id),
        decisions=decisions,
        rewards=[0.0] * steps,
        model_failures=failures or [False] * steps,
        won=won,
        terminated=not cut,
        cut=cut,
    )


def _by_prompt(samples) -> dict[str, tuple[float, float]]:
    return {sample.decision.prompt: (sample.advantage, sample.weight) for sample in samples}


def test_grpo_samples_group_by_task_with_weights_one_over_episode_length():
    grpo = GRPO(RLConfig(reward="outcome"))
    episodes = [
        # task A: returns [1, 0] -> advantages [1, -1]
        _episode("A", "a-won", 2, True),
        _episode("A", "a-lost", 4, False),
        # task B, interleaved with A: returns [0, 1, 1, 0] -> [-1, 1, 1, -1]
        _episode("B", "b0", 1, False),
        _episode("B", "b1", 3, True),
        _episode("B", "b2", 5, True),
        _episode("B", "b3", 2, False),
    ]
    samples = _by_prompt(grpo.samples(episodes, None))
    expected = {}
    for name, steps, advantage in [
        ("a-won", 2, 1.0),
        ("a-lost", 4, -1.0),
        ("b0", 1, -1.0),
        ("b1", 3, 1.0),
        ("b2", 5, 1.0),
        ("b3", 2, -1.0),
    ]:
        for i in range(steps):
            expected[f"prompt {name}/{i}"] = (advantage, 1.0 / steps)
    assert samples.keys() == expected.keys()
    for prompt, (advantage, weight) in expected.items():
        assert samples[prompt] == pytest.approx((advantage, weight)), prompt


def test_grpo_samples_leave_out_cut_episodes_from_the_group_and_the_samples():
    grpo = GRPO(RLConfig(reward="outcome"))
    # Without the cut episode, A's returns are [1, 0] -> [1, -1]. Were the cut (won) episode
    # counted, returns [1, 0, 1] would give mean 2/3, std √2/3 -> [0.707, -1.414, 0.707].
    episodes = [_episode("A", "won", 1, True), _episode("A", "lost", 1, False), _episode("A", "cut", 1, True, cut=True)]
    samples = _by_prompt(grpo.samples(episodes, None))
    assert samples == {"prompt won/0": pytest.approx((1.0, 1.0)), "prompt lost/0": pytest.approx((-1.0, 1.0))}


def test_grpo_samples_leave_out_model_failures_but_keep_their_weight():
    grpo = GRPO(RLConfig(reward="outcome"))
    # The won episode has 4 decisions, the 2nd failed: 3 samples, each 1/4 (the episode's steps).
    episodes = [
        _episode("A", "won", 4, True, failures=[False, True, False, False]),
        _episode("A", "lost", 2, False, failures=[True, True]),
    ]
    samples = _by_prompt(grpo.samples(episodes, None))
    assert samples == {f"prompt won/{i}": pytest.approx((1.0, 0.25)) for i in (0, 2, 3)}


def test_grpo_samples_give_nothing_for_a_group_with_equal_returns():
    grpo = GRPO(RLConfig(reward="outcome"))
    episodes = [
        _episode("A", "w1", 2, True),
        _episode("A", "w2", 3, True),  # all won
        _episode("B", "l1", 2, False),
        _episode("B", "l2", 1, False),  # all lost
        _episode("C", "alone", 3, True),
    ]  # a group of one
    assert grpo.samples(episodes, None) == []


def test_grpo_samples_with_score_reward():
    grpo = GRPO(RLConfig(reward="score"))
    # returns 3 and 1 -> mean 2, std 1 -> [1, -1]; both lost, so 'outcome' would give no samples
    high = Episode(
        _task("A"),
        [_decision("h/0"), _decision("h/1")],
        rewards=[1.0, 2.0],
        model_failures=[False, False],
        terminated=True,
    )
    low = Episode(_task("A"), [_decision("l/0")], rewards=[1.0], model_failures=[False], terminated=True)
    samples = _by_prompt(grpo.samples([high, low], None))
    assert samples == {
        "prompt h/0": pytest.approx((1.0, 0.5)),
        "prompt h/1": pytest.approx((1.0, 0.5)),
        "prompt l/0": pytest.approx((-1.0, 1.0)),
    }
    assert GRPO(RLConfig(reward="outcome")).samples([high, low], None) == []


# --- PPO's GAE ----------------------------------------------------------------------------------


def test_gae_terminal_episode():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7], γ = 0.9, λ = 0.8 (γλ = 0.72), V after the end = 0
    # t=2: δ = 1 + 0.9×0 - 0.7 = 0.3;            A2 = 0.3
    # t=1: δ = 0 + 0.9×0.7 - 0.6 = 0.03;         A1 = 0.03 + 0.72×0.3 = 0.246
    # t=0: δ = 0 + 0.9×0.6 - 0.5 = 0.04;         A0 = 0.04 + 0.72×0.246 = 0.21712
    # returns A + V = [0.71712, 0.846, 1.0]
    advantages, returns = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.7], 0.0, 0.9, 0.8)
    assert advantages == pytest.approx([0.21712, 0.246, 0.3])
    assert returns == pytest.approx([0.71712, 0.846, 1.0])


def test_gae_truncated_episode_bootstraps_the_last_value():
    # r = [0, 0, 0], V = [0.5, 0.6, 0.7], V(cut state) = 0.4, γ = 0.9, λ = 0.8
    # t=2: δ = 0 + 0.9×0.4 - 0.7 = -0.34;        A2 = -0.34
    # t=1: δ = 0.03;                             A1 = 0.03 + 0.72×(-0.34) = -0.2148
    # t=0: δ = 0.04;                             A0 = 0.04 + 0.72×(-0.2148) = -0.114656
    # returns = [0.385344, 0.3852, 0.36]
    advantages, returns = gae([0.0, 0.0, 0.0], [0.5, 0.6, 0.7], 0.4, 0.9, 0.8)
    assert advantages == pytest.approx([-0.114656, -0.2148, -0.34])
    assert returns == pytest.approx([0.385344, 0.3852, 0.36])


def test_gae_with_lambda_one_is_the_discounted_return_minus_the_value():
    # r = [1, 2, 3], V = [0.5, 0.6, 0.7], bootstrap 0.4, γ = 0.9
    # G2 = 3 + 0.9×0.4 = 3.36; G1 = 2 + 0.9×3.36 = 5.024; G0 = 1 + 0.9×5.024 = 5.5216
    # A = G - V = [5.0216, 4.424, 2.66]; return targets = G
    advantages, returns = gae([1.0, 2.0, 3.0], [0.5, 0.6, 0.7], 0.4, 0.9, 1.0)
    assert advantages == pytest.approx([5.0216, 4.424, 2.66])
    assert returns == pytest.approx([5.5216, 5.024, 3.36])


def test_gae_with_lambda_zero_is_the_one_step_td_error():
    # δ from the terminal example above: [0.04, 0.03, 0.3]
    advantages, _ = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.7], 0.0, 0.9, 0.0)
    assert advantages == pytest.approx([0.04, 0.03, 0.3])


def test_gae_length_mismatch_and_empty():
    with pytest.raises(ValueError, match="3 rewards but 2 values"):
        gae([0.0, 0.0, 1.0], [0.5, 0.6], 0.0, 0.9, 0.8)
    assert gae([], [], 0.0, 0.9, 0.8) == ([], [])


# --- episodes and the real budget ---------------------------------------------------------------


def test_episode_outcome_and_score_rewards():
    won = Episode(
        _task("A"),
        [_decision(str(i)) for i in range(3)],
        rewards=[0.0, 1.0, 2.0],
        model_failures=[False] * 3,
        won=True,
        terminated=True,
    )
    assert won.step_rewards("outcome") == [0.0, 0.0, 1.0]
    assert won.episode_return("outcome") == 1.0
    assert won.step_rewards("score") == [0.0, 1.0, 2.0]
    assert won.episode_return("score") == 3.0  # 0 + 1 + 2
    lost = Episode(
        _task("A"),
        [_decision(str(i)) for i in range(2)],
        rewards=[1.0, 0.0],
        model_failures=[False] * 2,
        won=False,
        truncated=True,
    )
    assert lost.step_rewards("outcome") == [0.0, 0.0]
    assert lost.episode_return("outcome") == 0.0
    assert lost.episode_return("score") == 1.0
    one = Episode(_task("A"), [_decision("0")], rewards=[5.0], model_failures=[False], won=True)
    assert one.step_rewards("outcome") == [1.0]
    empty = Episode(_task("A"))
    assert empty.step_rewards("outcome") == [] and empty.episode_return("outcome") == 0.0
    assert empty.step_rewards("score") == [] and empty.steps == 0


def test_step_rewards_returns_a_copy_of_the_score_rewards():
    episode = Episode(_task("A"), [_decision("0")], rewards=[1.0], model_failures=[False])
    episode.step_rewards("score").append(9.0)
    assert episode.rewards == [1.0]


def test_real_budget_limits_what_it_grants():
    budget = RealBudget(5)
    assert budget.take(3) == 3 and budget.used == 3 and not budget.exhausted
    assert budget.take(4) == 2 and budget.used == 5 and budget.exhausted  # only 5 - 3 = 2 left
    assert budget.take(1) == 0 and budget.used == 5
    zero = RealBudget(0)
    assert zero.exhausted and zero.take(2) == 0


def test_unlimited_real_budget():
    budget = RealBudget(None)
    assert budget.take(1000) == 1000 and budget.take(7) == 7
    assert budget.used == 1007 and not budget.exhausted
    assert budget.groups_that_fit(8, 4, 50.0) == 8


def test_an_epoch_near_the_end_of_the_real_budget_plays_the_groups_it_can_finish():
    budget = RealBudget(1000)
    assert budget.groups_that_fit(8, 4, 20.0) == 8  # 8 groups of 4 at 20 steps: 640 of 1,000
    budget.take(648)
    assert budget.groups_that_fit(8, 4, 20.25) == 4  # 352 left: 4 groups of ~81
    budget.take(300)
    assert budget.groups_that_fit(8, 4, 20.25) == 1  # 52 left: less than a group, but one is played
    assert RealBudget(20).groups_that_fit(8, 4, 0.0) == 5  # a mean of 0 steps counts as 1


# --- collapse warnings --------------------------------------------------------------------------


def _row(epoch: int, entropy_value: float, success: float) -> dict[str, float]:
    return {"epoch": float(epoch), "entropy": entropy_value, "success_rate": success}


def test_collapse_warnings_healthy_history_is_quiet():
    assert collapse_warnings([]) == []
    assert collapse_warnings([_row(0, 1.2, 0.0)]) == []  # never succeeded yet: no collapse
    assert collapse_warnings([_row(0, 1.2, 0.0), _row(1, 0.9, 0.0)]) == []
    assert collapse_warnings([_row(0, 1.2, 0.25), _row(1, 0.8, 0.5), _row(2, 0.5, 0.25)]) == []
    assert collapse_warnings([_row(0, ENTROPY_FLOOR, 0.5)]) == []  # at the floor, not below


def test_collapse_warnings_entropy_below_the_floor():
    messages = collapse_warnings([_row(0, 1.0, 0.5), _row(1, ENTROPY_FLOOR / 2, 0.5)])
    assert len(messages) == 1
    assert "entropy" in messages[0] and "epoch 1" in messages[0]
    # only the last epoch matters: a recovered entropy is quiet again
    assert collapse_warnings([_row(0, 0.01, 0.5), _row(1, 1.0, 0.5)]) == []


def test_collapse_warnings_success_falling_to_zero():
    messages = collapse_warnings([_row(0, 1.0, 0.0), _row(1, 1.0, 0.5), _row(2, 1.0, 0.0)])
    assert len(messages) == 1
    assert "success rate" in messages[0] and "0.50" in messages[0] and "epoch 2" in messages[0]
    both = collapse_warnings([_row(0, 1.0, 0.75), _row(1, 0.001, 0.0)])
    assert len(both) == 2


def test_an_epoch_the_budget_cut_part_of_has_no_outcomes_but_its_counts():
    """The episodes that finished before the budget ran out are the short ones: no epoch's success."""
    whole = episode_metrics([_episode("A", f"w{i}", 3, i < 3) for i in range(4)], "outcome")
    assert whole["success_rate"] == 0.75 and whole["steps_mean"] == 3
    partial = [_episode("A", "short", 1, False), *(_episode("A", f"c{i}", 5, False, cut=True) for i in range(3))]
    metrics = episode_metrics(partial, "outcome")
    assert metrics["episodes"] == 1 and metrics["cut_episodes"] == 3
    assert not {"success_rate", "return_mean", "steps_mean"} & metrics.keys()
    assert collapse_warnings([_row(0, 1.0, 0.94), {"epoch": 1.0, "entropy": 1.0, **metrics}]) == []


def test_an_epoch_the_budget_cut_entirely_is_no_collapse():
    """An epoch whose every episode the real budget cut has no success rate (none finished), not 0."""
    cut_short = {"epoch": 2.0, "entropy": 1.0, "episodes": 0.0, "cut_episodes": 8.0}
    assert collapse_warnings([_row(0, 1.0, 0.5), _row(1, 1.0, 0.75), cut_short]) == []


def test_progress_takes_back_the_score_of_a_lost_episode():
    from dreamgym.envs.base import Task
    from dreamgym.rl.rollout import Episode

    def episode(rewards, *, won=False, terminated=False, truncated=False):
        ep = Episode(Task("t", "cook", "tw-cooking"), rewards=list(rewards), won=won)
        ep.decisions = [None] * len(rewards)
        ep.terminated, ep.truncated = terminated, truncated
        return ep

    lost = episode([1.0, 0.0, 2.0, 0.0], terminated=True)
    assert lost.step_rewards("progress") == [1.0, 0.0, 2.0, -3.0] and lost.episode_return("progress") == 0.0
    assert lost.episode_return("score") == 3.0  # the score alone rewards rushing into a loss
    slow = episode([1.0, 0.0, 0.0], truncated=True)  # the step limit is not a loss
    assert slow.step_rewards("progress") == [1.0, 0.0, 0.0]
    won = episode([1.0, 2.0, 4.0], won=True, terminated=True)
    assert won.episode_return("progress") == 7.0 and won.episode_return("outcome") == 1.0
    assert episode([], terminated=True).step_rewards("progress") == []
