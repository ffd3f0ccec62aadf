"""The paper's three regimes and ablations on our environment: the rows of `dreamgym bench`, the
check of its claims, and the table and figure of a run.

Every row is one configuration of the same pipeline (same offline data, same held-out games, same
BC start): BC alone; GRPO / PPO in the real games with a budget of N real transitions, and GRPO
with 10N (the ceiling DreamGym is read against); GRPO / PPO only in DreamEnv (no online real
transitions, a synthetic budget of 10N); DreamGym followed by real RL with N/10 (sim-to-real);
and DreamGym with one part switched off (retrieval, history, reasoning, curriculum).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from dreamgym.errors import DreamgymError
from dreamgym.ops.config import BenchConfig
from dreamgym.plots import new_figure, save_figure

BC = "bc"
DREAMGYM = "dreamgym-grpo"
REAL = "real-grpo"
REAL_10N = "real-grpo-10n"  # the ceiling DreamGym's rows are read against
S2R = "dreamgym-s2r-grpo"
ABLATIONS = ("no-retrieval", "no-history", "no-reasoning", "no-curriculum")
UNTIL_BUDGET = 10_000  # epochs of an RL row: more than any budget needs


@dataclass(frozen=True)
class BenchRow:
    """One configuration to train and evaluate: `overrides` are dotted params.yaml keys."""

    name: str
    overrides: dict = field(default_factory=dict)


def machine() -> dict:
    """What a measurement ran on."""
    import torch  # slow import

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def dream_budget(real_budget: int, synthetic_budget: int | None = None) -> int:
    """The synthetic transitions of each dream row: `synthetic_budget`, else real RL's ceiling, 10N."""
    return synthetic_budget or 10 * real_budget


def bench_plan(
    real_budget: int, names: Sequence[str] | None = None, synthetic_budget: int | None = None
) -> list[BenchRow]:
    """The rows, in table order; `names` picks some (BC is measured by every policy run). The dream
    rows take `synthetic_budget` synthetic transitions, by default 10N: real RL's ceiling."""
    if real_budget < 10:
        raise DreamgymError(
            f"--real-budget {real_budget}: need at least 10 real transitions (sim-to-real gets a tenth of them)"
        )
    if synthetic_budget is not None and synthetic_budget < 1:
        raise DreamgymError(f"--synthetic-budget {synthetic_budget}: give at least 1 (default: 10 x --real-budget)")
    # Every RL row runs until its budget is spent: the budget, not the epoch count, ends it. The
    # dream's is synthetic (the cheap resource), as large as real RL's ceiling at 10N.
    dream = {
        "rl.env": "dream",
        "rl.s2r_budget": 0,
        "rl.synthetic_budget": dream_budget(real_budget, synthetic_budget),
        "rl.epochs": UNTIL_BUDGET,
    }
    real = {
        "rl.env": "real",
        "rl.real_budget": real_budget,
        "rl.s2r_budget": 0,
        "rl.synthetic_budget": 0,
        "rl.epochs": UNTIL_BUDGET,
    }
    rows = [
        BenchRow(BC, {**dream, "rl.algorithm": "grpo"}),
        BenchRow(REAL, {**real, "rl.algorithm": "grpo"}),
        BenchRow(REAL_10N, {**real, "rl.algorithm": "grpo", "rl.real_budget": 10 * real_budget}),
        BenchRow("real-ppo", {**real, "rl.algorithm": "ppo"}),
        BenchRow(DREAMGYM, {**dream, "rl.algorithm": "grpo"}),
        BenchRow("dreamgym-ppo", {**dream, "rl.algorithm": "ppo"}),
        BenchRow(S2R, {**dream, "rl.algorithm": "grpo", "rl.s2r_budget": real_budget // 10}),
        BenchRow("no-retrieval", {**dream, "rl.algorithm": "grpo", "experience.neighbours": 0}),
        BenchRow("no-history", {**dream, "rl.algorithm": "grpo", "experience.history": 0}),
        BenchRow("no-reasoning", {**dream, "rl.algorithm": "grpo", "experience.reasoning": False}),
        BenchRow("no-curriculum", {**dream, "rl.algorithm": "grpo", "curriculum.enabled": False}),
    ]
    if names is None:
        return rows
    known = {row.name for row in rows}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise DreamgymError(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    return [row for row in rows if row.name in names]


def row_result(name: str, seed: int, policy: Mapping, wall_seconds: float) -> dict:
    """A row's figures from the policy flow's summary: BC's evaluation for the `bc` row, else the
    trained policy's; real and synthetic transitions are those its training consumed.

    `train_seconds` is the training's own time, kept with the model; `wall_seconds` is this call's.
    A row whose policy was `reused` (trained earlier: by an interrupted bench in the same project,
    or by another row of this one, as DreamGym's by the `bc` row) has a short wall time: its
    training time is the one to read."""
    evaluations = {e["name"]: e for e in policy["evaluations"]}
    rl = policy["rl"]
    if name == BC:
        evaluation = evaluations["bc"]
        used = {
            "real_transitions": 0,
            "synthetic_transitions": 0,
            "recalled_transitions": 0,
            "train_seconds": policy["bc"]["seconds"],
            "reused": policy["bc"]["reused"],
            "history": [],
        }
    else:
        evaluation = evaluations["dreamgym"]
        used = {
            "real_transitions": rl["real_transitions"],
            "synthetic_transitions": rl["synthetic_transitions"],
            "recalled_transitions": rl.get("recalled_transitions", 0),
            "train_seconds": rl["seconds"] + rl.get("s2r_seconds", 0.0),
            "reused": rl["reused"],
            "history": rl.get("history", []),
        }
    return {
        "name": name,
        "seed": seed,
        "success_rate": evaluation["success_rate"],
        "ci95": evaluation["ci95"],
        "wins": evaluation["wins"],
        "episodes": evaluation["episodes"],
        "mean_return": evaluation["mean_return"],
        "eval_real_transitions": evaluation["real_transitions"],
        **used,
        "wall_seconds": wall_seconds,
        "policy_dir": evaluation["policy_dir"],
        "mlflow_run_id": policy["mlflow_run_id"],
    }


def _mean(rows: Sequence[Mapping], name: str, key: str) -> float | None:
    """The mean of `key` over the rows (seeds) of `name` that have it; None if none has."""
    values = [row[key] for row in rows if row["name"] == name and row.get(key) is not None]
    return sum(values) / len(values) if values else None


def check_targets(rows: Sequence[Mapping], goals: BenchConfig | None = None) -> list[dict]:
    """The benchmark's targets (`goals`, the preset's `bench` section: by default issue 70's headroom
    benchmark) and the paper's claims in kind, against the measured rows, means over seeds: each
    with an `id`, what it says, the numbers it compared and whether it holds. Targets whose rows
    were not run, or that the preset does not set, are left out."""
    goals = goals or BenchConfig()
    rate = {name: _mean(rows, name, "success_rate") for name in {row["name"] for row in rows}}
    with_lower = [row | {"lower": row["ci95"][0]} for row in rows]
    lower = {name: _mean(with_lower, name, "lower") for name in rate}
    targets = []

    def target(key: str, says: str, holds: bool, numbers: str) -> None:
        targets.append({"id": key, "target": says, "holds": bool(holds), "numbers": numbers})

    if BC in rate and goals.bc_at_most is not None:
        target(
            "room",
            f"BC <= {goals.bc_at_most:.0%} held-out: there is room to learn",
            rate[BC] <= goals.bc_at_most,
            f"bc {rate[BC]:.3f}",
        )
    if BC in rate and goals.bc_at_least is not None:
        target(
            "bc-acts",
            f"BC >= {goals.bc_at_least:.0%} held-out: the agent acts",
            rate[BC] >= goals.bc_at_least,
            f"bc {rate[BC]:.3f}",
        )
    for name, key, says, gain in (
        (REAL_10N, "rl-works", "real-env GRPO at 10N >= BC{} (RL works)", goals.real_gain),
        (DREAMGYM, "dream-gain", "DreamGym (0 real transitions) >= BC{}", goals.dream_gain),
    ):
        if name in rate and BC in rate and gain is not None:
            points = f" {'+' if gain > 0 else '-'} {abs(gain) * 100:.0f} points" if gain else ""
            target(
                key,
                says.format(points),
                rate[name] >= rate[BC] + gain,
                f"{name} {rate[name]:.3f} vs bc {rate[BC]:.3f}",
            )
    if DREAMGYM in rate and REAL in rate:
        target(
            "dream-vs-real",
            "DreamGym (0 real transitions) >= real-env GRPO at N",
            rate[DREAMGYM] >= rate[REAL],
            f"dreamgym {rate[DREAMGYM]:.3f} vs real {rate[REAL]:.3f}",
        )
    if S2R in rate and REAL in rate and REAL_10N in rate:
        target(
            "s2r",
            "DreamGym-S2R (N/10 real) > real-env GRPO at N, and within the interval of real GRPO at 10N",
            rate[S2R] > rate[REAL] and rate[S2R] >= lower[REAL_10N],
            f"s2r {rate[S2R]:.3f}, real at N {rate[REAL]:.3f}, real at 10N {rate[REAL_10N]:.3f} "
            f"(CI lower {lower[REAL_10N]:.3f})",
        )
    fidelity = {name: _mean(rows, name, "experience_fidelity") for name in rate}
    for ablation in ABLATIONS:
        if ablation not in rate or DREAMGYM not in rate:
            continue
        numbers = f"{ablation} {rate[ablation]:.3f} vs dreamgym {rate[DREAMGYM]:.3f}"
        if ablation == "no-curriculum":  # the curriculum changes no model: only success can show it
            target(
                ablation, "no-curriculum >= 3 points below DreamGym", rate[ablation] <= rate[DREAMGYM] - 0.03, numbers
            )
            continue
        less_faithful = fidelity[ablation] is not None and fidelity[DREAMGYM] is not None
        if less_faithful:
            numbers += f"; next-state exact match {fidelity[ablation]:.3f} vs {fidelity[DREAMGYM]:.3f}"
            less_faithful = fidelity[ablation] < fidelity[DREAMGYM]
        target(
            ablation,
            f"{ablation} lowers DreamGym's success rate or its experience-model fidelity",
            rate[ablation] < rate[DREAMGYM] or less_faithful,
            numbers,
        )
    return targets


def markdown(rows: Sequence[Mapping], targets: Sequence[Mapping]) -> str:
    lines = [
        "| row | seed | success (95% CI) | mean return | real transitions | synthetic transitions (recalled) | "
        "train time | wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lo, hi = row["ci95"]
        lines.append(
            f"| {row['name']} | {row['seed']} | {row['wins']}/{row['episodes']} = {row['success_rate']:.1%} "
            f"({lo:.1%}-{hi:.1%}) | {row['mean_return']:.2f} | {row['real_transitions']} | "
            f"{row['synthetic_transitions']} ({row.get('recalled_transitions', 0)}) | "
            f"{row['train_seconds'] / 60:.1f} min | "
            f"{row['wall_seconds'] / 60:.1f} min{' (reused)' if row.get('reused') else ''} |"
        )
    checked = [row for row in rows if any("dream_real_gap" in epoch for epoch in row.get("history", []))]
    if checked:
        lines += [
            "",
            "| row | seed | epochs | dream-vs-real gap per epoch: mean, first, last (success in the dream minus "
            "in the real games of the same tasks) |",
            "|---|---|---|---|",
        ]
        for row in checked:
            gaps = [epoch["dream_real_gap"] for epoch in row["history"] if "dream_real_gap" in epoch]
            lines.append(
                f"| {row['name']} | {row['seed']} | {len(row['history'])} | "
                f"{sum(gaps) / len(gaps):+.2f}, {gaps[0]:+.2f}, {gaps[-1]:+.2f} |"
            )
    if targets:
        lines += ["", "| target | holds | numbers |", "|---|---|---|"]
        lines += [f"| {t['target']} | {'yes' if t['holds'] else 'no'} | {t['numbers']} |" for t in targets]
    return "\n".join(lines)


def write_bench(rows: Sequence[Mapping], out: Path, goals: BenchConfig | None = None) -> tuple[list[dict], str]:
    """The rows as JSON at `out` and their table beside it (`.md`), each file replaced whole, so a
    bench stopped after hours leaves what it finished readable. Returns the targets and the table."""
    targets = check_targets(rows, goals)
    table = markdown(rows, targets)
    for path, content in ((out, json.dumps(list(rows), indent=2)), (out.with_suffix(".md"), table)):
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(content + "\n")
        partial.replace(path)
    return targets, table


# What every row of one bench shares; benches that differ in one do not pool.
SHARED_FIELDS = ("episodes", "real_budget", "synthetic_budget")


def merge_benches(benches: Mapping[str, Sequence[Mapping]]) -> list[dict]:
    """The rows of several bench files (file name -> its rows) as one bench, seed by seed: for seeds
    run apart (in another session, or on another machine) on the same held-out games. A row and
    seed found in two files, or files that differ in games played or budgets, are refused."""
    found: dict[tuple[str, int], str] = {}
    shared: dict[str, dict[str, str]] = {name: {} for name in SHARED_FIELDS}  # field -> value -> a file with it
    rows = []
    for source, bench in benches.items():
        if not isinstance(bench, list) or not all(
            isinstance(row, dict) and {"name", "seed"} <= row.keys() for row in bench
        ):
            raise DreamgymError(f"{source}: not a list of bench rows; give the JSON `dreamgym bench --json` wrote")
        for row in bench:
            key = (row["name"], row["seed"])
            if key in found:
                raise DreamgymError(
                    f"{source} and {found[key]} both hold row {row['name']} of seed {row['seed']}; "
                    "merge benches of different seeds (or leave one file out)"
                )
            found[key] = source
            for name, values in shared.items():
                values.setdefault(str(row.get(name)), source)
            rows.append(dict(row))
    if not rows:
        raise DreamgymError("the bench files hold no rows; give the JSON files `dreamgym bench --json` wrote")
    for name, values in shared.items():
        if len(values) > 1:
            listed = ", ".join(f"{value} in {source}" for value, source in values.items())
            raise DreamgymError(
                f"the benches differ in {name} ({listed}): their rows are not comparable; merge benches "
                "run with the same --held-out games and budgets"
            )
    return sorted(rows, key=lambda row: row["seed"])  # stable: each seed keeps its rows' order


def plot(rows: Sequence[Mapping], path: str | Path) -> Path:
    """Left: success on the held-out games against the real transitions training used (95% CI);
    right: the RL runs' success rate (rollouts) per epoch."""
    figure, _ = new_figure(12, 4.5)
    figure.clear()
    left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    for row in rows:
        rate, (lo, hi) = row["success_rate"], row["ci95"]
        left.errorbar(row["real_transitions"], rate, yerr=[[rate - lo], [hi - rate]], fmt="o", capsize=4)
        left.annotate(
            f"{row['name']} (s{row['seed']})",
            (row["real_transitions"], rate),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, 4),
        )
        points = [(entry["epoch"], entry["success_rate"]) for entry in row["history"] if "success_rate" in entry]
        if points:
            right.plot(*zip(*points), "o-", markersize=3, label=f"{row['name']} (s{row['seed']})")
    left.set(
        xlabel="real transitions used in training",
        ylabel="success rate (held-out games)",
        title="success vs real transitions",
        ylim=(-0.02, 1.02),
    )
    right.set(xlabel="RL epoch", ylabel="success rate (rollouts)", title="learning curves", ylim=(-0.02, 1.02))
    if right.lines:
        right.legend(fontsize=7)
    for axes in (left, right):
        axes.grid(alpha=0.3)
    return save_figure(figure, path)
