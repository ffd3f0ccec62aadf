"""What the benchmarks share: the configured project, its model and validated data, KEY=VALUE
settings, greedy wins per folder of games, the machine."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dreamgym.config import PipelineConfig, load_config
from dreamgym.ops.benchmark import machine  # noqa: F401 - the benchmarks' machine record
from dreamgym.ops.registry import resolve_model
from dreamgym.ops.tracking import configure_services


@dataclass(frozen=True)
class Setup:
    config: PipelineConfig
    project: Path
    run_dir: Path
    model_dir: Path
    model_label: str

    def training_rows(self) -> list[dict]:
        """The transitions the project's pipeline collected on its training games (the model's data)."""
        from dreamgym.data.schema import read_transitions

        path = self.project / self.config.paths.data_dir / "trajectories" / "offline.parquet"
        return read_transitions(path).to_pylist()


def model_setup(params: Path, model: str, overrides: dict | None = None) -> Setup:
    """The configuration in `params` (with `overrides`, dotted keys as `load_config` takes them),
    its embedded services, and the model `model` refers to."""
    config = load_config(params, overrides)
    project = params.resolve().parent
    run_dir = project / config.paths.run_dir
    configure_services(run_dir)
    model_dir, label = resolve_model(model, run_dir / "models")
    return Setup(config, project, run_dir, Path(model_dir), label)


def parse_settings(settings: Sequence[str]) -> dict:
    """KEY=VALUE arguments (JSON values) as `load_config` overrides: ["rl.epochs=2"] -> {"rl.epochs": 2}."""
    return {key: json.loads(value) for key, value in (setting.split("=", 1) for setting in settings)}


def validated_rows(config: PipelineConfig, project: Path) -> list[dict]:
    """The transitions the project's ingest validated (what BC and the experience model learn from)."""
    from dreamgym.data.schema import read_transitions

    path = project / config.paths.outputs_dir / "validation" / "validated.parquet"
    if not path.is_file():
        raise SystemExit(f"{path}: no validated data; run the pipeline's ingest first (`dreamgym run`)")
    return read_transitions(path).to_pylist()


def greedy_wins(policy, folders: Sequence[Path], config: PipelineConfig) -> tuple[dict, dict]:
    """Every game of each folder played once, greedily: wins ("12/40") and mean return, by folder name."""
    from dreamgym.envs.real import list_games
    from dreamgym.evaluation import evaluate_policy

    wins, returns = {}, {}
    for folder in folders:
        summary = evaluate_policy(
            policy, list_games(folder), 1, config.seed, config.evaluation.max_steps, greedy=True
        ).summary
        wins[folder.name] = f"{summary['wins']}/{summary['episodes']}"
        returns[folder.name] = round(summary["mean_return"], 3)
    return wins, returns
