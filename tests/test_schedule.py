"""Scheduled retraining: the repository's prefect.yaml, as `prefect deploy` and `dreamgym serve`
read it. No Prefect server: every check here is local (an unreachable API URL proves it)."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from pathlib import Path

import pytest
import yaml
from conftest import free_ports

from dreamgym.errors import DreamgymError
from dreamgym.ops.schedule import DeploymentSpec, deployment_options, load_deployment, load_flow

REPO = Path(__file__).resolve().parents[1]
UNREACHABLE_API = "http://127.0.0.1:9/api"  # the discard port: any API call fails at once


def _wait_for(path: Path, timeout_s: float = 20 * 60, every_s: float = 60) -> None:
    """The pipeline flow is written alongside this file; wait for it rather than skip."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(every_s)


@pytest.fixture(scope="module")
def spec() -> DeploymentSpec:
    return load_deployment(REPO)


@pytest.fixture(scope="module")
def pipeline_flow(spec):
    _wait_for(REPO / spec.entrypoint.rpartition(":")[0])
    return load_flow(spec, REPO)


@pytest.fixture
def offline_prefect(monkeypatch):
    """A Prefect API nothing listens on: a call that needed a server would fail."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: UNREACHABLE_API}):
        yield


def test_the_nightly_deployment(spec):
    assert spec == DeploymentSpec(
        name="nightly",
        entrypoint="flows/pipeline.py:pipeline",
        parameters={"params": "params.yaml"},
        cron="0 2 * * *",
        timezone="UTC",
        work_pool="dreamgym-local",
        work_queue="default",
        work_pool_type="process",
        pull_steps=({"prefect.deployments.steps.set_working_directory": {"directory": "{{ $DREAMGYM_PROJECT_DIR }}"}},),
        tags=("dreamgym", "retraining"),
        description="The whole dreamgym pipeline (ingest, experience model, policy), every night.",
    )
    assert (REPO / spec.parameters["params"]).is_file()


def test_prefect_reads_the_same_deployment(spec):
    """`prefect deploy`'s own reader of prefect.yaml sees what dreamgym serve sees."""
    from prefect.cli.deploy._models import PrefectYamlModel

    document = yaml.safe_load((REPO / "prefect.yaml").read_text())
    model = PrefectYamlModel.model_validate(document)
    assert model.name == "dreamgym" and model.prefect_version == "3.8.8"
    [deployment] = [d for d in model.deployments if d.name == spec.name]
    assert deployment.entrypoint == spec.entrypoint and deployment.parameters == spec.parameters
    [schedule] = deployment.schedules
    assert (schedule.cron, schedule.timezone) == (spec.cron, spec.timezone)
    assert (deployment.work_pool.name, deployment.work_pool.work_queue_name) == (spec.work_pool, spec.work_queue)
    # The pool's type is fixed when it is created: by the team stack's worker (`--pool P --type T`).
    from dreamgym.ops.stack.services import PREFECT_WORKER, stack_services
    from dreamgym.ops.stack.settings import Secret, StackSettings

    settings = StackSettings(*(Secret("x") for _ in range(4)))
    [worker] = [s for s in stack_services(settings, REPO, REPO) if s.name == PREFECT_WORKER]
    assert settings.work_pool == spec.work_pool
    assert worker.argv[worker.argv.index("--type") + 1] == spec.work_pool_type


def test_the_pull_step_enters_the_checkout(spec, monkeypatch, tmp_path):
    """The pull step's `{{ $DREAMGYM_PROJECT_DIR }}` is filled from the environment (Prefect's
    env-var placeholder), and the entrypoint and params file resolve from there."""
    from prefect.deployments.steps import set_working_directory
    from prefect.utilities.templating import apply_values

    [step] = yaml.safe_load((REPO / "prefect.yaml").read_text())["pull"]
    inputs = step["prefect.deployments.steps.set_working_directory"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DREAMGYM_PROJECT_DIR", str(REPO))
    resolved = apply_values(inputs, os.environ)  # what the worker does before a run
    assert resolved == {"directory": str(REPO)}
    assert set_working_directory(**resolved) == {"directory": str(REPO)}
    assert Path(spec.entrypoint.rpartition(":")[0]).is_file() and Path(spec.parameters["params"]).is_file()


def test_entrypoint_is_the_pipeline_flow(spec, pipeline_flow):
    from prefect import Flow

    assert isinstance(pipeline_flow, Flow)
    assert pipeline_flow.name == "dreamgym-pipeline"
    assert pipeline_flow.validate_parameters(dict(spec.parameters)) == {
        "params": "params.yaml",
        "overrides": None,
        "refresh": False,
        "until": "promotion",
    }
    with pytest.raises(Exception, match="params"):
        pipeline_flow.validate_parameters({"params": ["not", "a", "path"]})


def test_the_schedule_fires_at_two_utc(spec):
    from prefect.server.schemas.schedules import CronSchedule

    schedule = CronSchedule(cron=spec.cron, timezone=spec.timezone)  # the scheduler service's model
    start = dt.datetime(2026, 3, 28, 12, 30, tzinfo=dt.UTC)  # London changes clocks next day
    dates = asyncio.run(schedule.get_dates(n=3, start=start))
    assert [d.astimezone(dt.UTC) for d in dates] == [
        dt.datetime(2026, 3, day, 2, 0, tzinfo=dt.UTC) for day in (29, 30, 31)
    ]
    now = dt.datetime.now(dt.UTC)
    [upcoming] = asyncio.run(schedule.get_dates(n=1, start=now))
    upcoming = upcoming.astimezone(dt.UTC)
    assert (upcoming.hour, upcoming.minute) == (2, 0) and dt.timedelta(0) <= upcoming - now <= dt.timedelta(days=1)


def test_to_deployment_keeps_the_schedule(spec, pipeline_flow, offline_prefect, monkeypatch):
    from prefect.client.schemas.schedules import CronSchedule

    monkeypatch.chdir(REPO)
    deployment = pipeline_flow.to_deployment(
        **deployment_options(spec), work_pool_name=spec.work_pool, work_queue_name=spec.work_queue
    )
    assert deployment.name == spec.name and deployment.flow_name == "dreamgym-pipeline"
    assert deployment.entrypoint == spec.entrypoint
    assert deployment.parameters == spec.parameters
    assert (deployment.work_pool_name, deployment.work_queue_name) == ("dreamgym-local", "default")
    [schedule] = [s.schedule for s in deployment.schedules]
    assert isinstance(schedule, CronSchedule)
    assert (schedule.cron, schedule.timezone) == ("0 2 * * *", "UTC")

    # The plain `cron=` form keeps the cron but no timezone (left to the server's default, UTC):
    # why deployment_options passes `schedules=[Cron(cron, timezone=...)]`.
    plain = pipeline_flow.to_deployment(name=spec.name, cron=spec.cron)
    [schedule] = [s.schedule for s in plain.schedules]
    assert (schedule.cron, schedule.timezone) == (spec.cron, None)


def test_timezone_is_kept(tmp_path):
    _write(
        tmp_path,
        {"name": "nightly", "entrypoint": "f.py:f", "schedules": [{"cron": "0 2 * * *", "timezone": "Europe/Paris"}]},
    )
    spec = load_deployment(tmp_path)
    assert (spec.cron, spec.timezone, spec.parameters, spec.work_pool) == ("0 2 * * *", "Europe/Paris", {}, None)
    [schedule] = deployment_options(spec)["schedules"]
    assert schedule.timezone == "Europe/Paris"


def _write(folder: Path, *deployments: dict) -> None:
    (folder / "prefect.yaml").write_text(yaml.safe_dump({"name": "x", "deployments": list(deployments)}))


def test_missing_project_file(tmp_path):
    with pytest.raises(DreamgymError, match=r"prefect\.yaml: not found"):
        load_deployment(tmp_path)


def test_unknown_deployment_name_lists_the_defined_ones(tmp_path):
    _write(
        tmp_path,
        {"name": "nightly", "entrypoint": "f.py:f", "schedules": [{"cron": "0 2 * * *"}]},
        {"name": "weekly", "entrypoint": "f.py:f", "schedules": [{"cron": "0 3 * * 0"}]},
    )
    with pytest.raises(DreamgymError) as error:
        load_deployment(tmp_path, "hourly")
    message = str(error.value)
    assert "no deployment named 'hourly'" in message and "defined: 'nightly', 'weekly'" in message
    assert load_deployment(tmp_path, "weekly").cron == "0 3 * * 0"


def test_bad_cron(tmp_path):
    _write(tmp_path, {"name": "nightly", "entrypoint": "f.py:f", "schedules": [{"cron": "0 25 * * *"}]})
    with pytest.raises(DreamgymError) as error:
        load_deployment(tmp_path)
    message = str(error.value)
    assert "deployment 'nightly': cron '0 25 * * *' is not valid" in message
    assert 'Invalid cron string: "0 25 * * *"' in message and "fix it in prefect.yaml" in message
    assert "\n" not in message


def test_bad_timezone(tmp_path):
    _write(
        tmp_path,
        {"name": "nightly", "entrypoint": "f.py:f", "schedules": [{"cron": "0 2 * * *", "timezone": "Mars/Olympus"}]},
    )
    with pytest.raises(DreamgymError, match=r"timezone 'Mars/Olympus'.*Invalid timezone"):
        load_deployment(tmp_path)


def test_no_cron_schedule(tmp_path):
    _write(tmp_path, {"name": "nightly", "entrypoint": "f.py:f", "schedules": [{"interval": 3600}]})
    with pytest.raises(DreamgymError, match="no cron schedule; add `schedules:"):
        load_deployment(tmp_path)


def test_entrypoint_that_is_not_a_flow(tmp_path):
    (tmp_path / "f.py").write_text("def f():\n    pass\n")
    _write(
        tmp_path,
        {"name": "nightly", "entrypoint": "f.py:f", "schedules": [{"cron": "0 2 * * *"}]},
        {"name": "gone", "entrypoint": "missing.py:f", "schedules": [{"cron": "0 2 * * *"}]},
    )
    with pytest.raises(DreamgymError, match="is not a flow"):
        load_flow(load_deployment(tmp_path), tmp_path)
    with pytest.raises(DreamgymError, match=r"missing\.py not found"):
        load_flow(load_deployment(tmp_path, "gone"), tmp_path)


@pytest.fixture
def restored_environ():
    """`dreamgym serve` sets the embedded services' variables in this process: undo it."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


def test_serve_serves_the_deployment(spec, pipeline_flow, offline_prefect, restored_environ, monkeypatch, tmp_path):
    from prefect import Flow
    from typer.testing import CliRunner

    from dreamgym.cli import app

    served = {}
    monkeypatch.setattr(Flow, "serve", lambda self, **kwargs: served.update(flow=self, **kwargs))
    monkeypatch.chdir(tmp_path)  # serve changes into the project; monkeypatch changes back
    result = CliRunner().invoke(app, ["serve", "--params", str(REPO / "params.yaml")])
    assert result.exit_code == 0, (result.output, result.exception)
    [line] = result.output.strip().splitlines()
    assert line.startswith("serving dreamgym-pipeline/nightly from ") and "cron '0 2 * * *' (UTC)" in line
    assert "Ctrl+C stops serving" in line
    assert Path.cwd() == REPO
    assert served["flow"].name == "dreamgym-pipeline" and served["name"] == "nightly"
    assert served["parameters"] == {"params": "params.yaml"} and served["print_starting_message"] is False
    [schedule] = served["schedules"]
    assert (schedule.cron, schedule.timezone) == (spec.cron, spec.timezone)


def test_serve_refuses_a_params_file_the_deployment_does_not_run(restored_environ, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from dreamgym.cli import app

    monkeypatch.chdir(tmp_path)

    # A parameter file other than the one the deployment runs with: refused, not silently ignored.
    project = tmp_path / "project"
    project.mkdir()
    (project / "prefect.yaml").write_text((REPO / "prefect.yaml").read_text())
    (project / "other.yaml").write_text((REPO / "params.yaml").read_text())
    result = CliRunner().invoke(app, ["serve", "--params", str(project / "other.yaml")])
    assert isinstance(result.exception, DreamgymError), result.exception
    assert "deployment 'nightly' runs with params='params.yaml' (prefect.yaml)" in str(result.exception)
    assert Path.cwd() == tmp_path  # nothing was served, no change of directory


def test_serve_without_a_server_starts_one_with_a_scheduler_and_stops_it(restored_environ, monkeypatch, tmp_path):
    """No PREFECT_API_URL: `dreamgym serve` starts a Prefect server (its own, in the run
    directory's Prefect home), serves against it, and stops it when serving ends."""

    from prefect import Flow
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from typer.testing import CliRunner

    from dreamgym.cli import app
    from dreamgym.ops.schedule import _healthy

    [port] = free_ports()
    seen = {}

    def serve(self, **kwargs):
        seen["url"] = PREFECT_API_URL.value()
        seen["healthy"] = _healthy(seen["url"])

    monkeypatch.setattr(Flow, "serve", serve)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.chdir(tmp_path)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        result = CliRunner().invoke(app, ["serve", "--port", str(port), "--params", str(REPO / "params.yaml")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert seen == {"url": f"http://127.0.0.1:{port}/api", "healthy": True}
    assert not _healthy(seen["url"]), "the server outlived serving"
    assert (tmp_path / "prefect-home" / "server.log").is_file()
