"""Embedded defaults for the services, and small MLflow helpers.

Without configuration the pipeline runs on embedded services kept under one run directory
(`paths.run_dir`, `.dreamgym/` by default): MLflow on SQLite with its artifacts beside it, and
Prefect's temporary local server with its database in a Prefect home there. The usual environment
variables (`MLFLOW_TRACKING_URI`, `PREFECT_API_URL`, `PREFECT_HOME`) point at a team's services
instead and always win.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym.config import PipelineConfig, config_to_dict, flatten

if TYPE_CHECKING:
    import mlflow


def configure_services(run_dir: str | Path) -> dict[str, str]:
    """Set the embedded defaults for what the environment leaves unset; return the effective ones.

    Call before Prefect is imported: it reads its settings at import.
    """
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    defaults = {
        "MLFLOW_TRACKING_URI": f"sqlite:///{run_dir / 'mlflow.db'}",
        "PREFECT_HOME": str(run_dir / "prefect"),
        # No network here: telemetry would only log failures.
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # The temporary server creates its database on first start, slowly on a loaded machine.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if os.environ["MLFLOW_TRACKING_URI"] == defaults["MLFLOW_TRACKING_URI"]:
        _create_tracking_store(defaults["MLFLOW_TRACKING_URI"], run_dir)
    return {key: os.environ[key] for key in defaults}


def ui_addresses(services: dict[str, str]) -> str:
    """Where to look at the runs, as `dreamgym run` ends: a shared server shows its UI at its own
    address; the embedded stores (`services`, as `configure_services` returns them) need a UI
    started, so the command that starts one is given."""
    tracking, prefect_api = services["MLFLOW_TRACKING_URI"], os.environ.get("PREFECT_API_URL")
    mlflow_ui = tracking if tracking.startswith("http") else f"mlflow ui --backend-store-uri {tracking}"
    prefect_ui = prefect_api.removesuffix("/api") if prefect_api else None
    prefect_ui = prefect_ui or f"PREFECT_HOME={services['PREFECT_HOME']} prefect server start"
    return f"MLflow UI:  {mlflow_ui}\nPrefect UI: {prefect_ui}"


def _create_tracking_store(uri: str, run_dir: Path) -> None:
    """Create (or upgrade) the embedded MLflow store under a lock between processes.

    MLflow creates its SQLite schema on first use; two commands starting at once on a new run
    directory (a schedule and a user) both ran its migrations, and one failed with "duplicate
    column name". The first creates it under the lock; the other then finds it made. MLflow's
    INFO lines about creating tables are held back: a user's command prints its own output.
    """
    import logging

    import mlflow  # slow import
    from filelock import FileLock

    quiet = [logging.getLogger(name) for name in ("mlflow.store.db.utils", "alembic")]
    levels = [logger.level for logger in quiet]
    with FileLock(run_dir / "mlflow.db.lock"):
        try:
            for logger in quiet:
                logger.setLevel(logging.WARNING)
            mlflow.MlflowClient(uri).search_experiments(max_results=1)
        finally:
            for logger, level in zip(quiet, levels, strict=True):
                logger.setLevel(level)


def artifact_root(run_dir: str | Path) -> str | None:
    """Where a new experiment keeps artifacts: beside the SQLite store for the embedded default;
    a tracking server decides for itself."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith(("http://", "https://", "databricks")):
        return None
    return (Path(run_dir).resolve() / "mlartifacts").as_uri()


def experiment_id(name: str, run_dir: str | Path) -> str:
    """The id of the named experiment, created on first use."""
    import mlflow  # slow import
    from mlflow.exceptions import MlflowException

    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return mlflow.create_experiment(name, artifact_location=artifact_root(run_dir))
    except MlflowException as error:  # another process created it since we looked
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return mlflow.get_experiment_by_name(name).experiment_id


def git_commit(project_dir: str | Path) -> str:
    """HEAD's commit, with '-dirty' when the working tree has uncommitted changes; 'unknown'
    outside git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=project_dir, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


@contextmanager
def stage_run(
    stage: str,
    config: PipelineConfig,
    project_dir: str | Path,
    *,
    run_name: str | None = None,
    tags: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """The MLflow run of one stage, nested under the active run if there is one: in the
    configured experiment, tagged with the stage and the git commit (what `dreamgym lineage`
    reads), with `params` (default: the whole resolved config, flattened) logged."""
    import mlflow  # slow import

    project = Path(project_dir).resolve()
    mlflow.set_experiment(experiment_id=experiment_id(config.experiment, project / config.paths.run_dir))
    with mlflow.start_run(run_name=run_name or stage, nested=mlflow.active_run() is not None) as run:
        mlflow.set_tags({"dreamgym.stage": stage, "git_commit": git_commit(project), **(tags or {})})
        mlflow.log_params(flatten(config_to_dict(config)) if params is None else params)
        yield run
