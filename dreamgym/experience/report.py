"""Fidelity results where people look: MLflow metrics, a per-example table, a JSON and a plot.

`measure_fidelity` measures a model and logs the results; the pipeline's fidelity task and
`dreamgym experience eval` (`dreamgym.evaluation.evaluate_experience_model`) both call it."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dreamgym.experience.fidelity import FIELDS, FidelityReport, setting_table
from dreamgym.plots import new_figure, save_figure

if TYPE_CHECKING:
    from dreamgym.config import PipelineConfig


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


def measure_fidelity(
    model_dir: str | Path,
    real_path: str | Path,
    run_dir: str | Path,
    config: PipelineConfig,
    copy_neighbours: bool = False,
    setting_of: Callable[[str], str] | None = None,
) -> dict:
    """The fidelity of the experience model in `model_dir` (with `copy_neighbours`, of no model:
    its prompts' top neighbour's change) on the real transitions in `real_path`, per setting by
    `setting_of` (a task id's game setting), logged to the active MLflow run; its summary. One
    function for the pipeline and the CLI, so that their figures are measured alike."""
    from dreamgym.data.schema import read_transitions
    from dreamgym.experience.fidelity import evaluate
    from dreamgym.experience.generate import open_experience_model

    with open_experience_model(model_dir, run_dir, config, copy_neighbours) as experience:
        report = evaluate(
            experience.dynamics(),
            read_transitions(real_path).to_pylist(),
            config.experience.multi_step,
            progress=True,
            setting_of=setting_of,
        )
    return log_fidelity(report)


@dataclass(frozen=True)
class FidelityRun:
    """A fidelity summary (`FidelityReport.summary`) and where it was written."""

    summary: dict
    json_path: Path

    def describe(self) -> str:
        """What `dreamgym experience eval` prints: the headline, the foreseeable transitions' figures,
        and the table by game setting."""
        summary, foreseen = self.summary, self.summary["foreseeable"]
        return "\n".join(
            [
                f"next-state exact match {summary['next_state_exact_match']:.1%}, reward accuracy "
                f"{summary['reward_accuracy']:.1%}, done accuracy {summary['done_accuracy']:.1%}, "
                f"parse failures {summary['parse_failure_rate']:.1%} on {summary['transitions']} "
                f"transitions → {self.json_path}",
                f"on the {foreseen['transitions']} foreseeable ones (next state names only what the "
                f"prompt shows): exact match {foreseen['next_state_exact_match']:.1%}, reward "
                f"{foreseen['reward_accuracy']:.1%}, done {foreseen['done_accuracy']:.1%}",
                setting_table(summary["by_setting"]),
            ]
        )
