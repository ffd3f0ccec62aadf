"""The promotion gate: the significance test, the decision rule, and the gate on a real MLflow registry."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from dreamgym.errors import DreamgymError
from dreamgym.evaluation import eval_set_id
from dreamgym.ops.config import PromotionConfig
from dreamgym.ops.promotion import (
    BC_LABEL,
    CHAMPION_ALIAS,
    Decision,
    Score,
    alias_version,
    crown_first,
    decide,
    evaluation_tags,
    gate,
    one_sided_p_value,
    paired_p_value,
    set_challenger,
    strongest_p_value,
)

NAME = "dreamgym-policy"
SET = "set-a"


# The p-value ----------------------------------------------------------------------------------


def test_p_value_matches_hand_computation():
    # 30/40 vs 20/40: pooled 50/80 = 0.625, se = sqrt(0.625 * 0.375 * (1/40 + 1/40)) = sqrt(0.01171875)
    # = 0.108253..., z = 0.25 / se = 4/sqrt(3) = 2.309401..., p = Phi(-2.309401) = 0.0104607.
    assert one_sided_p_value(30, 40, 20, 40) == pytest.approx(0.0104607, abs=1e-6)
    # 30/40 vs 18/40: pooled 0.6, se = sqrt(0.24 / 20), z = 0.3 / se = sqrt(7.5) = 2.738613, p = 0.0030849.
    assert one_sided_p_value(30, 40, 18, 40) == pytest.approx(0.0030849, abs=1e-6)
    # 5/10 vs 0/10: pooled 0.25, se = sqrt(0.25 * 0.75 * 0.2), z = 0.5 / se = 2.581989, p = 0.0049116.
    assert one_sided_p_value(5, 10, 0, 10) == pytest.approx(0.0049116, abs=1e-6)


def test_p_value_symmetry_and_edges():
    # One-sided: swapping the two samples gives the complement.
    assert one_sided_p_value(20, 40, 30, 40) == pytest.approx(1 - one_sided_p_value(30, 40, 20, 40))
    # Equal rates with variance: z = 0, p = 0.5 (whatever the sample sizes).
    assert one_sided_p_value(10, 20, 20, 40) == pytest.approx(0.5)
    # No variance (all lost, or all won, by both): no evidence either way.
    assert one_sided_p_value(0, 10, 0, 30) == 1.0
    assert one_sided_p_value(10, 10, 30, 30) == 1.0
    # More episodes, same rates: more evidence.
    assert one_sided_p_value(60, 80, 40, 80) < one_sided_p_value(30, 40, 20, 40)


@pytest.mark.parametrize("counts", [(1, 0, 1, 1), (2, 1, 0, 1), (-1, 5, 0, 5), (0, 5, 6, 5), (0, -3, 0, 5)])
def test_p_value_rejects_impossible_counts(counts):
    with pytest.raises(DreamgymError, match="need at least one episode and 0 <= successes <= episodes"):
        one_sided_p_value(*counts)


def test_paired_p_value_matches_hand_computation():
    # Episodes won by both or by neither do not count; of the 6 won by only one, a won 5:
    # p = P(Binomial(6, 1/2) >= 5) = (6 + 1) / 64 = 0.109375.
    a = "11" + "00" + "11111" + "0"
    b = "11" + "00" + "00000" + "1"
    assert paired_p_value(a, b) == pytest.approx(7 / 64)
    assert paired_p_value("1" * 5, "0" * 5) == pytest.approx(1 / 32)  # 5 of 5: 0.03125
    # One-sided: the other way round, p = P(X >= 1) = 63/64.
    assert paired_p_value(b, a) == pytest.approx(63 / 64)
    # No episode that only one won: no evidence either way.
    assert paired_p_value("1100", "1100") == 1.0
    with pytest.raises(DreamgymError, match="paired outcomes of 3 and 4 episodes"):
        paired_p_value("110", "1100")


def test_paired_test_sees_what_the_unpaired_one_misses():
    """A policy fine-tuned from BC that wins BC's 15 games and 5 more: the paired test calls it
    better (p = 1/32), the two-proportion test on 20/40 vs 15/40 does not (p = 0.13)."""
    bc = "1" * 15 + "0" * 25
    tuned = "1" * 20 + "0" * 20
    challenger = Score("models:/dreamgym-policy/3", 20, 40, SET, tuned)
    baseline = Score(BC_LABEL, 15, 40, SET, bc)
    decision = decide(challenger, baseline, PromotionConfig())
    assert decision.promote and decision.test == "paired" and decision.p_value == pytest.approx(1 / 32)
    assert "paired p=0.0312 < alpha 0.05" in decision.reason and decision.tags()["promotion.test"] == "paired"
    unpaired = decide(score(20), score(15, BC_LABEL), PromotionConfig())
    assert not unpaired.promote and unpaired.p_value == pytest.approx(0.1299, abs=1e-4)
    # The same counts with the gains and losses spread (8 gained, 3 lost): not significant.
    mixed = Score("models:/dreamgym-policy/3", 20, 40, SET, "1" * 12 + "0" * 3 + "1" * 8 + "0" * 17)
    assert not decide(mixed, baseline, PromotionConfig()).promote
    # One side without outcomes (registered before they were recorded): the unpaired test.
    assert decide(challenger, score(15, BC_LABEL), PromotionConfig()).test == "unpaired"


def test_a_set_too_small_to_beat_the_baseline_on_says_so():
    """BC won 36 of 40 (as in `make run`): even a challenger that wins all 40 gains 4 episodes and
    loses none, p = 1/16 by the paired test, not below 0.05. The decision says that no challenger
    can pass on this set and what to change; where one could, it says nothing of the kind."""
    bc = "1" * 36 + "0" * 4
    baseline = Score(BC_LABEL, 36, 40, SET, bc)
    assert strongest_p_value(baseline, paired=True) == pytest.approx(1 / 16)
    perfect = decide(Score("models:/dreamgym-policy/3", 40, 40, SET, "1" * 40), baseline, PromotionConfig())
    assert not perfect.promote and perfect.p_value == pytest.approx(1 / 16)
    assert "no challenger can pass on this set: the BC policy lost 4 of its 40 episodes" in perfect.reason
    assert "p=0.0625" in perfect.reason and "evaluation.games" in perfect.reason
    worse = decide(Score("models:/dreamgym-policy/3", 35, 40, SET, "1" * 35 + "0" * 5), baseline, PromotionConfig())
    assert "is not above margin" in worse.reason and "no challenger can pass" in worse.reason
    # With 5 episodes lost, winning them all is p = 1/32: a challenger could pass, and is told nothing more.
    weaker = Score(BC_LABEL, 35, 40, SET, "1" * 35 + "0" * 5)
    assert strongest_p_value(weaker, paired=True) == pytest.approx(1 / 32)
    assert "no challenger can pass" not in decide(worse.challenger, weaker, PromotionConfig()).reason
    # Unpaired (no outcomes): 40/40 against 39/40 is p = 0.16, against 30/40 far below 0.05.
    assert strongest_p_value(score(39, BC_LABEL), paired=False) == pytest.approx(0.157, abs=1e-3)
    assert strongest_p_value(score(30, BC_LABEL), paired=False) < 0.01
    assert strongest_p_value(Score(BC_LABEL, 40, 40, SET, "1" * 40), paired=True) == 1.0  # nothing to gain


def test_evaluation_tags_carry_outcomes_that_fit():
    policy, bc = {"wins": 2, "episodes": 3, "outcomes": "101"}, {"wins": 1, "episodes": 3, "outcomes": "100"}
    assert evaluation_tags(policy, bc) == {
        "eval_successes": "2",
        "eval_episodes": "3",
        "eval_outcomes": "101",
        "bc_successes": "1",
        "bc_episodes": "3",
        "bc_outcomes": "100",
    }
    # An evaluation summary written before outcomes were recorded, or one too long for a tag.
    assert "eval_outcomes" not in evaluation_tags({"wins": 2, "episodes": 3}, bc)
    long = {"wins": 0, "episodes": 6000, "outcomes": "0" * 6000}
    assert "eval_outcomes" not in evaluation_tags(long, bc)
    assert "bc_outcomes" not in evaluation_tags(policy, long)


def test_score_checks_its_counts_and_has_a_rate():
    assert Score("bc", 18, 40, SET).rate == 0.45 and str(Score("bc", 18, 40, SET)) == "18/40 (45.0%)"
    with pytest.raises(DreamgymError, match="bc: 41 successes of 40"):
        Score("bc", 41, 40, SET)
    for outcomes in ("101", "1110", "1x10", "110 "):  # wrong length, wrong count, not 0/1
        with pytest.raises(DreamgymError, match="one '1' \\(won\\) or '0' \\(lost\\) per episode"):
            Score("bc", 2, 4, SET, outcomes)


def test_eval_set_id_identifies_games_settings_and_seed():
    settings = {"games": 2, "episodes_per_game": 1, "max_steps": 50, "greedy": True}
    first = eval_set_id(["b.z8", "a.z8"], settings, 0)
    assert len(first) == 16 and int(first, 16) >= 0
    assert first == eval_set_id(["a.z8", "b.z8"], dict(reversed(settings.items())), 0)  # order-free
    assert (
        len(
            {
                first,
                eval_set_id(["a.z8", "c.z8"], settings, 0),
                eval_set_id(["a.z8", "b.z8"], settings, 1),
                eval_set_id(["a.z8", "b.z8"], {**settings, "max_steps": 30}, 0),
            }
        )
        == 4
    )


# The decision ---------------------------------------------------------------------------------


def score(successes: int, label: str = "models:/dreamgym-policy/3", episodes: int = 40, eval_set: str = SET) -> Score:
    return Score(label, successes, episodes, eval_set)


def test_decide_promotes_a_significant_win():
    decision = decide(score(30), score(18, "models:/dreamgym-policy/2"), PromotionConfig())
    assert decision.promote and decision.p_value == pytest.approx(0.0030849, abs=1e-6)
    assert decision.reason == (
        "challenger models:/dreamgym-policy/3 30/40 (75.0%) vs champion "
        "models:/dreamgym-policy/2 18/40 (45.0%): difference 30.0 points > margin "
        "0.0 points, unpaired p=0.00308 < alpha 0.05"
    )
    tags = decision.tags()
    assert set(tags) == {
        "promotion.decision",
        "promotion.baseline",
        "promotion.p_value",
        "promotion.test",
        "promotion.reason",
        "promotion.challenger_rate",
        "promotion.baseline_rate",
    }
    assert (
        tags["promotion.decision"],
        tags["promotion.baseline"],
        tags["promotion.challenger_rate"],
        tags["promotion.baseline_rate"],
    ) == ("promoted", "models:/dreamgym-policy/2", "0.75", "0.45")
    assert tags["promotion.test"] == "unpaired"  # neither score knows its episodes' outcomes
    assert float(tags["promotion.p_value"]) == pytest.approx(decision.p_value, rel=1e-5)
    assert all(isinstance(value, str) for value in tags.values())
    metrics = decision.metrics()
    assert metrics == pytest.approx(
        {
            "promotion_promoted": 1.0,
            "promotion_p_value": decision.p_value,
            "promotion_challenger_rate": 0.75,
            "promotion_baseline_rate": 0.45,
            "promotion_difference": 0.3,
        }
    )


def test_decide_needs_both_margin_and_significance():
    # A tie never wins, even with margin 0 (and p = 0.5).
    tie = decide(score(20), score(20, BC_LABEL), PromotionConfig(margin=0.0))
    assert not tie.promote and tie.p_value == pytest.approx(0.5) and "is not above margin 0.0 points" in tie.reason
    assert "the BC policy 20/40" in tie.reason and tie.tags()["promotion.decision"] == "rejected"
    # Higher but not significant: 24/40 vs 20/40, p = 0.184.
    lucky = decide(score(24), score(20, BC_LABEL), PromotionConfig())
    assert not lucky.promote and "not significant: unpaired p=0.184 >= alpha 0.05" in lucky.reason
    assert lucky.metrics()["promotion_promoted"] == 0.0
    # Significant (p = 0.0031) but the difference, exactly 0.3, is not *more than* a 0.3 margin
    # (in floats 0.75 - 0.45 is 0.30000000000000004).
    assert not decide(score(30), score(18, BC_LABEL), PromotionConfig(margin=0.3)).promote
    assert decide(score(30), score(18, BC_LABEL), PromotionConfig(margin=0.29)).promote
    # Significant at 0.05 but not at 0.01: 28/40 vs 20/40, p = 0.034.
    assert decide(score(28), score(20, BC_LABEL), PromotionConfig(alpha=0.05)).promote
    assert not decide(score(28), score(20, BC_LABEL), PromotionConfig(alpha=0.01)).promote


def test_decide_refuses_different_eval_sets():
    with pytest.raises(DreamgymError, match="same frozen held-out set"):
        decide(score(30), score(10, BC_LABEL, eval_set="set-b"), PromotionConfig())


# The gate on a real registry ------------------------------------------------------------------


def register(tmp_path: Path, key: str, **tags: int | str) -> str:
    """A policy version as the pipeline registers it (a small model folder, `tags`), made challenger."""
    import mlflow

    from dreamgym.ops.registry import register_model_dir
    from dreamgym.ops.tracking import experiment_id

    folder = tmp_path / key
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    # An experiment with its artifacts under tmp_path (the default one keeps them in ./mlruns).
    with mlflow.start_run(experiment_id=experiment_id("promotion-test", tmp_path)):
        version = register_model_dir(folder, NAME, key=key, tags={k: str(v) for k, v in tags.items()})
    set_challenger(NAME, version)
    return str(version)  # MLflow 3 returns an int, whatever register_model_dir's annotation says


def version_tags(version: str) -> dict[str, str]:
    import mlflow

    return mlflow.MlflowClient().get_model_version(NAME, version).tags


def promotion_tags(version: str) -> dict[str, str]:
    return {k: v for k, v in version_tags(version).items() if k.startswith("promotion.")}


def evaluated(successes: int, bc: int = 18, eval_set: str = SET) -> dict[str, int | str]:
    return {
        "eval_set": eval_set,
        "eval_successes": successes,
        "eval_episodes": 40,
        "bc_successes": bc,
        "bc_episodes": 40,
    }


def test_gate_promotes_only_versions_that_beat_the_champion(mlflow_tracking, tmp_path):
    config = PromotionConfig()
    # The first version is compared with the BC policy it started from: 30/40 vs 18/40 (p = 0.003).
    v1 = register(tmp_path, "v1", **evaluated(30))
    first = gate(NAME, v1, config)
    assert first.promote and first.baseline == Score(BC_LABEL, 18, 40, SET)
    assert alias_version(NAME, CHAMPION_ALIAS) == v1
    assert promotion_tags(v1) == first.tags() and promotion_tags(v1)["promotion.decision"] == "promoted"
    assert promotion_tags(v1)["promotion.baseline"] == "bc"

    # 32/40 vs the champion's 30/40 (p = 0.29): not promoted, and the version says why.
    v2 = register(tmp_path, "v2", **evaluated(32))
    second = gate(NAME, v2, config)
    assert not second.promote and second.baseline == Score(f"models:/{NAME}/{v1}", 30, 40, SET)
    assert alias_version(NAME, CHAMPION_ALIAS) == v1
    assert promotion_tags(v2)["promotion.decision"] == "rejected"
    assert promotion_tags(v2)["promotion.reason"] == second.reason and "not significant" in second.reason

    # 39/40 vs 30/40 (p = 0.002): a dry run decides but changes nothing; the real one promotes.
    v3 = register(tmp_path, "v3", **evaluated(39))
    dry = gate(NAME, v3, config, dry_run=True)
    assert dry.promote and alias_version(NAME, CHAMPION_ALIAS) == v1 and promotion_tags(v3) == {}
    third = gate(NAME, v3, config)
    assert third == dry and alias_version(NAME, CHAMPION_ALIAS) == v3
    assert promotion_tags(v3)["promotion.decision"] == "promoted"
    assert promotion_tags(v3)["promotion.baseline"] == f"models:/{NAME}/{v1}"
    # The challenger alias is the pipeline's; the gate leaves it.
    assert alias_version(NAME, "challenger") == v3

    # Gating the champion again is a no-op that keeps the decision that promoted it.
    again = gate(NAME, v3, config)
    assert not again.promote and again.p_value == 1.0 and "already the champion" in again.reason
    assert promotion_tags(v3) == third.tags()


def test_bc_crowned_first_stays_champion_until_a_challenger_beats_it(mlflow_tracking, tmp_path):
    """As the pipeline does: BC registered with its own score, crowned while there is no champion;
    a challenger no better leaves it champion (the alias resolves), one that beats it takes it."""
    outcomes = "1" * 15 + "0" * 25
    bc = register(tmp_path, "bc", **evaluated(15, bc=15), eval_outcomes=outcomes, bc_outcomes=outcomes)
    assert crown_first(NAME, bc) and alias_version(NAME, CHAMPION_ALIAS) == bc
    assert not crown_first(NAME, "999"), "a champion exists: nothing changes"

    same = register(tmp_path, "rl-1", **evaluated(15, bc=15), eval_outcomes=outcomes, bc_outcomes=outcomes)
    kept = gate(NAME, same, PromotionConfig())
    assert not kept.promote and kept.baseline.label == f"models:/{NAME}/{bc}"
    assert alias_version(NAME, CHAMPION_ALIAS) == bc

    better = "1" * 21 + "0" * 19  # BC's 15 games kept and 6 gained: paired p = 1/64
    winner = register(tmp_path, "rl-2", **evaluated(21, bc=15), eval_outcomes=better, bc_outcomes=outcomes)
    decision = gate(NAME, winner, PromotionConfig())
    assert decision.promote and decision.test == "paired" and decision.p_value == pytest.approx(1 / 64)
    assert alias_version(NAME, CHAMPION_ALIAS) == winner


def test_gate_pairs_the_episodes_when_the_version_records_them(mlflow_tracking, tmp_path):
    """The pipeline tags each version with which episodes it and BC won: 20/40 vs 15/40 with BC's
    15 games kept and 5 gained is promoted (paired p = 1/32); the counts alone would not be."""
    counts_only = register(tmp_path, "v1", **evaluated(20, bc=15))
    assert not gate(NAME, counts_only, PromotionConfig()).promote
    paired = register(
        tmp_path, "v2", **evaluated(20, bc=15), eval_outcomes="1" * 20 + "0" * 20, bc_outcomes="1" * 15 + "0" * 25
    )
    decision = gate(NAME, paired, PromotionConfig())
    assert decision.promote and decision.test == "paired" and decision.p_value == pytest.approx(1 / 32)
    assert alias_version(NAME, CHAMPION_ALIAS) == paired and promotion_tags(paired)["promotion.test"] == "paired"


def test_gate_reevaluates_a_champion_measured_on_another_eval_set(mlflow_tracking, tmp_path):
    v1 = register(tmp_path, "v1", **evaluated(30, eval_set="old-set"))
    assert gate(NAME, v1, PromotionConfig()).promote
    v2 = register(tmp_path, "v2", **evaluated(30, eval_set="new-set"))

    with pytest.raises(DreamgymError, match="evaluated again on the current held-out games"):
        gate(NAME, v2, PromotionConfig())
    calls: list[str] = []

    def evaluate(reference: str) -> Score:
        calls.append(reference)
        return Score(reference, 12, 40, "new-set")

    decision = gate(NAME, v2, PromotionConfig(), evaluate=evaluate)
    assert calls == [f"models:/{NAME}/{v1}"]
    assert decision.promote and decision.baseline == Score(f"models:/{NAME}/{v1}", 12, 40, "new-set")
    assert alias_version(NAME, CHAMPION_ALIAS) == v2
    # The measurement must be on the challenger's set, or the rates are not compared.
    v3 = register(tmp_path, "v3", **evaluated(40, eval_set="newest-set"))
    with pytest.raises(DreamgymError, match="same frozen held-out set"):
        gate(NAME, v3, PromotionConfig(), evaluate=lambda reference: Score(reference, 0, 40, "new-set"))
    assert alias_version(NAME, CHAMPION_ALIAS) == v2 and promotion_tags(v3) == {}


def test_gate_explains_versions_it_cannot_judge(mlflow_tracking, tmp_path):
    untagged = register(tmp_path, "v1", eval_set=SET, eval_successes=30)
    with pytest.raises(DreamgymError, match="has no tag 'eval_episodes': it was not registered by the pipeline"):
        gate(NAME, untagged, PromotionConfig())
    no_bc = register(tmp_path, "v2", eval_set=SET, eval_successes=30, eval_episodes=40)
    with pytest.raises(DreamgymError, match="has no tag 'bc_successes'"):
        gate(NAME, no_bc, PromotionConfig())
    with pytest.raises(DreamgymError, match="no version 99 of registered model"):
        gate(NAME, "99", PromotionConfig())
    assert alias_version(NAME, CHAMPION_ALIAS) is None and alias_version("no-such-model", "challenger") is None


def test_decision_is_a_frozen_value():
    decision = decide(score(30), score(18, BC_LABEL), PromotionConfig())
    assert isinstance(decision, Decision)
    with pytest.raises(AttributeError):
        decision.promote = False  # type: ignore[misc]
    assert math.isfinite(decision.p_value)


# The command ----------------------------------------------------------------------------------


@pytest.fixture
def restored_environ():
    """`configure_services` sets defaults in os.environ for the process; put it back afterwards."""
    before = dict(os.environ)
    yield
    for key in set(os.environ) - set(before):
        del os.environ[key]
    os.environ.update(before)


def promote(params: Path, *args: str):
    from typer.testing import CliRunner

    from dreamgym.cli import app

    return CliRunner().invoke(app, ["promote", *args, "--params", str(params)])


def test_promote_command(mlflow_tracking, restored_environ, tmp_path):
    params = tmp_path / "params.yaml"  # the defaults; the run dir goes under tmp_path
    params.write_text("{}\n")
    result = promote(params)
    assert isinstance(result.exception, DreamgymError)
    assert str(result.exception) == "no challenger; run the pipeline (dreamgym run) first"

    v1 = register(tmp_path, "v1", **evaluated(30))
    result = promote(params, "--version", v1, "--dry-run")
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "promoted to champion: challenger models:/dreamgym-policy/1 30/40 (75.0%)" in result.output
    assert "(dry run: nothing changed)" in result.output
    assert alias_version(NAME, CHAMPION_ALIAS) is None and promotion_tags(v1) == {}

    result = promote(params)  # the challenger alias
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "dry run" not in result.output and alias_version(NAME, CHAMPION_ALIAS) == v1
    assert promote(params, "--help").output.count("--dry-run") == 1
