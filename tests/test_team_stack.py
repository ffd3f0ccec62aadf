"""The team deployment end to end: the shared services as real processes on free local ports
(`dreamgym stack`), the tiny pipeline as a deployment run that the Prefect worker executes, its
buffer in the stack's Postgres, its runs, artifacts and models on the MLflow server over HTTP, its
fan-out on the stack's Ray head. One
server is killed and restarted mid-run; nothing is lost or duplicated, no password leaks, and the
gate run from a second checkout sees the registry the first one filled."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import free_ports
from test_ingest_flow import TINY, TINY_EXPERIENCE, TINY_POLICY_FLOW, make_project

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = {**TINY, **TINY_EXPERIENCE, **TINY_POLICY_FLOW}
DEPLOYMENT = "dreamgym-pipeline/nightly"


def _write_env_file(path: Path) -> dict[str, str]:
    ports = free_ports(5)
    values = {
        "POSTGRES_PASSWORD": "admin-" + secrets.token_hex(8),
        "DREAMGYM_DB_PASSWORD": "pipeline-" + secrets.token_hex(8),
        "MLFLOW_DB_PASSWORD": "mlflow-" + secrets.token_hex(8),
        "PREFECT_DB_PASSWORD": "prefect-" + secrets.token_hex(8),
        **dict(zip(["POSTGRES_PORT", "MLFLOW_PORT", "PREFECT_PORT", "RAY_PORT", "RAY_CLIENT_PORT"], map(str, ports))),
    }
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    return values


def _checkout(root: Path, project_games: dict[str, list[Path]]) -> Path:
    """A teammate's checkout: the code (and the buffer's schema, which a worker reads from the
    checkout it runs) with the session's games in place."""
    project = make_project(root, project_games)
    shutil.copy(ROOT / "prefect.yaml", project / "prefect.yaml")
    shutil.copytree(ROOT / "sql", project / "sql")
    return project


def _write_overrides(params: Path, overrides: dict) -> None:
    """A teammate's own parameter file: the dotted overrides written into it."""
    values = yaml.safe_load(params.read_text())
    for dotted, value in overrides.items():
        section, key = dotted.split(".")
        values[section][key] = value
    params.write_text(yaml.safe_dump(values))


@pytest.fixture(scope="module")
def team(tmp_path_factory, project_games):
    """The stack up on free ports, with a Ray head and a worker serving checkout A; torn down afterwards."""
    from dreamgym.ops.stack.processes import Stack
    from dreamgym.ops.stack.settings import load_settings

    root = tmp_path_factory.mktemp("team")
    env_file = root / "team.env"
    values = _write_env_file(env_file)
    checkout = _checkout(root / "checkout-a", project_games)
    stack = Stack(root / "stack", load_settings(env_file), checkout, with_ray=True, ray_cpus=2)
    try:
        stack.up()
        yield stack, checkout, values
    finally:
        stack.down()


def _prefect(stack):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings({PREFECT_API_URL: stack.client_env()["PREFECT_API_URL"]})


def _task_state(task_name: str) -> str | None:
    """The state of the latest run of the task (the stack's server holds this test's runs only).
    Every read names its sort: Prefect 3.8.8's client sends `null` otherwise, which the server refuses."""
    from prefect import get_client
    from prefect.client.schemas.sorting import TaskRunSort

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(sort=TaskRunSort.EXPECTED_START_TIME_ASC, limit=200)

    states = [run.state.name for run in asyncio.run(read()) if run.name.rsplit("-", 1)[0] == task_name]
    return states[-1] if states else None


def _descendants(pid: int) -> list[str]:
    """The command lines of every process below `pid`."""
    parents, lines = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after the name: state, then ppid
            line = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue  # a process that ended while it was read
        parents[int(stat.parent.name)], lines[int(stat.parent.name)] = parent, line
    below, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        below += children
        frontier = children
    return [lines[child] for child in below]


def _flow_run(flow_run_id):
    from prefect import get_client

    async def read():
        async with get_client() as client:
            return await client.read_flow_run(flow_run_id)

    return asyncio.run(read())


def _logs_tail(stack, chars: int = 3000) -> str:
    """The end of the worker's log (the flow run's own output) and of the Ray head's, for a failure
    message that says where a run stopped."""
    tails = []
    for service in ("prefect-worker", "ray"):
        path = stack.log_path(service)
        if path.exists():
            tails.append(f"--- {service} log ---\n{path.read_text(errors='replace')[-chars:]}")
    return "\n".join(tails)


@pytest.mark.long
def test_a_deployment_run_on_the_team_stack_survives_a_server_restart_and_shares_its_registry(
    team, project_games, tmp_path
):
    import mlflow
    from mlflow.tracking import MlflowClient
    from prefect.deployments import run_deployment
    from sqlalchemy import create_engine, text

    stack, checkout, values = team
    client_env = stack.client_env()
    env = {**os.environ, **client_env, "PREFECT_HOME": str(tmp_path / "prefect-cli")}

    # The team's deployment, as prefect.yaml defines it, registered on the shared server.
    deployed = subprocess.run(
        [str(Path(sys.executable).parent / "dreamgym"), "deploy", "--name", "nightly"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    assert deployed.returncode == 0, deployed.stderr

    with _prefect(stack):
        flow_run = run_deployment(DEPLOYMENT, parameters={"params": "params.yaml", "overrides": OVERRIDES}, timeout=0)
        # Kill MLflow (SIGKILL, as a crash) between the stages' MLflow calls, while the run builds
        # the experience model's examples (a task that reads the buffer, not MLflow), and start it
        # again: the rest of the run talks to the restarted server through its clients' retries.
        # A kill right after a task, as this test first did, could land inside the flow's next
        # MLflow call and cut its answer short, which no client retries (infra/README.md).
        deadline = time.monotonic() + 600
        while (building := _task_state("build-examples")) != "Running":
            state = _flow_run(flow_run.id).state
            assert building is None and not state.is_final() and time.monotonic() < deadline, (
                f"the run did not reach build-examples while it ran ({building}): {state.name} "
                f"{state.message or ''}\n{_logs_tail(stack)}"
            )
            time.sleep(0.25)
        stack.stop("mlflow", kill=True)
        time.sleep(2)
        stack.start("mlflow")

        while not (finished := _flow_run(flow_run.id)).state.is_final():
            assert time.monotonic() < deadline, "the deployment run did not finish in 10 min"
            time.sleep(2)
    worker_log = stack.log_path("prefect-worker").read_text(errors="replace")
    assert finished.state.is_completed(), f"{finished.state}\n{_logs_tail(stack)}"
    # The MLflow server runs without MLflow's GenAI job runner (its huey consumers), which no
    # dreamgym run submits to.
    serving = _descendants(stack.pid("mlflow"))
    assert serving and not [line for line in serving if "mlflow.server.jobs" in line], serving
    # ... run by the worker, from the deployment.
    assert finished.deployment_id is not None and finished.work_pool_name == stack.settings.work_pool
    assert str(finished.id) in worker_log
    # ... and what fans out ran on the stack's Ray head, one Prefect task per piece (client.env's
    # DREAMGYM_RAY_ADDRESS, in the worker's environment, switched the run to Ray).
    with _prefect(stack):
        assert _task_state("collect-piece") == "Completed"
        assert _task_state("evaluate-piece") == "Completed"

    # MLflow, over HTTP: one pipeline run with a run per stage, not one more after the restart.
    tracking = client_env["MLFLOW_TRACKING_URI"]
    client = MlflowClient(tracking_uri=tracking)
    experiments = client.search_experiments()
    runs = [run for e in experiments for run in client.search_runs([e.experiment_id])]
    parents = [run for run in runs if run.data.tags.get("dreamgym.stage") == "pipeline"]
    assert len(parents) == 1, [run.info.run_name for run in runs]
    parent = parents[0]
    children = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(run.data.tags["dreamgym.stage"] for run in children) == sorted(
        ["ingest", "train-experience", "train-policy", "promotion"]
    )
    assert parent.data.tags["prefect.flow_run_id"] == str(flow_run.id)
    # BC (version 1, the first champion) and the RL policy (version 2).
    assert sorted(v.version for v in client.search_model_versions("name = 'dreamgym-policy'")) == ["1", "2"]
    assert [v.version for v in client.search_model_versions("name = 'dreamgym-experience'")] == ["1"]
    # Artifacts went up through the server into its artifact store, and come back down.
    assert parent.info.artifact_uri.startswith("mlflow-artifacts:")
    from dreamgym.ops.lineage import lineage

    mlflow.set_tracking_uri(tracking)
    try:
        summary = mlflow.artifacts.load_dict(f"runs:/{parent.info.run_id}/summary.json")
        links = lineage("models:/dreamgym-policy/2")  # lineage reads the server as it reads a file store
    finally:
        mlflow.set_tracking_uri(None)
    assert [link.kind for link in links] == ["policy", "experience-model", "data", "pipeline"]
    assert links[3].facts["run"] == parent.info.run_id
    assert any((stack.dir / "mlflow-artifacts").rglob("summary.json"))

    # The buffer: in the stack's Postgres, every validated row once, as the pipeline's own role.
    import pyarrow.parquet as pq

    validated = pq.read_table(summary["ingest"]["validated_path"]).num_rows
    engine = create_engine(client_env["DATABASE_URL"])
    with engine.connect() as connection:
        assert connection.execute(text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).scalar() is False
        real = connection.execute(
            text(
                "SELECT count(*), count(DISTINCT (t.trajectory_id, t.step)) FROM transitions t "
                "JOIN trajectories j USING (trajectory_id) WHERE j.source = 'real'"
            )
        ).one()
    engine.dispose()
    assert tuple(real) == (validated, validated)

    # No password in MLflow params, tags or artifacts, Prefect's logs of the run, or any log.
    passwords = [value for key, value in values.items() if key.endswith("_PASSWORD")]
    passwords.append((stack.dir / "ray-auth-token").read_text())
    texts = [str(run.data.params) + str(run.data.tags) for run in runs]
    download = tmp_path / "artifacts"
    for run in runs:
        client.download_artifacts(run.info.run_id, "", str(download / run.info.run_id))
    texts += [path.read_text(errors="replace") for path in download.rglob("*") if path.is_file()]
    with _prefect(stack):
        from prefect import get_client
        from prefect.client.schemas.filters import LogFilter
        from prefect.client.schemas.sorting import LogSort

        async def logs():
            pages = []
            async with get_client() as prefect_client:
                while not pages or len(pages[-1]) == 200:  # the server's page size limit
                    pages.append(
                        await prefect_client.read_logs(
                            LogFilter(), limit=200, offset=200 * len(pages), sort=LogSort.TIMESTAMP_ASC
                        )
                    )
            return [log for page in pages for log in page]

        run_logs = asyncio.run(logs())
        assert any("upsert-buffer" in str(log.message) or log.task_run_id for log in run_logs)
        texts += [log.message for log in run_logs]
    texts += [path.read_text(errors="replace") for path in (stack.dir / "logs").glob("*.log")]
    leaks = [password for password in passwords for each in texts if password in each]
    assert not leaks, f"{len(leaks)} password occurrences in params, tags, artifacts or logs"

    # A teammate's checkout, against the same servers: `dreamgym promote` there gates BC (version 1)
    # against the champion the team chose (version 2, approved by hand as an operator does with
    # `mlflow` aliases), not against BC, and writes its decision through the server. Both were
    # measured on the same held-out set, so the gate plays no game. (It used to run the whole
    # pipeline a second time, ~80 s of the suite: registering a run's versions against a champion
    # is test_pipeline.py's and test_promotion.py's; sharing the registry is what this one shows.)
    client.set_registered_model_alias("dreamgym-policy", "champion", "2")
    other = _checkout(tmp_path / "checkout-b", project_games)
    _write_overrides(other / "params.yaml", OVERRIDES)
    from dreamgym.ops.stack.services import client_env as stack_client_env

    without_ray = stack_client_env(stack.settings, stack.dir, with_ray=False)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dreamgym"), "promote", "--version", "1"],
        cwd=other,
        env={**os.environ, **without_ray, "PREFECT_HOME": str(tmp_path / "prefect-b")},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    gated = client.get_model_version("dreamgym-policy", "1")
    assert gated.tags["promotion.baseline"] == "models:/dreamgym-policy/2", gated.tags
    champion = str(client.get_model_version_by_alias("dreamgym-policy", "champion").version)
    assert champion == ("1" if gated.tags["promotion.decision"] == "promoted" else "2")
    assert ("promoted to champion" if champion == "1" else "not promoted") in result.stdout + result.stderr


def test_the_compose_file_runs_what_the_process_stack_runs():
    """infra/docker-compose.yml (no Docker daemon here to run it) agrees with `dreamgym stack`: the
    same services and command lines, the same environment variables, ports from the same keys of
    infra/.env.example, whose keys are the stack settings' own."""
    import dataclasses
    import re

    from dotenv import dotenv_values

    from dreamgym.ops.stack.services import POSTGRES, RAY, stack_services
    from dreamgym.ops.stack.settings import Secret, StackSettings

    compose_text = (ROOT / "infra" / "docker-compose.yml").read_text()
    compose = yaml.safe_load(compose_text)["services"]
    example = dotenv_values(ROOT / "infra" / ".env.example")
    fields = {field.name.upper(): field for field in dataclasses.fields(StackSettings)}
    assert set(example) <= set(fields), set(example) - set(fields)
    assert set(re.findall(r"\$\{([A-Z_]+)", compose_text)) <= set(example)

    # Inside a container every service listens on its default port, on all interfaces.
    passwords = {name.lower(): Secret("x") for name in example if name.endswith("_PASSWORD")}
    settings = StackSettings(**passwords, host="0.0.0.0")
    for key, value in example.items():
        if key.endswith("_PORT"):
            assert int(value) == fields[key].default, f"{key}: .env.example and StackSettings disagree"
    services = {
        service.name: service
        for with_ray in (False, True)
        for service in stack_services(settings, Path("/data"), Path("/project"), with_ray=with_ray)
        if with_ray == (service.name == RAY)
    }
    assert set(compose) == set(services)
    ports = {POSTGRES: ["POSTGRES_PORT"], "mlflow": ["MLFLOW_PORT"], "prefect-server": ["PREFECT_PORT"]}
    ports[RAY] = ["RAY_PORT", "RAY_CLIENT_PORT"]
    for name, service in services.items():
        spec = compose[name]
        expected = [f"${{{key}:-{fields[key].default}}}:{fields[key].default}" for key in ports.get(name, [])]
        assert spec.get("ports", []) == expected, name
        if name == POSTGRES:  # the pgvector image runs the same bootstrap script on first start
            assert "./postgres:/docker-entrypoint-initdb.d:ro" in spec["volumes"]
            continue
        assert spec["command"] == [Path(service.argv[0]).name, *service.argv[1:]], name
        assert set(service.env) <= set(spec.get("environment", {})), name


def test_a_server_that_is_down_at_start_is_named_in_one_error(tmp_path):
    """`dreamgym run` asks the servers the environment names before it starts anything."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    dead = free_ports(2)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{dead[0]}",
        "DATABASE_URL": f"postgresql://dreamgym:s3cret-pw@127.0.0.1:{dead[1]}/dreamgym",
        "PREFECT_HOME": str(tmp_path / "prefect"),
    }
    env.pop("PREFECT_API_URL", None)
    started = time.monotonic()
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dreamgym"), "run"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the MLflow tracking server"), lines
    assert f"127.0.0.1:{dead[0]} (MLFLOW_TRACKING_URI)" in lines[0]
    assert "cannot connect to the buffer's database" in lines[0] and "unset DATABASE_URL" in lines[0]
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert time.monotonic() - started < 60  # not after minutes of client retries
    assert not (tmp_path / "data").exists()  # nothing started


def test_stack_settings_refuse_what_would_break_the_stack(tmp_path):
    from dreamgym.ops.stack.settings import StackConfigError, load_settings

    with pytest.raises(StackConfigError, match=r"copy infra/.env.example"):
        load_settings(tmp_path / "missing.env")
    env_file = tmp_path / "team.env"
    values = _write_env_file(env_file)
    settings = load_settings(env_file)
    assert values["DREAMGYM_DB_PASSWORD"] not in repr(settings) + str(settings.dreamgym_db_password)
    for line, match in [
        ("POSTGRES_PASSWORD=change-me", "still 'change-me'"),
        ("MLFLOW_PORT=http", "not a port number"),
        (f"MLFLOW_PORT={values['PREFECT_PORT']}", "two services one port"),
    ]:
        key = line.split("=")[0]
        kept = [f"{k}={v}" for k, v in values.items() if k != key]
        env_file.write_text("\n".join([*kept, line]) + "\n")
        with pytest.raises(StackConfigError, match=match):
            load_settings(env_file)
    env_file.write_text("\n".join(f"{k}={v}" for k, v in values.items() if k != "PREFECT_DB_PASSWORD") + "\n")
    with pytest.raises(StackConfigError, match="PREFECT_DB_PASSWORD is not set"):
        load_settings(env_file)


def test_up_starts_every_service_once_after_those_it_needs():
    """`Stack.up` starts a wave's services together: each service is in one wave, after the
    services it talks to at start (the database for the servers, the Prefect server for the worker)."""
    from dreamgym.ops.stack.services import MLFLOW, ORDER, POSTGRES, PREFECT_SERVER, PREFECT_WORKER, START_WAVES

    wave = {name: index for index, names in enumerate(START_WAVES) for name in names}
    assert sorted(wave) == sorted(ORDER) and sum(map(len, START_WAVES)) == len(ORDER)
    assert wave[POSTGRES] < wave[MLFLOW] and wave[POSTGRES] < wave[PREFECT_SERVER] < wave[PREFECT_WORKER]
