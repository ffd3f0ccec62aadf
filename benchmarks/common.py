"""What the experience-model benchmarks share: the configured project, the model, the machine."""

from __future__ import annotations

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
