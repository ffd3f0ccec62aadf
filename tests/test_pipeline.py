"""The parent flow end to end on a tiny budget: real games, embedded Postgres, tiny models, MLflow
lineage and registry, Prefect task caching."""

import dataclasses
import datetime
import json
import py_compile
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml
from conftest import tracking_store, write_params
from mlflow.tracking import MlflowClient
from test_benchmarks import smoke_project_benchmarks
from test_ingest_flow import TINY, TINY_EXPERIENCE, TINY_POLICY_FLOW, make_project

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = {**TINY, **TINY_EXPERIENCE, **TINY_POLICY_FLOW}
# RL long enough (3 epochs of a few seconds) to be killed between two checkpoints.
KILLABLE = {**OVERRIDES, "rl.epochs": 3, "rl.max_steps": 8}


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    project: Path
    store: Path  # its MLflow store
    result: object  # flows.pipeline.pipeline's
    metrics: dict[str, float]  # of the pipeline's MLflow run, as it ended
    policy_metrics: dict[str, float]  # of its policy stage's run


@pytest.fixture(scope="module")
def finished(tmp_path_factory, project_games, prefect_server) -> FinishedRun:
    """One uninterrupted tiny run of KILLABLE's parameters (written into its params.yaml), in a
    project and an MLflow store of its own, made once: the lineage test reads it and re-runs it; a
    killed and resumed run must end as it did. (A second fresh run of the same seed cost the suite
    a minute.)"""
    from flows.pipeline import pipeline

    root = tmp_path_factory.mktemp("finished")
    project = make_project(root / "project", project_games)
    with tracking_store(root / "mlflow.db"):
        result = pipeline(str(write_params(project, KILLABLE)))
        client = MlflowClient()
        metrics = client.get_run(result.mlflow_run_id).data.metrics
        policy_metrics = client.get_run(result.policy.mlflow_run_id).data.metrics
    return FinishedRun(project, root / "mlflow.db", result, metrics, policy_metrics)


def _task_states(since: datetime.datetime) -> dict[str, set[str]]:
    """Task name → state names of the task runs of every flow run started after `since`."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterStartTime
    from prefect.client.schemas.sorting import FlowRunSort, TaskRunSort

    async def read():
        async with get_client() as client:
            flow_runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since)),
                limit=100,
                sort=FlowRunSort.START_TIME_ASC,
            )
            tasks = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id for run in flow_runs])),
                limit=200,
                sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            )
            # A sub-flow shows in its parent as a task run: not a task of ours.
            subflows = {run.parent_task_run_id for run in flow_runs}
            return [task_run for task_run in tasks if task_run.id not in subflows]

    import asyncio

    states: dict[str, set[str]] = {}
    for task_run in asyncio.run(read()):
        states.setdefault(task_run.name.rsplit("-", 1)[0], set()).add(task_run.state.name)
    return states


def _buffer_rows(project: Path) -> int:
    from sqlalchemy import text

    from dreamgym.buffer.migrations import open_migrated
    from dreamgym.config import load_config

    config = load_config(project / "params.yaml", OVERRIDES)
    with (
        open_migrated(project / config.paths.run_dir, config.buffer) as database,
        database.engine.connect() as connection,
    ):
        return connection.execute(text("SELECT count(*) FROM transitions")).scalar()


def test_pipeline_lineage_registry_and_versioned_reruns(finished):
    with tracking_store(finished.store):
        _check_lineage_registry_and_reruns(finished.project, finished.result)


def _check_lineage_registry_and_reruns(project: Path, first) -> None:
    from dreamgym.ops.lineage import lineage
    from flows.pipeline import pipeline

    params = str(project / "params.yaml")
    client = MlflowClient()

    # One parent run, a nested run per stage; each records the full config and the dataset.
    parent = client.get_run(first.mlflow_run_id)
    experiment = parent.info.experiment_id
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {run.data.tags["dreamgym.stage"] for run in children} == {
        "ingest",
        "train-experience",
        "train-policy",
        "promotion",
    }
    data_md5 = first.ingest.data_md5
    for run in [parent, *children]:
        assert run.data.params["rl.epochs"] == "3" and run.data.params["seed"] == "0", run.info.run_name
        assert [i.dataset.digest for i in run.inputs.dataset_inputs] == [data_md5], run.info.run_name
        assert run.data.tags["git_commit"]
    # RL in DreamEnv practised the task of the 1 task game (games.task_count) of the headroom preset
    # (games.target), not those of the training games, which BC learnt from.
    policy_run = next(run for run in children if run.data.tags["dreamgym.stage"] == "train-policy")
    metrics = policy_run.data.metrics
    assert metrics["rl_curriculum_tasks"] - metrics["rl_variations_accepted"] == 1
    assert "eval_bc_training_settings_success_rate" in metrics
    assert metrics["rl_real_transitions"] == 0
    assert parent.data.tags["dreamgym.experience_model"] == "models:/dreamgym-experience/1"
    # BC is registered first (version 1), the RL policy next (version 2).
    assert parent.data.tags["dreamgym.policy"] == "models:/dreamgym-policy/2"
    assert first.policy.bc_model == "models:/dreamgym-policy/1"
    assert {
        "eval_bc_success_rate",
        "eval_dreamgym_success_rate",
        "fidelity_next_state_exact_match",
        "promotion_promoted",
    } <= set(parent.data.metrics)
    root_artifacts = {item.path for item in client.list_artifacts(parent.info.run_id)}
    assert {"config", "summary.json"} <= root_artifacts
    config = json.loads(
        Path(
            mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="config/params.json")
        ).read_text()
    )
    assert config["rl"]["epochs"] == 3 and config["experience"]["hidden_size"] == 64

    _check_experience_and_policy_stages(project, first, client)

    # The new version is the challenger; the gate's decision is on its tags and in the run.
    version = client.get_model_version("dreamgym-policy", "2")
    assert "challenger" in version.aliases
    promotion = first.promotion
    assert version.tags["promotion.decision"] == ("promoted" if promotion.promoted else "rejected")
    bc = next(e for e in first.policy.evaluations if e["name"] == "bc")
    rl = next(e for e in first.policy.evaluations if e["name"] == "dreamgym")
    assert promotion.promoted == (rl["success_rate"] > bc["success_rate"] and promotion.decision.p_value < 0.05)
    assert ("champion" in version.aliases) == promotion.promoted
    # BC was the first champion: the challenger was measured against it, and the alias resolves
    # whatever the decision (BC keeps it when the RL policy does not beat it).
    assert promotion.decision.baseline.label == "models:/dreamgym-policy/1"
    assert promotion.decision.baseline.successes == bc["wins"]
    champion = client.get_model_version_by_alias("dreamgym-policy", "champion")
    assert str(champion.version) == ("2" if promotion.promoted else "1")

    # The run wrote the DVC stages' metrics and recorded them: DVC has nothing to redo, also once
    # Python has written bytecode beside the code a stage depends on (.dvcignore).
    py_compile.compile(str(project / "dreamgym" / "experience" / "rerank.py"), doraise=True)
    assert list((project / "dreamgym" / "experience" / "__pycache__").glob("rerank.*.pyc"))
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status"], cwd=project, capture_output=True, text=True, check=True
    )
    assert "Data and pipelines are up to date" in status.stdout, status.stdout
    policy_metrics = json.loads((project / "outputs" / "metrics" / "policy.json").read_text())
    assert policy_metrics["eval_dreamgym_success_rate"] == rl["success_rate"]

    # Lineage: policy → experience model → data → pipeline run.
    links = lineage("models:/dreamgym-policy/2")
    assert [link.kind for link in links] == ["policy", "experience-model", "data", "pipeline"]
    assert links[1].label == "models:/dreamgym-experience/1"
    assert links[2].facts["md5"] == data_md5
    assert links[3].facts["run"] == parent.info.run_id

    # An immediate re-run: every task a cache hit, no new rows, no new versions.
    rows = _buffer_rows(project)
    since = datetime.datetime.now(datetime.UTC)
    second = pipeline(params)
    states = _task_states(since)
    assert states and all(names == {"Cached"} for names in states.values()), states
    assert _buffer_rows(project) == rows
    assert len(client.search_model_versions("name = 'dreamgym-policy'")) == 2
    assert len(client.search_model_versions("name = 'dreamgym-experience'")) == 1
    assert second.policy.evaluations == first.policy.evaluations
    assert (second.experience.train, second.experience.model, second.experience.fidelity) == (
        first.experience.train,
        first.experience.model,
        first.experience.fidelity,
    )
    # ... and it says so: no rows inserted by this run, no data version presented as new, and its
    # MLflow runs name the stages an earlier run did instead of logging that run's work as theirs.
    ingest = second.ingest
    assert ingest.buffer_cached and not ingest.data_changed
    assert {"collect-trajectories", "upsert-buffer", "version-data"} <= set(ingest.cached_stages)
    rows_shown = dict(ingest.rows())
    assert rows_shown["buffer rows inserted / already there"].startswith("nothing this run: cached")
    assert "(unchanged)" in rows_shown["data version (DVC md5)"]
    cached_run = client.get_run(ingest.mlflow_run_id)
    assert "upsert-buffer" in cached_run.data.tags["dreamgym.cached_stages"]
    assert "buffer_inserted" not in cached_run.data.metrics and "collect_seconds" not in cached_run.data.metrics

    # Recomputed (cache ignored, `dreamgym run --refresh`): the policy flow finds BC and RL trained,
    # says so, and registers nothing new.
    from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

    from dreamgym.config import load_config
    from flows.train_policy import train_policy

    with temporary_settings({PREFECT_TASKS_REFRESH_CACHE: True}):
        again = train_policy(load_config(params), second.ingest, second.experience, str(project))
    assert not first.policy.rl.reused and again.rl.reused and again.bc.reused
    assert (again.rl, again.model, again.evaluations) == (
        dataclasses.replace(first.policy.rl, reused=True),
        first.policy.model,
        first.policy.evaluations,
    )
    assert len(client.search_model_versions("name = 'dreamgym-policy'")) == 2

    # One RL parameter changed: RL, evaluation of the new policy and the gate run; nothing upstream.
    since = datetime.datetime.now(datetime.UTC)
    third = pipeline(params, {"rl.learning_rate": 0.002})
    states = _task_states(since)
    ran = {name for name, names in states.items() if names != {"Cached"}}
    # (record-dvc-stage: dvc.lock notes the policy stage's new params; the experience stage's is a hit.)
    assert ran == {"rl-in-dream-env", "evaluate-policy", "promotion-gate", "record-dvc-stage"}, states
    assert "Cached" in states["record-dvc-stage"]
    assert third.policy.model == "models:/dreamgym-policy/3"  # BC is the same: registered once
    assert third.experience.model == first.experience.model
    assert "challenger" in client.get_model_version("dreamgym-policy", "3").aliases

    # The benchmarks that read a finished project run on this one (benchmarks/ is a suite).
    [bc_policy] = (project / "outputs" / "policy").glob("bc-*/bc/model")
    smoke_project_benchmarks(project, KILLABLE, bc_policy, project / "outputs" / "bench-smoke")


def _check_experience_and_policy_stages(project: Path, first, client: MlflowClient) -> None:
    """What the experience and policy stages of the finished run made, trained, measured and registered."""
    from dreamgym.experience.affordances import AFFORDANCES_FILE, Affordances
    from dreamgym.experience.generate import trained_kept_names
    from dreamgym.lm.model import load_model
    from dreamgym.ops.registry import resolve_model

    ingested, experience, policy = first.ingest, first.experience, first.policy
    # experience.learnt_actions is on (the default): its whole path runs, learnt in build-examples,
    # saved beside the model, registered with it, loaded for fidelity and for the policy flow's DreamEnv.
    assert experience.model == "models:/dreamgym-experience/1" and not experience.train.reused
    fidelity = experience.fidelity
    assert fidelity["transitions"] > 0 and 0.0 <= fidelity["parse_failure_rate"] <= 1.0
    assert [entry["step"] for entry in fidelity["multi_step"]] == [1, 2]
    version = client.get_model_version("dreamgym-experience", "1")
    assert version.tags["data_md5"] == ingested.data_md5 and version.run_id == experience.mlflow_run_id
    run = client.get_run(experience.mlflow_run_id)
    assert run.data.tags["dreamgym.data_md5"] == ingested.data_md5
    assert run.data.params["experience.neighbours"] == "2"
    losses = client.get_metric_history(run.info.run_id, "train_loss")
    assert losses and run.data.metrics["fidelity_transitions"] == fidelity["transitions"]
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id, "experience")}
    assert {"experience/loss.png", "experience/fidelity_summary.json", "experience/fidelity_open_loop.png"} <= artifacts
    # The registered model is a complete model folder that loads, with the names its placeholders
    # leave as they are (every game has a knife; foods differ) and its learnt actions.
    model_dir, label = resolve_model("dreamgym-experience", project / "models-cache")
    assert label == "models:/dreamgym-experience/1"
    load_model(model_dir)
    kept = trained_kept_names(model_dir)
    assert kept is not None and "knife" in kept and "fridge" in kept
    assert Affordances.load(model_dir / AFFORDANCES_FILE).kept == kept

    # The policy flow on that experience model: BC -> GRPO in DreamEnv -> real evaluation -> registry.
    assert [e["name"] for e in policy.evaluations] == ["untrained", "bc", "dreamgym"]
    # games.target headroom: the held-out games are the preset's, those of the training settings beside.
    same_settings = ["bc-training-settings", "dreamgym-training-settings"]
    assert [e["name"] for e in policy.same_settings_evaluations] == same_settings
    assert ingested.test_games_dir.endswith("test-headroom") and ingested.same_test_games_dir.endswith("test")
    assert all(e["episodes"] == 1 and e["real_transitions"] > 0 for e in policy.evaluations)
    assert policy.rl.epochs == KILLABLE["rl.epochs"] and policy.rl.real_transitions == 0
    assert policy.rl.synthetic_transitions > 0
    run = client.get_run(policy.mlflow_run_id)
    assert run.data.tags["dreamgym.experience_model"] == experience.model
    assert {
        "eval_untrained_success_rate",
        "eval_bc_success_rate",
        "eval_dreamgym_success_rate",
        "rl_success_rate",
        "rl_synthetic_transitions",
        "rl_curriculum_entropy",
        "rl_recalled_share",  # rl.recall_real: DreamEnv's steps the real data recorded
    } <= set(run.data.metrics)
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id, "policy")}
    assert any(path.endswith("learning_curves.png") for path in artifacts)
    assert client.get_model_version("dreamgym-policy", "2").tags["experience_model"] == experience.model
    assert client.get_model_version("dreamgym-policy", "1").tags["rl"] == "bc"


def test_prefect_yaml_parameters_are_the_pipeline_flow_s():
    """The deployment passes parameters the flow accepts (the schedule itself: test_schedule.py)."""
    from flows.pipeline import pipeline

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    [deployment] = [d for d in spec["deployments"] if d["name"] == "nightly"]
    pipeline.validate_parameters(deployment.get("parameters") or {})


def _timeless(keys: set[str]) -> set[str]:
    return {key for key in keys if not any(word in key for word in ("seconds", "per_second", "runtime"))}


@pytest.mark.long
def test_a_run_killed_in_rl_resumes_and_ends_as_an_uninterrupted_run(
    tmp_path, project_games, prefect_server, finished, mlflow_tracking
):
    """Killed during RL then started again: no duplicated rows or versions, and the same metrics
    as an uninterrupted run of the same seed in another project (CPU runs are reproducible)."""
    import os
    import signal
    import time

    from prefect.settings import PREFECT_API_URL

    from flows.pipeline import pipeline

    killed = make_project(tmp_path / "killed", project_games)
    params = write_params(killed, KILLABLE)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    process = subprocess.Popen(
        [sys.executable, "-m", "dreamgym.cli", "run", "--params", str(params)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 900
    while not list(killed.glob("outputs/policy/rl-*/epochs/epoch-1/state.json")):
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "RL never wrote its first checkpoint"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    done = list(killed.glob("outputs/policy/rl-*/epochs/epoch-*/state.json"))
    assert len(done) < KILLABLE["rl.epochs"], "the run finished RL before it could be killed"

    resumed = pipeline(str(params))
    client = MlflowClient()
    assert len(client.search_model_versions("name = 'dreamgym-policy'")) == 2
    assert len(client.search_model_versions("name = 'dreamgym-experience'")) == 1
    from sqlalchemy import text

    from dreamgym.buffer.migrations import open_migrated
    from dreamgym.config import load_config

    config = load_config(params)
    with (
        open_migrated(killed / config.paths.run_dir, config.buffer) as database,
        database.engine.connect() as connection,
    ):
        counts = dict(connection.execute(text("SELECT source, count(*) FROM transitions GROUP BY source")).all())
    # Every real transition once (content hashes are unique); at most the RL run's synthetic steps
    # written back (the tiny experience model's unparseable predictions are not transitions).
    assert counts["real"] == resumed.ingest.collection.transitions
    assert counts.get("synthetic", 0) <= resumed.policy.rl.synthetic_transitions
    assert resumed.policy.rl.epochs == KILLABLE["rl.epochs"]
    # The killed run no longer holds the embedded server: its users are live processes only, so
    # the last of them stops it (before the fix the dead PID kept it running for good).
    from dreamgym.buffer.db import HANDLE_FILE, _alive

    users = json.loads((killed / config.paths.run_dir / "postgres" / HANDLE_FILE).read_text())
    assert process.pid not in users and all(_alive(pid) for pid in users), users

    # The same seed in a fresh project, uninterrupted: the same figures everywhere.
    uninterrupted = finished.result
    first = client.get_run(resumed.mlflow_run_id).data.metrics
    assert first == finished.metrics and "eval_dreamgym_success_rate" in first
    # The RL curves' last values (the resumed run logged the epochs after the kill).
    first = client.get_run(resumed.policy.mlflow_run_id).data.metrics
    learned = {key for key in first if key.startswith(("rl_", "eval_"))}
    assert learned and {key: first[key] for key in _timeless(learned)} == {
        key: finished.policy_metrics[key] for key in _timeless(learned)
    }
    assert resumed.policy.evaluations[-1]["success_rate"] == uninterrupted.policy.evaluations[-1]["success_rate"]


def test_two_runs_started_at_once_on_one_checkout_end_as_one(tmp_path, project_games, prefect_server):
    """Two `dreamgym run --until ingest` at the same moment on one checkout (a cron and a user):
    both succeed, every collected transition is in the buffer once, and no embedded server
    outlives them."""
    import os

    from prefect.settings import PREFECT_API_URL
    from sqlalchemy import text

    from dreamgym.buffer.migrations import open_migrated
    from dreamgym.config import load_config
    from dreamgym.data.schema import read_transitions

    project = make_project(tmp_path / "twice", project_games)
    params = write_params(project, TINY)
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "MLFLOW_TRACKING_URI")}
    env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "dreamgym.cli", "run", "--until", "ingest", "--params", str(params)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=900)
        assert run.returncode == 0, stderr[-3000:]

    config = load_config(params)
    postgres = project / config.paths.run_dir / "postgres"
    pid_file = postgres / "postmaster.pid"
    if pid_file.exists():  # the last of the two stopped the server it started
        from dreamgym.buffer.db import _alive

        assert not _alive(int(pid_file.read_text().split()[0])), "the embedded server outlived both runs"
    collected = read_transitions(project / config.paths.data_dir / "trajectories" / "offline.parquet")
    with (
        open_migrated(project / config.paths.run_dir, config.buffer) as database,
        database.engine.connect() as connection,
    ):
        stored = connection.execute(text("SELECT count(*), count(DISTINCT content_hash) FROM transitions")).one()
    assert tuple(stored) == (collected.num_rows, collected.num_rows)
