"""Scheduled retraining: the `nightly` deployment of `prefect.yaml`, read for `dreamgym serve`.

`prefect.yaml` is the one copy of the schedule and its parameters: `prefect deploy` reads it for a
work pool, and `dreamgym serve` reads it here to serve the same flow locally, so the two cannot
drift. Prefect is imported inside the functions only (it reads its settings at import: call
`dreamgym.ops.tracking.configure_services` first).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dreamgym.errors import DreamgymError

if TYPE_CHECKING:
    from prefect import Flow

PROJECT_FILE = "prefect.yaml"


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment of prefect.yaml, with its (single) cron schedule."""

    name: str
    entrypoint: str  # path/to/file.py:flow_function, relative to the project folder
    parameters: dict[str, Any] = field(hash=False)
    cron: str
    timezone: str  # IANA name; Prefect's default (UTC) when prefect.yaml gives none
    work_pool: str | None
    work_queue: str | None
    work_pool_type: str | None = None  # documentation only: Prefect sets it at `work-pool create`
    pull_steps: tuple[dict[str, Any], ...] = field(default=(), hash=False)  # the worker's steps before a run
    tags: tuple[str, ...] = ()
    description: str | None = None


def load_deployment(project_dir: str | Path, name: str = "nightly") -> DeploymentSpec:
    """Read deployment `name` from `<project_dir>/prefect.yaml`; the cron is checked by Prefect."""
    path = Path(project_dir) / PROJECT_FILE
    if not path.is_file():
        raise DreamgymError(
            f"{path}: not found; scheduled retraining is defined in the project's "
            f"{PROJECT_FILE} (run from the project folder or pass --params)"
        )
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DreamgymError(f"{path}: not valid YAML ({_one_line(exc)}); fix it in {PROJECT_FILE}") from exc
    deployments = (document or {}).get("deployments") if isinstance(document, dict) else None
    if not isinstance(deployments, list):
        raise DreamgymError(f"{path}: no `deployments:` list; add one (see the README, Scheduled retraining)")
    entries = [entry for entry in deployments if isinstance(entry, dict)]
    matches = [entry for entry in entries if entry.get("name") == name]
    if not matches:
        known = ", ".join(repr(entry.get("name")) for entry in entries) or "none"
        raise DreamgymError(f"{path}: no deployment named {name!r} (defined: {known}); pass --name with one of those")
    if len(matches) > 1:
        raise DreamgymError(f"{path}: {len(matches)} deployments are named {name!r}; rename all but one")
    entry = matches[0]
    where = f"{path}: deployment {name!r}"

    entrypoint = entry.get("entrypoint")
    if not isinstance(entrypoint, str) or ":" not in entrypoint:
        raise DreamgymError(
            f"{where}: entrypoint {entrypoint!r} is not `path/to/file.py:flow_function`; fix it in {PROJECT_FILE}"
        )
    parameters = entry.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise DreamgymError(f"{where}: parameters must be a mapping, got {parameters!r}; fix it in {PROJECT_FILE}")

    cron, timezone = _cron_schedule(entry, where)

    work_pool = entry.get("work_pool") or {}
    if not isinstance(work_pool, dict):
        raise DreamgymError(f"{where}: work_pool must be a mapping (name, work_queue_name); fix it in {PROJECT_FILE}")
    pull = entry.get("pull", document.get("pull")) or []  # a deployment's own steps replace the project's
    if not isinstance(pull, list) or not all(isinstance(step, dict) for step in pull):
        raise DreamgymError(f"{where}: pull must be a list of steps; fix it in {PROJECT_FILE}")
    return DeploymentSpec(
        name=name,
        entrypoint=entrypoint,
        parameters=dict(parameters),
        cron=cron,
        timezone=timezone,
        work_pool=work_pool.get("name"),
        work_queue=work_pool.get("work_queue_name"),
        work_pool_type=work_pool.get("type"),
        pull_steps=tuple(pull),
        tags=tuple(str(tag) for tag in entry.get("tags") or ()),
        description=entry.get("description"),
    )


def _cron_schedule(entry: dict[str, Any], where: str) -> tuple[str, str]:
    """The deployment's one cron schedule (`schedules:` list, or the older `schedule:` mapping)."""
    schedules = entry.get("schedules")
    if schedules is None:
        schedules = [entry["schedule"]] if entry.get("schedule") else []
    if not isinstance(schedules, list):
        schedules = [schedules]
    crons = [item for item in schedules if isinstance(item, dict) and item.get("cron")]
    fix = f'add `schedules: [{{cron: "0 2 * * *", timezone: UTC}}]` to it in {PROJECT_FILE}'
    if not crons:
        raise DreamgymError(f"{where}: no cron schedule; {fix}")
    if len(crons) > 1:
        raise DreamgymError(
            f"{where}: {len(crons)} cron schedules; dreamgym serve takes one, keep one in {PROJECT_FILE}"
        )
    item = crons[0]

    from prefect.client.schemas.schedules import CronSchedule  # imports Prefect
    from pydantic import ValidationError

    options = {key: item[key] for key in ("timezone", "day_or") if item.get(key) is not None}
    try:
        schedule = CronSchedule(cron=str(item["cron"]), **options)
    except ValidationError as exc:
        reasons = "; ".join(error["msg"].removeprefix("Value error, ") for error in exc.errors())
        zone = f" (timezone {options['timezone']!r})" if "timezone" in options else ""
        raise DreamgymError(
            f"{where}: cron {item['cron']!r}{zone} is not valid: {reasons}; fix it in {PROJECT_FILE}"
        ) from exc
    return schedule.cron, schedule.timezone or "UTC"


def deployment_options(spec: DeploymentSpec) -> dict[str, Any]:
    """Keyword arguments for `Flow.serve` / `Flow.to_deployment`: the spec's name, schedule (with
    its timezone: `cron=` alone would drop it) and parameters."""
    from prefect.schedules import Cron  # imports Prefect

    return {
        "name": spec.name,
        "schedules": [Cron(spec.cron, timezone=spec.timezone)],
        "parameters": dict(spec.parameters),
    }


def load_flow(spec: DeploymentSpec, project_dir: str | Path) -> Flow:
    """The Prefect flow the spec's entrypoint names, loaded from `project_dir` (put first on
    `sys.path` so the entrypoint's `flows.*` / `dreamgym.*` imports come from that checkout)."""
    from prefect.exceptions import MissingFlowError  # imports Prefect
    from prefect.flows import load_flow_from_entrypoint

    project_dir = Path(project_dir).resolve()
    path, _, function = spec.entrypoint.rpartition(":")
    script = project_dir / path
    if not script.is_file():
        raise DreamgymError(
            f"deployment {spec.name!r}: entrypoint {spec.entrypoint!r}: {script} not "
            f"found; fix the entrypoint in {PROJECT_FILE}"
        )
    if str(project_dir) not in sys.path:
        sys.path.insert(0, str(project_dir))
    try:
        # No placeholder flow: a script that fails to import must fail here, not when it runs.
        return load_flow_from_entrypoint(f"{script}:{function}", use_placeholder_flow=False)
    except MissingFlowError as exc:
        raise DreamgymError(
            f"deployment {spec.name!r}: entrypoint {spec.entrypoint!r}: "
            f"{str(exc).strip()}; fix the entrypoint in {PROJECT_FILE}"
        ) from exc


def register_deployment(spec: DeploymentSpec, project_dir: str | Path) -> str:
    """Create or update the spec's deployment on the Prefect server PREFECT_API_URL names, for its
    work pool's workers to run; return its full name, `flow/deployment`.

    This is what `prefect deploy` does with prefect.yaml — the same entrypoint, parameters,
    schedule, work pool and pull steps (their `{{ $VAR }}` placeholders are left for the worker
    to fill in from its environment). `prefect deploy` itself, and Flow.deploy, fail in Prefect
    3.8.8 under the FastAPI it needs here: asking which workers are online sends `limit: null`,
    which the server refuses (HTTP 422).
    """
    import asyncio

    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.exceptions import ObjectNotFound
    from prefect.utilities.callables import parameter_schema

    if not spec.work_pool:
        raise DreamgymError(f"deployment {spec.name!r} names no work_pool; give it one in {PROJECT_FILE}")
    pipeline_flow = load_flow(spec, project_dir)

    async def register() -> str:
        async with get_client() as client:
            try:
                await client.read_work_pool(spec.work_pool)
            except ObjectNotFound:
                raise DreamgymError(
                    f"no work pool {spec.work_pool!r} on the Prefect server: start its worker first "
                    f"(`prefect worker start --pool {spec.work_pool} --type {spec.work_pool_type or 'process'}` "
                    "creates it; `dreamgym stack up` starts one)"
                ) from None
            flow_id = await client.create_flow(pipeline_flow)
            deployment_id = await client.create_deployment(  # an upsert on (flow, name)
                flow_id=flow_id,
                name=spec.name,
                description=spec.description,
                tags=list(spec.tags),
                entrypoint=spec.entrypoint,
                parameters=dict(spec.parameters),
                parameter_openapi_schema=parameter_schema(pipeline_flow).model_dump_for_openapi(),
                enforce_parameter_schema=True,
                schedules=[DeploymentScheduleCreate(schedule=CronSchedule(cron=spec.cron, timezone=spec.timezone))],
                work_pool_name=spec.work_pool,
                work_queue_name=spec.work_queue,
                pull_steps=[dict(step) for step in spec.pull_steps],
            )
            await client.read_deployment(deployment_id)  # it is there before we say so
            return f"{pipeline_flow.name}/{spec.name}"

    return asyncio.run(register())


@contextmanager
def local_prefect_server(prefect_home: str | Path, port: int = 4200, timeout: float = 180.0) -> Iterator[str]:
    """A Prefect server on this machine (the temporary one has no scheduler), its database in
    `prefect_home`, stopped on exit; yields its API URL. Its log is `<prefect_home>/server.log`."""
    prefect_home = Path(prefect_home)
    prefect_home.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}/api"
    environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    environment["PREFECT_HOME"] = str(prefect_home)
    log_path = prefect_home / "server.log"
    with log_path.open("ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + timeout
        while not _healthy(url):
            if server.poll() is not None:
                tail = " ".join(log_path.read_text(errors="replace").split()[-40:])
                raise DreamgymError(
                    f"the local Prefect server stopped at start (port {port} taken?): ...{tail}; "
                    "pass --port with a free port, or set PREFECT_API_URL to a running server"
                )
            if time.monotonic() > deadline:
                raise DreamgymError(
                    f"the local Prefect server did not answer within {timeout:.0f}s (log: "
                    f"{log_path}); set PREFECT_API_URL to a running server instead"
                )
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def serve_deployment(
    project: Path, params: Path, name: str, port: int, prefect_home: str | Path, say: Callable[[str], None]
) -> None:
    """`dreamgym serve`: serve deployment `name` of `<project>/prefect.yaml` from this process, on
    the Prefect server PREFECT_API_URL names, else on one started here (`local_prefect_server`,
    its database in `prefect_home`), until interrupted. Refuses a parameter file (`params`) other
    than the one the deployment runs with. `say` reports progress; the serving line goes to
    stdout. Call after `configure_services` (Prefect reads its settings at import)."""
    spec = load_deployment(project, name)
    served_params = spec.parameters.get("params")
    if served_params is not None and (project / str(served_params)).resolve() != params.resolve():
        raise DreamgymError(
            f"--params {params}: deployment {spec.name!r} runs with params="
            f"{served_params!r} (prefect.yaml); serve that file, or change the "
            "deployment's parameters in prefect.yaml"
        )
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with contextlib.ExitStack() as stack:
        if not PREFECT_API_URL.value():
            say(f"starting a local Prefect server (UI http://127.0.0.1:{port}) ...")
            url = stack.enter_context(local_prefect_server(prefect_home, port))
            stack.enter_context(temporary_settings({PREFECT_API_URL: url}))
        os.chdir(project)  # every run resolves the entrypoint and the relative params path here
        pipeline_flow = load_flow(spec, project)
        print(
            f"serving {pipeline_flow.name}/{spec.name} from {project / 'prefect.yaml'}: cron "
            f"'{spec.cron}' ({spec.timezone}), parameters {json.dumps(spec.parameters)}; run it now with "
            f"`prefect deployment run '{pipeline_flow.name}/{spec.name}'`; Ctrl+C stops serving",
            flush=True,
        )
        pipeline_flow.serve(**deployment_options(spec), print_starting_message=False)


def deploy(project: Path, name: str) -> str:
    """`dreamgym deploy`: register deployment `name` of `<project>/prefect.yaml` on the shared
    Prefect server PREFECT_API_URL names (refused without one); the line saying so."""
    if not os.environ.get("PREFECT_API_URL"):
        raise DreamgymError(
            "PREFECT_API_URL is not set: a deployment is registered on a shared Prefect server "
            "(`dreamgym stack up` starts one and writes its URL to client.env); to run on a schedule "
            "without one, use `dreamgym serve`"
        )
    spec = load_deployment(project, name)
    full_name = register_deployment(spec, project)
    return (
        f"deployment {full_name} on {os.environ['PREFECT_API_URL']}: cron '{spec.cron}' ({spec.timezone}), "
        f"work pool {spec.work_pool}; run it now with `prefect deployment run '{full_name}'`"
    )


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
