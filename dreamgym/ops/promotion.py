"""The promotion gate of the policy registry: a new version becomes `champion` only if it is better.

Each policy version the pipeline registers carries its own held-out evaluation as tags, and the
evaluation of the BC policy it started from, both on the same frozen evaluation set:

    eval_set        `dreamgym.evaluation.eval_set_id` of the games, evaluation settings and seed
    eval_successes  episodes the version won          eval_episodes  episodes it played
    bc_successes    episodes the BC policy won        bc_episodes    episodes it played
    eval_outcomes   won ("1") or lost ("0"), episode by episode in play order (optional)
    bc_outcomes     the same for the BC policy (optional)

and the alias `challenger`. The pipeline registers its BC policy too (its own score as both
counts) and makes it the champion when there is none (`crown_first`). `gate` compares the
challenger with the version aliased `champion` (with the BC policy its tags record when there is
none) and moves `champion` to it only when its success rate
is higher by more than `promotion.margin` *and* a one-sided test says so at level
`promotion.alpha`: a lucky evaluation of a no-better policy does not replace a good one. The
decision, promoted or not, is written onto the challenger's version as `promotion.*` tags.

The test is paired when both scores have their outcomes: the two policies played the very same
episodes, so only the episodes one won and the other lost say which is better (exact McNemar
test). A policy fine-tuned from BC wins mostly the same games as BC, and the unpaired
two-proportion z-test, which treats the two evaluations as independent samples, needs a much
larger difference to see the same improvement (e.g. 20/40 vs 15/40, 5 games gained and none
lost: paired p = 0.031, unpaired p = 0.13). Without outcomes (versions registered before they
were recorded) the unpaired test is used.

A champion measured on another evaluation set (the games or settings changed since) is measured
again on the challenger's set through a callback (`held_out_evaluator`), never compared as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from dreamgym.errors import DreamgymError

if TYPE_CHECKING:
    from dreamgym.config import PipelineConfig
    from dreamgym.ops.config import PromotionConfig

POLICY_MODEL_NAME = "dreamgym-policy"
CHAMPION_ALIAS = "champion"
CHALLENGER_ALIAS = "challenger"
BC_LABEL = "bc"
EVAL_TAGS = ("eval_set", "eval_successes", "eval_episodes")
BC_TAGS = ("eval_set", "bc_successes", "bc_episodes")
EVAL_OUTCOMES_TAG = "eval_outcomes"
BC_OUTCOMES_TAG = "bc_outcomes"
# MLflow's limit on a tag's value: longer evaluations are registered without their outcomes.
MAX_OUTCOMES = 5000


class PromotionError(DreamgymError):
    """A promotion that cannot be decided: bad counts, incomparable evaluations, missing tags."""


def _check_count(successes: int, n: int, what: str) -> None:
    if n <= 0 or not 0 <= successes <= n:
        raise PromotionError(
            f"{what}: {successes} successes of {n} episodes; need at least one episode and 0 <= successes <= episodes"
        )


def one_sided_p_value(successes_a: int, n_a: int, successes_b: int, n_b: int) -> float:
    """P-value of the pooled two-proportion z-test of H1: rate a > rate b (normal approximation).

    When every episode of both was won, or none was, the pooled rate is 0 or 1: the two rates are
    equal and there is no evidence either way, so 1.0.
    """
    _check_count(successes_a, n_a, "first sample")
    _check_count(successes_b, n_b, "second sample")
    pooled = (successes_a + successes_b) / (n_a + n_b)
    if pooled in (0.0, 1.0):
        return 1.0
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    z = (successes_a / n_a - successes_b / n_b) / se
    return 0.5 * math.erfc(z / math.sqrt(2))


def paired_p_value(outcomes_a: str, outcomes_b: str) -> float:
    """P-value of the one-sided exact McNemar test of H1: a wins more often than b, on the same
    episodes (`outcomes_*[i]` is "1" when episode i was won).

    Episodes both won or both lost say nothing about which is better; of the `n` that only one of
    them won, a won `k`. Were they equally good, each of those would be a's with probability 1/2:
    p = P(Binomial(n, 1/2) >= k). With no such episode there is no evidence either way: 1.0.
    """
    if len(outcomes_a) != len(outcomes_b):
        raise PromotionError(
            f"paired outcomes of {len(outcomes_a)} and {len(outcomes_b)} episodes: a paired test needs "
            "the same episodes of the same evaluation set"
        )
    only_a = sum(a == "1" and b == "0" for a, b in zip(outcomes_a, outcomes_b, strict=True))
    only_b = sum(a == "0" and b == "1" for a, b in zip(outcomes_a, outcomes_b, strict=True))
    n = only_a + only_b
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(only_a, n + 1)) / 2**n


@dataclass(frozen=True)
class Score:
    """A policy's success count on one evaluation set; `label` says which policy (a models:/ URI
    or `bc`), `eval_set` which set (`eval_set_id`), `outcomes` (when known) which episodes it won:
    "1" or "0" per episode, in play order."""

    label: str
    successes: int
    episodes: int
    eval_set: str
    outcomes: str | None = None

    def __post_init__(self) -> None:
        _check_count(self.successes, self.episodes, self.label)
        if self.outcomes is not None and (
            len(self.outcomes) != self.episodes
            or set(self.outcomes) - {"0", "1"}
            or self.outcomes.count("1") != self.successes
        ):
            raise PromotionError(
                f"{self.label}: outcomes must be one '1' (won) or '0' (lost) per episode, {self.episodes} "
                f"in all with {self.successes} '1's; got {self.outcomes[:60]!r}"
                + ("..." if len(self.outcomes) > 60 else "")
            )

    @property
    def rate(self) -> float:
        return self.successes / self.episodes

    def __str__(self) -> str:
        return f"{self.successes}/{self.episodes} ({self.rate:.1%})"


def _points(rate: float) -> str:
    return f"{100 * rate:.1f} points"


def _baseline_name(score: Score) -> str:
    return "the BC policy" if score.label == BC_LABEL else f"champion {score.label}"


@dataclass(frozen=True)
class Decision:
    """The gate's verdict on a challenger against its baseline (the champion, or BC), with why."""

    promote: bool
    challenger: Score
    baseline: Score
    margin: float
    alpha: float
    p_value: float
    reason: str
    test: str = "unpaired"  # "paired": the exact McNemar test on the same episodes

    @property
    def difference(self) -> float:
        return self.challenger.rate - self.baseline.rate

    def tags(self) -> dict[str, str]:
        """What the challenger's model version records about the decision."""
        return {
            "promotion.decision": "promoted" if self.promote else "rejected",
            "promotion.baseline": self.baseline.label,
            "promotion.p_value": f"{self.p_value:.6g}",
            "promotion.test": self.test,
            "promotion.reason": self.reason,
            "promotion.challenger_rate": f"{self.challenger.rate:.6g}",
            "promotion.baseline_rate": f"{self.baseline.rate:.6g}",
        }

    def metrics(self) -> dict[str, float]:
        """The decision as MLflow metrics, for a run that wants to log it."""
        return {
            "promotion_promoted": float(self.promote),
            "promotion_p_value": self.p_value,
            "promotion_challenger_rate": self.challenger.rate,
            "promotion_baseline_rate": self.baseline.rate,
            "promotion_difference": self.difference,
        }


def _beats_by_more_than(challenger: Score, baseline: Score, margin: float) -> bool:
    """challenger.rate - baseline.rate > margin, exactly: in floats 30/40 - 18/40 exceeds a margin
    of 0.3 by rounding. The margin is taken as the decimal it was written as."""
    difference = Fraction(challenger.successes, challenger.episodes) - Fraction(baseline.successes, baseline.episodes)
    return difference > Fraction(repr(float(margin)))


def significance(challenger: Score, baseline: Score) -> tuple[str, float]:
    """Which one-sided test compares the two scores, and its p-value: paired when both know their
    outcomes, episode by episode (module docstring)."""
    if challenger.outcomes is not None and baseline.outcomes is not None:
        return "paired", paired_p_value(challenger.outcomes, baseline.outcomes)
    p_value = one_sided_p_value(challenger.successes, challenger.episodes, baseline.successes, baseline.episodes)
    return "unpaired", p_value


def strongest_p_value(baseline: Score, paired: bool) -> float:
    """The smallest p-value any challenger could get against `baseline` on its evaluation set: one
    that wins every episode, those the baseline lost included (`paired`: by the exact McNemar test,
    whose evidence is only those episodes, so 1/2 to the power of their number). Where it is not
    below alpha, the set is too small to show that anything beats the baseline."""
    if paired:
        lost = baseline.episodes - baseline.successes
        return paired_p_value("1" * lost, "0" * lost)
    return one_sided_p_value(baseline.episodes, baseline.episodes, baseline.successes, baseline.episodes)


def decide(challenger: Score, baseline: Score, config: PromotionConfig) -> Decision:
    """Promote iff the challenger's rate beats the baseline's by more than the margin (a tie never
    wins) and the one-sided test is significant (p < alpha)."""
    if challenger.eval_set != baseline.eval_set:
        raise PromotionError(
            f"challenger {challenger.label} was evaluated on eval set {challenger.eval_set} "
            f"but {baseline.label} on {baseline.eval_set}: success rates are comparable only "
            "on the same frozen held-out set (games, evaluation settings and seed)"
        )
    test_name, p_value = significance(challenger, baseline)
    better = _beats_by_more_than(challenger, baseline, config.margin)
    significant = p_value < config.alpha
    compared = (
        f"challenger {challenger.label} {challenger} vs {_baseline_name(baseline)} {baseline}: "
        f"difference {_points(challenger.rate - baseline.rate)}"
    )
    test = f"{test_name} p={p_value:.3g}"
    if not better:
        reason = f"{compared} is not above margin {_points(config.margin)} ({test})"
    elif not significant:
        reason = f"{compared} > margin {_points(config.margin)} but not significant: {test} >= alpha {config.alpha:g}"
    else:
        reason = f"{compared} > margin {_points(config.margin)}, {test} < alpha {config.alpha:g}"
    strongest = strongest_p_value(baseline, paired=test_name == "paired")
    if strongest >= config.alpha:
        lost = baseline.episodes - baseline.successes
        reason += (
            f"; no challenger can pass on this set: {_baseline_name(baseline)} lost {lost} of its "
            f"{baseline.episodes} episodes, so even winning all of them gives p={strongest:.3g}; "
            "evaluate on more held-out games (evaluation.games, games.test_count)"
        )
    return Decision(
        promote=better and significant,
        challenger=challenger,
        baseline=baseline,
        margin=config.margin,
        alpha=config.alpha,
        p_value=p_value,
        reason=reason,
        test=test_name,
    )


# Registry side ---------------------------------------------------------------------------------


def _uri(version) -> str:
    return f"models:/{version.name}/{version.version}"


def _int_tags(version, keys: tuple[str, ...]) -> tuple[str, int, int]:
    """The eval set and the two counts named by `keys`, from `version`'s tags."""
    for key in keys:
        if key not in version.tags:
            raise PromotionError(
                f"{_uri(version)} has no tag '{key}': it was not registered by the pipeline "
                f"(dreamgym run), which tags each policy version with {', '.join(keys)}"
            )
    eval_set, successes, episodes = (version.tags[key] for key in keys)
    try:
        return eval_set, int(successes), int(episodes)
    except ValueError:
        raise PromotionError(
            f"{_uri(version)}: tags {keys[1]}={successes!r} and {keys[2]}={episodes!r} must be whole numbers"
        ) from None


def version_score(version) -> Score:
    """A registered policy version's own held-out score, from its tags (see the module docstring)."""
    eval_set, successes, episodes = _int_tags(version, EVAL_TAGS)
    return Score(_uri(version), successes, episodes, eval_set, version.tags.get(EVAL_OUTCOMES_TAG))


def bc_score(version) -> Score:
    """The score of the BC policy `version` started from, on the version's evaluation set."""
    eval_set, successes, episodes = _int_tags(version, BC_TAGS)
    return Score(BC_LABEL, successes, episodes, eval_set, version.tags.get(BC_OUTCOMES_TAG))


def evaluation_tags(policy: dict, bc: dict) -> dict[str, str]:
    """The tags `version_score` and `bc_score` read, from the evaluation summaries
    (`dreamgym.evaluation.summarize`) of a version and of its BC policy: the counts, and the
    outcomes when a summary has them and they fit in a tag. The caller adds `eval_set`."""
    tags = {}
    for summary, (_, successes_tag, episodes_tag), outcomes_tag in (
        (policy, EVAL_TAGS, EVAL_OUTCOMES_TAG),
        (bc, BC_TAGS, BC_OUTCOMES_TAG),
    ):
        tags |= {successes_tag: str(summary["wins"]), episodes_tag: str(summary["episodes"])}
        outcomes = summary.get("outcomes")
        if outcomes is not None and len(outcomes) <= MAX_OUTCOMES:
            tags[outcomes_tag] = outcomes
    return tags


def _client():
    import mlflow  # slow import

    return mlflow.MlflowClient()


def _registered_model(client, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    return None


def alias_version(name: str, alias: str) -> str | None:
    """The version of `name` that `alias` points at; None when the model or the alias does not exist."""
    model = _registered_model(_client(), name)
    version = None if model is None else model.aliases.get(alias)
    return None if version is None else str(version)


def set_challenger(name: str, version: str) -> None:
    """Point the `challenger` alias at `version`: the pipeline's newest candidate for `gate`."""
    _client().set_registered_model_alias(name, CHALLENGER_ALIAS, str(version))


def crown_first(name: str, version: str) -> bool:
    """Make `version` the champion when `name` has none yet, and say whether it did. The pipeline
    crowns its BC policy so: `models:/name@champion` resolves after every run, and a challenger is
    then measured against that champion, which is BC until something beats it."""
    if alias_version(name, CHAMPION_ALIAS) is not None:
        return False
    _client().set_registered_model_alias(name, CHAMPION_ALIAS, str(version))
    return True


def _model_version(client, name: str, version: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(name, str(version))
    except MlflowException as error:
        raise PromotionError(
            f"no version {version} of registered model {name!r} ({error.message}); "
            "run the pipeline (dreamgym run) to register one"
        ) from None


def _champion_score(champion, eval_set: str, evaluate: Callable[[str], Score] | None) -> Score:
    """The champion's score on `eval_set`: its own tags if it was measured there, else measured again."""
    if champion.tags.get("eval_set") == eval_set:
        return version_score(champion)
    if evaluate is None:
        raise PromotionError(
            f"champion {_uri(champion)} was evaluated on eval set "
            f"{champion.tags.get('eval_set', '(none)')}, not the challenger's {eval_set}; "
            "it must be evaluated again on the current held-out games (dreamgym promote "
            "does this)"
        )
    return evaluate(_uri(champion))


def _already_champion(challenger: Score, config: PromotionConfig) -> Decision:
    return Decision(
        promote=False,
        challenger=challenger,
        baseline=challenger,
        margin=config.margin,
        alpha=config.alpha,
        p_value=1.0,
        reason=f"challenger {challenger.label} is already the champion; nothing to do",
    )


def gate(
    name: str,
    challenger_version: str,
    config: PromotionConfig,
    *,
    evaluate: Callable[[str], Score] | None = None,
    dry_run: bool = False,
) -> Decision:
    """Decide whether `challenger_version` of `name` replaces the champion; see the module docstring.

    `evaluate(models:/name/version)` measures a policy on the challenger's evaluation set; it is
    only called for a champion measured on another set. Unless `dry_run`, the decision's tags go
    onto the challenger's version and a promoted challenger gets the `champion` alias. A
    challenger that is already champion is left as it is (its tags keep the decision that
    promoted it).
    """
    client = _client()
    challenger_mv = _model_version(client, name, challenger_version)
    challenger = version_score(challenger_mv)
    champion_version = alias_version(name, CHAMPION_ALIAS)
    if champion_version == str(challenger_mv.version):
        return _already_champion(challenger, config)
    baseline = (
        bc_score(challenger_mv)
        if champion_version is None
        else _champion_score(_model_version(client, name, champion_version), challenger.eval_set, evaluate)
    )
    decision = decide(challenger, baseline, config)
    if not dry_run:
        for key, value in decision.tags().items():
            client.set_model_version_tag(name, str(challenger_mv.version), key, value)
        if decision.promote:
            client.set_registered_model_alias(name, CHAMPION_ALIAS, str(challenger_mv.version))
    return decision


# Measuring a policy on the current held-out set --------------------------------------------------


def held_out_evaluator(config: PipelineConfig, project_dir: str | Path) -> Callable[[str], Score]:
    """`gate`'s `evaluate`: play a registered policy on the current held-out games, greedy or
    seeded as `evaluation` says, and return its Score there. Nothing is loaded until it is called."""

    def evaluate(reference: str) -> Score:
        from dreamgym.envs.textworld.games import target_folder
        from dreamgym.evaluation import current_eval_set, evaluate_held_out, held_out_games
        from dreamgym.ops.registry import resolve_model
        from dreamgym.policy.model import load_policy

        # The gate's held-out games: those of games.target (`test-headroom` for the headroom preset).
        games_dir = Path(project_dir) / config.paths.data_dir / "games" / target_folder("test", config.games)
        games = held_out_games(config, games_dir)
        policy_dir, label = resolve_model(reference, Path(project_dir) / config.paths.run_dir / "models")
        report = evaluate_held_out(load_policy(policy_dir, config.policy), games, config)
        summary = report.summary
        return Score(label, summary["wins"], summary["episodes"], current_eval_set(config, games), summary["outcomes"])

    return evaluate


def promote_version(
    config: PipelineConfig, project_dir: str | Path, version: str | None, dry_run: bool = False
) -> Decision:
    """`dreamgym promote`: the gate for policy `version` (default: the challenger), measured on the
    current held-out games as the pipeline's gate measures it (`held_out_evaluator`). Call after
    `configure_services`."""
    version = version or alias_version(POLICY_MODEL_NAME, CHALLENGER_ALIAS)
    if version is None:
        raise DreamgymError("no challenger; run the pipeline (dreamgym run) first")
    evaluate = held_out_evaluator(config, project_dir)
    return gate(POLICY_MODEL_NAME, version, config.promotion, evaluate=evaluate, dry_run=dry_run)


def describe(decision: Decision, dry_run: bool = False) -> str:
    """The line `dreamgym promote` prints."""
    verdict = "promoted to champion" if decision.promote else "not promoted"
    return f"{verdict}: {decision.reason}" + (" (dry run: nothing changed)" if dry_run else "")
