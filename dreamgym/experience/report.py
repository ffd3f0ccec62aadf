"""Fidelity results where people look: MLflow metrics, a per-example table, a JSON and a plot."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from dreamgym.experience.fidelity import FIELDS, FidelityReport, setting_table
from dreamgym.plots import new_figure, save_figure


def plot_open_loop(multi_step: list[dict], path: Path) -> Path:
    """Exact match and field F1 of the t-th open-loop prediction, t = 1..horizon."""
    steps = [entry["step"] for entry in multi_step]
    figure, axis = new_figure(6, 4)
    axis.plot(steps, [entry["exact_match"] for entry in multi_step], marker="o", label="next-state exact match")
    for name in FIELDS:
        axis.plot(steps, [entry[f"f1_{name}"] for entry in multi_step], linestyle="--", label=f"F1 {name}")
    axis.set(
        xlabel="open-loop step",
        ylabel="score",
        ylim=(0, 1.02),
        title="Experience model vs the real game, replaying real actions",
    )
    axis.legend(fontsize=8)
    return save_figure(figure, path)


def flat_metrics(summary: dict, prefix: str = "fidelity_") -> dict[str, float]:
    metrics = {f"{prefix}{key}": float(value) for key, value in summary.items() if isinstance(value, int | float)}
    metrics |= {f"{prefix}f1_{name}": value for name, value in summary["field_f1"].items()}
    if "foreseeable" in summary:
        metrics |= {f"{prefix}foreseeable_{key}": float(value) for key, value in summary["foreseeable"].items()}
    return metrics


def log_fidelity(report: FidelityReport, prefix: str = "fidelity_") -> dict:
    """Log the report to the active MLflow run; return its summary."""
    import mlflow

    mlflow.log_metrics(flat_metrics(report.summary, prefix))
    for entry in report.summary["multi_step"]:
        mlflow.log_metric(f"{prefix}open_loop_exact_match", entry["exact_match"], step=entry["step"])
    mlflow.log_table(
        {key: [record[key] for record in report.records] for key in report.records[0]},
        artifact_file=f"{prefix}examples.json",
    )
    with tempfile.TemporaryDirectory() as scratch:
        summary_path = Path(scratch) / f"{prefix}summary.json"
        summary_path.write_text(json.dumps(report.summary, indent=2))
        mlflow.log_artifact(str(summary_path), artifact_path="experience")
        if "by_setting" in report.summary:
            table_path = Path(scratch) / f"{prefix}by_setting.md"
            table_path.write_text(setting_table(report.summary["by_setting"]) + "\n")
            mlflow.log_artifact(str(table_path), artifact_path="experience")
        if report.summary["multi_step"]:
            mlflow.log_artifact(
                str(plot_open_loop(report.summary["multi_step"], Path(scratch) / f"{prefix}open_loop.png")),
                artifact_path="experience",
            )
    return report.summary
