"""The ingest flow end to end: real games, real collection, GX validation, DVC, MLflow, Prefect."""

import dataclasses
import itertools
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from dreamgym.config import load_config
from dreamgym.data.schema import read_transitions
from dreamgym.data.versioning import read_version
from dreamgym.envs.textworld.games import HEADROOM, spec_of
from dreamgym.errors import DreamgymError

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "games.train_count": 3,
    "games.test_count": 1,
    "games.task_count": 1,
    # A headroom game's episodes run to env.max_steps, the tiny games' to ~10 steps: with one, the
    # flows' tests would train on far more data and the suite outrun its 15 minutes (944 s). The
    # ingest test makes one (HARD_GAME).
    "games.target_train_count": 0,
    "collect.episodes_per_game": 3,
    "env.max_steps": 30,
}
HARD_GAME = {"games.target_train_count": 1}


def make_project(root: Path, games: dict[str, list[Path]]) -> Path:
    """A project checkout (its parameter file, DVC stages and the code they depend on) with the
    session's games already in place (`project_games`: same seed and settings)."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    for name in ("dvc.yaml", "params.yaml", ".dvcignore"):
        shutil.copy(ROOT / name, root / name)
    for package in ("dreamgym", "flows"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    for folder, paths in games.items():
        target = root / "data" / "games" / folder
        target.mkdir(parents=True)
        for game in paths:
            for suffix in (".z8", ".json", ".ni"):
                shutil.copy(game.with_suffix(suffix), target)
    return root


@pytest.fixture
def project(tmp_path, project_games) -> Path:
    return make_project(tmp_path, project_games)


def _runs(experiment: str):
    experiment_id = mlflow.get_experiment_by_name(experiment).experiment_id
    return MlflowClient().search_runs([experiment_id], order_by=["attributes.start_time ASC"])


def test_ingest_logs_lineage_and_a_rerun_reuses_everything(project, prefect_server, mlflow_tracking):
    from flows.ingest import ingest

    config = load_config(ROOT / "params.yaml", {**TINY, **HARD_GAME})
    games = sorted((project / "data" / "games").rglob("*.z8"))
    mtimes = {game: game.stat().st_mtime_ns for game in games}

    first = ingest(config, str(project))
    version = read_version(project)
    assert first.data_md5 == version.md5 and first.data_changed
    # the 3 training games and 1 of the headroom preset (games.target_train_count), made after the task game
    assert (first.train_games, first.test_games, first.task_games) == (3 + 1, 1, 1)
    # 3 behaviour-policy episodes and 1 with a mistake (collect.mistake_episodes) per game
    assert first.collection.trajectories == 4 * (3 + 1) and not first.collection.reused
    played = {spec_of(name) for name in read_transitions(first.collection.path).column("task_id").to_pylist()}
    [hard] = [spec for spec in played if spec.seed == 3 + 1]  # game 4: after the training games and the task game
    assert (hard.recipe, hard.take, hard.go) in itertools.product(*HEADROOM.values())
    assert 0.0 < first.collection.success_rate <= 1.0
    assert first.validation.passed and first.validation.quarantined_rows == 0
    transitions = first.collection.transitions
    assert (first.buffer.inserted, first.buffer.skipped) == (transitions, 0)

    [run] = _runs(config.experiment)
    assert run.info.status == "FINISHED" and run.info.run_id == first.mlflow_run_id
    assert run.data.params["collect.epsilon"] == "0.3" and run.data.params["games.train_count"] == "3"
    assert run.data.tags["dreamgym.data_md5"] == version.md5
    assert run.data.metrics["collect_transitions"] == first.collection.transitions
    assert run.data.metrics["validation_bad_fraction"] == 0.0
    assert run.data.metrics["buffer_inserted"] == transitions
    [dataset_input] = run.inputs.dataset_inputs
    assert dataset_input.dataset.digest == version.md5
    assert dataset_input.dataset.name == "offline-transitions"
    artifacts = {item.path for item in MlflowClient().list_artifacts(run.info.run_id, "validation")}
    assert artifacts == {"validation/report.json", "validation/quarantine.parquet", "validation/dataset_overview.png"}

    # The flow recorded the dvc.yaml stage it ran: DVC sees nothing to redo.
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "validate"], cwd=project, capture_output=True, text=True, check=True
    )
    assert "Data and pipelines are up to date" in status.stdout, status.stdout
    lock = (project / "dvc.lock").read_text()

    # An unchanged re-run is a cache hit: the first result, nothing redone, and it says so rather
    # than presenting the first run's inserted rows and new data version as its own.
    second = ingest(config, str(project))
    assert (project / "dvc.lock").read_text() == lock, "an unchanged re-run changed dvc.lock"
    assert {game: game.stat().st_mtime_ns for game in games} == mtimes, "games were regenerated"
    assert first.cached_stages == [] and first.data_changed and not first.buffer_cached
    assert second.cached_stages == ["collect-trajectories", "validate-trajectories", "version-data", "upsert-buffer"]
    assert not second.data_changed and second.buffer == first.buffer and second.buffer_cached
    unchanged = {"mlflow_run_id": "", "cached_stages": [], "data_changed": False, "buffer_cached": False}
    assert dataclasses.replace(second, **unchanged) == dataclasses.replace(first, **unchanged)

    # Recomputed (cache ignored, `dreamgym run --refresh`): every step finds its work done.
    from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

    with temporary_settings({PREFECT_TASKS_REFRESH_CACHE: True}):
        third = ingest(config, str(project))
    assert (project / "dvc.lock").read_text() == lock
    assert {game: game.stat().st_mtime_ns for game in games} == mtimes, "games were regenerated"
    assert third.collection.reused
    assert third.collection.transitions == first.collection.transitions
    assert (third.data_md5, third.data_changed) == (first.data_md5, False)
    assert (third.buffer.inserted, third.buffer.skipped) == (0, transitions)
    assert len(_runs(config.experiment)) == 3


def test_failed_validation_stops_before_versioning(project, prefect_server, mlflow_tracking):
    from flows.ingest import ingest

    # Every state is longer than this, so every row is quarantined.
    config = load_config(ROOT / "params.yaml", {**TINY, "validation.max_text_chars": 16})
    with pytest.raises(DreamgymError, match=r"validation failed: 100\.0% of rows quarantined"):
        ingest(config, str(project))
    assert read_version(project) is None, "data that failed validation must not be versioned"
    [run] = _runs(config.experiment)
    assert run.info.status == "FAILED"
    assert run.data.metrics["validation_bad_fraction"] == 1.0
    quarantine = project / "outputs" / "validation" / "quarantine.parquet"
    assert quarantine.is_file()


# The tiny experience and policy flows of the flow tests. What those flows make, measure and register
# is checked on test_pipeline.py's finished run (its stages are these flows).
TINY_EXPERIENCE = {
    "experience.vocab_size": 512,
    "experience.hidden_size": 64,
    "experience.layers": 2,
    "experience.heads": 2,
    "experience.max_length": 768,
    "experience.epochs": 1.0,
    "experience.neighbours": 2,
    "experience.max_new_tokens": 32,
    "experience.retries": 0,
    "experience.eval_games": 1,
    "experience.multi_step": 2,
    "experience.variations_per_task": 1,
}

TINY_POLICY_FLOW = {
    "policy.vocab_size": 400,
    "policy.hidden_size": 32,
    "policy.layers": 1,
    "policy.heads": 2,
    "policy.max_length": 512,
    "policy.epochs": 1.0,
    "rl.epochs": 1,
    "rl.group_size": 2,
    "rl.max_steps": 2,
    "curriculum.tasks_per_epoch": 2,
    "evaluation.games": 1,
    "evaluation.max_steps": 5,
}


def test_examples_are_keyed_on_what_shapes_a_prompt(monkeypatch):

    import flows.train_experience as flow
    from dreamgym.experience.config import ExperienceConfig

    config = ExperienceConfig()
    key = flow.examples_key("md5", config, "encoder")
    assert flow.examples_key("md5", dataclasses.replace(config, epochs=9.0), "encoder") == key
    others = [
        flow.examples_key("md5-other", config, "encoder"),
        flow.examples_key("md5", dataclasses.replace(config, history=0), "encoder"),
        flow.examples_key("md5", dataclasses.replace(config, reasoning=False), "encoder"),
        flow.examples_key("md5", dataclasses.replace(config, placeholders=False), "encoder"),
        flow.examples_key(
            "md5", dataclasses.replace(config, annotator="openai", annotator_url="u", annotator_model="m"), "encoder"
        ),
        flow.examples_key("md5", dataclasses.replace(config, variations_per_task=0), "encoder"),
        flow.examples_key("md5", dataclasses.replace(config, synthetic_neighbours=True), "encoder"),
        flow.examples_key("md5", config, "another-encoder"),
    ]
    monkeypatch.setattr(flow, "FORMAT_VERSION", flow.FORMAT_VERSION + 1)
    others.append(flow.examples_key("md5", config, "encoder"))
    assert len({key, *others}) == 10
    # Settings for using a model, not training it, never train a new one.
    from dreamgym.config import PipelineConfig

    pipeline = PipelineConfig()
    served = dataclasses.replace(
        pipeline,
        experience=dataclasses.replace(
            pipeline.experience,
            max_new_tokens=100,
            backend="http",
            backend_url="http://gpu:8000/v1",
            backend_model="m",
            synthetic_neighbours=True,
            constrained_decoding=False,
        ),
    )
    assert flow._training_key(served) == flow._training_key(pipeline)
