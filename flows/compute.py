"""Where the work that fans out runs: in the flow's process (the default), or on a Ray cluster.

`compute.task_runner: local` changes nothing: every stage runs as it always did, in the flow's
process with its own threads or worker processes, and Ray is never started. With `ray` (or the
environment variable DREAMGYM_RAY_ADDRESS set) the pipeline's flows get prefect-ray's
`RayTaskRunner`, and a stage task that fans out cuts its work into pieces
(dreamgym/ops/fanout.py), each piece a Prefect task that a Ray worker runs; the pieces' results are
put back in order, so the stage returns what it returns locally. A stage task decides by the
task runner its flow actually has (`fanout`), so a flow started without the switch runs locally.

What a worker needs travels with the Ray job, not with the process that started it:
- its environment (`worker_environment`): Ray workers inherit the environment Ray started with,
  and a remote cluster's none of this machine's; the Prefect API this process talks to (also its
  temporary local server, or the one a test harness sets only in Prefect's settings), the MLflow
  store and the thread and offline settings go into the job's runtime_env;
- its inputs and results: paths on a filesystem the workers share (games, a policy's folder, part
  files) and small values (records, paths), never models. Piece tasks are neither cached nor
  persisted: the stage task around them is (flows/caching.py), in this process's result store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from prefect import Flow, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from pydantic import ValidationError

from dreamgym.errors import ConfigError
from dreamgym.ops.config import ComputeConfig

if TYPE_CHECKING:  # Ray and prefect-ray are the `team` extra: imported only when asked for
    from prefect_ray import RayTaskRunner

R = TypeVar("R")

RAY_ADDRESS_VARIABLE = "DREAMGYM_RAY_ADDRESS"
# The environment a piece reads, when set here: the tracking store, and how it computes (threads;
# Hugging Face offline). PREFECT_API_URL is added by `worker_environment`. Not DATABASE_URL: no
# piece opens the buffer, and its password would sit in the Ray job's runtime_env for all to read.
FORWARDED_VARIABLES = ("MLFLOW_TRACKING_URI", "OMP_NUM_THREADS", "HF_HUB_OFFLINE", "DVC_NO_ANALYTICS")
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


def compute_settings(config: ComputeConfig, environ: dict[str, str] | None = None) -> ComputeConfig:
    """`config` as the environment amends it: DREAMGYM_RAY_ADDRESS, when set, means Ray at that
    address whatever params.yaml says (an operator points a run at a cluster without editing the
    versioned parameters). Checked like params.yaml's value."""
    address = (os.environ if environ is None else environ).get(RAY_ADDRESS_VARIABLE, "").strip()
    if not address:
        return config
    try:
        return dataclasses.replace(config, task_runner="ray", ray_address=address)
    except ValidationError as error:
        reason = error.errors()[0]["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{RAY_ADDRESS_VARIABLE}={address!r}: {reason}; or unset it to run locally") from None


def prefect_api_url() -> str:
    """The Prefect API this process talks to: PREFECT_API_URL, or the temporary local server
    Prefect starts without one (started now if it is not running yet)."""
    from prefect.client.orchestration import get_client

    return str(get_client(sync_client=True).api_url).rstrip("/")


def worker_environment() -> dict[str, str]:
    """The environment variables a Ray worker gets (the job's runtime_env)."""
    forwarded = {name: os.environ[name] for name in FORWARDED_VARIABLES if name in os.environ}
    return forwarded | {"PREFECT_API_URL": prefect_api_url()}


def _host(address: str) -> str:
    return urlsplit(address if "://" in address else f"//{address}").hostname or ""


def ray_init_kwargs(compute: ComputeConfig) -> dict[str, Any]:
    """`ray.init`'s arguments for `compute`. The address goes in as a keyword, never as
    RayTaskRunner's `address`: prefect-ray starts a new local Ray for 'auto' instead of joining
    the running cluster."""
    environment = worker_environment()
    remote = compute.ray_address not in ("local", "auto") and _host(compute.ray_address) not in _LOOPBACK
    if remote and _host(environment["PREFECT_API_URL"]) in _LOOPBACK:
        raise ConfigError(
            f"compute.ray_address {compute.ray_address!r} is a cluster whose workers cannot reach this "
            f"machine's Prefect API ({environment['PREFECT_API_URL']}): set PREFECT_API_URL to a Prefect "
            "server they can reach, or use ray_address 'local'"
        )
    kwargs: dict[str, Any] = {"address": compute.ray_address, "runtime_env": {"env_vars": environment}}
    if compute.ray_address == "local":
        # No dashboard: it costs seconds of start-up and a port, and the Prefect UI shows the runs.
        kwargs |= {"num_cpus": compute.ray_workers, "include_dashboard": False}
    return kwargs


def _ray_task_runner() -> type[RayTaskRunner]:
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise ConfigError(
            "compute.task_runner 'ray' (or DREAMGYM_RAY_ADDRESS) needs Ray and prefect-ray: install the team "
            "extra (pip install -e '.[team]'), or run locally"
        ) from None
    return RayTaskRunner


def task_runner(compute: ComputeConfig) -> RayTaskRunner | None:
    """The task runner of a flow under `compute`: None for local (the flow keeps its own)."""
    if compute.task_runner == "local":
        return None
    return _ray_task_runner()(init_kwargs=ray_init_kwargs(compute))


def on_compute(flow: Flow, compute: ComputeConfig) -> Flow:
    """`flow` with the task runner `compute` asks for (the flow itself when local)."""
    runner = task_runner(compute)
    return flow if runner is None else flow.with_options(task_runner=runner)


@contextlib.contextmanager
def ray_cluster(compute: ComputeConfig) -> Iterator[None]:
    """Hold one Ray connection (a local Ray started, or a cluster joined) while the body runs,
    so that sub-flows share it: a RayTaskRunner finding Ray running uses it and leaves it running,
    where each would otherwise start its own local Ray and workers and stop them, seconds each time
    (measured: results log, 2026-11-25).
    Local: nothing."""
    if compute.task_runner == "local":
        yield
        return
    _ray_task_runner()  # installed?
    import ray

    if ray.is_initialized():  # someone else's: theirs to stop
        yield
        return
    ray.init(**ray_init_kwargs(compute), namespace="prefect")
    try:
        yield
    finally:
        ray.shutdown()


@task(cache_policy=NO_CACHE, persist_result=False)
def piece_task(fn: Callable[..., Any], call: dict[str, Any]) -> Any:
    """One piece of a stage (a module-level function of dreamgym/ops/fanout.py and its arguments)."""
    return fn(**call)


@dataclass(frozen=True)
class PrefectFanout:
    """dreamgym/ops/fanout.py's `Fanout` as Prefect tasks on the flow's task runner."""

    width: int

    def map(self, fn: Callable[..., R], calls: Sequence[dict[str, Any]]) -> list[R]:
        named = piece_task.with_options(name=fn.__name__.replace("_", "-"))
        futures = [named.submit(fn, call) for call in calls]
        return [future.result() for future in futures]  # in the calls' order; a failed piece raises


def fanout() -> PrefectFanout | None:
    """How a stage task spreads its work: over the Ray cluster its flow runs on (as many pieces
    as the cluster has CPUs), or None when the flow's task runner is not Ray (the stage runs in
    this process, as it always has)."""
    context = FlowRunContext.get()
    runners = sys.modules.get("prefect_ray.task_runners")  # not imported: no flow runs on Ray
    if context is None or runners is None or not isinstance(context.task_runner, runners.RayTaskRunner):
        return None
    import ray

    return PrefectFanout(width=max(1, int(ray.cluster_resources().get("CPU", 1))))
