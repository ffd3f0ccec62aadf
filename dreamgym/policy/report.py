"""Figures of policy learning: learning curves of an RL run, and success rates side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dreamgym.plots import new_figure, save_figure

CURVES = (
    ("return_mean", "episode return"),
    ("success_rate", "success rate (rollouts)"),
    ("kl", "KL to reference"),
    ("entropy", "policy entropy (nats)"),
    ("loss", "loss"),
    ("curriculum_entropy", "curriculum entropy (bits)"),
)


def plot_learning_curves(history: Sequence[Mapping[str, float]], path: str | Path, title: str) -> Path:
    """One panel per metric of `CURVES`, over RL epochs."""
    figure, _ = new_figure(11, 6)
    figure.clear()
    for index, (key, label) in enumerate(CURVES, start=1):
        axes = figure.add_subplot(2, 3, index)
        points = [(row["epoch"], row[key]) for row in history if key in row]
        if points:
            axes.plot(*zip(*points), "o-", markersize=3)
        axes.set(title=label, xlabel="epoch")
        axes.grid(alpha=0.3)
    figure.suptitle(title)
    return save_figure(figure, path)


def plot_success(rows: Sequence[Mapping], path: str | Path, title: str) -> Path:
    """Success rate with its 95% interval per policy (`rows`: name, success_rate, ci95)."""
    figure, axes = new_figure(7, 4)
    names = [row["name"] for row in rows]
    rates = [row["success_rate"] for row in rows]
    errors = [
        [rate - row["ci95"][0] for rate, row in zip(rates, rows)],
        [row["ci95"][1] - rate for rate, row in zip(rates, rows)],
    ]
    axes.bar(names, rates, yerr=errors, capsize=6, color="#4c72b0")
    for x, rate in enumerate(rates):
        axes.text(x, rate + 0.02, f"{rate:.0%}", ha="center")
    axes.set(ylim=(0, 1.05), ylabel="success rate (held-out games)", title=title)
    axes.grid(axis="y", alpha=0.3)
    return save_figure(figure, path)
