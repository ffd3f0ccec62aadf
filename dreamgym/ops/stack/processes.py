"""Bring the team stack up and down as ordinary processes, for machines without Docker.

Everything lives under one folder (`--dir`, .dreamgym/stack by default):

    stack.json            the process id of each running service
    client.env            the pipeline's environment for this stack (owner-only: it holds a password)
    logs/<service>.log    each service's output
    postgres/             the database's data directory
    mlflow-artifacts/     the artifacts MLflow serves
    prefect-server/, prefect-worker/   their Prefect homes

Each service runs in its own session, so it outlives the command that started it; `up` starts the
servers that need only the database together, and `down` stops them in reverse order. A service
counts as up when its health check answers, and a start that does not get there says which
service failed and shows the end of its log.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from dreamgym.errors import DreamgymError
from dreamgym.ops.stack import postgres
from dreamgym.ops.stack.services import (
    ORDER,
    POSTGRES,
    PREFECT_WORKER,
    RAY,
    RAY_TOKEN_FILE,
    START_WAVES,
    Service,
    client_env,
    prefect_api_url,
    stack_services,
)
from dreamgym.ops.stack.settings import StackSettings

STATE_FILE = "stack.json"
CLIENT_ENV = "client.env"


class StackError(DreamgymError):
    """A service of the stack did not start, or is not what the stack folder says it is."""


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None  # None: not running
    healthy: bool


def _alive(pid: int, program: str) -> bool:
    """Whether `pid` runs `program` (not a zombie, not a recycled pid of something else)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    return any(Path(part.decode(errors="replace")).name == Path(program).name for part in cmdline[:2])


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds a password or a token), never readable by
    others in between (created with its mode, not chmod-ed after)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _read_state(stack_dir: Path) -> dict[str, int]:
    """Service name → the process id it was started with."""
    path = stack_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def recorded_services(stack_dir: str | Path) -> set[str]:
    """The services the stack folder records as started (running or not)."""
    return set(_read_state(Path(stack_dir)))


class Stack:
    """The services of one stack folder."""

    def __init__(
        self,
        stack_dir: str | Path,
        settings: StackSettings,
        project_dir: str | Path = ".",
        with_ray: bool = False,
        ray_cpus: int | None = None,
    ) -> None:
        self.dir = Path(stack_dir).resolve()
        self.settings = settings
        self.with_ray = with_ray
        self.services = {
            service.name: service
            for service in stack_services(settings, self.dir, Path(project_dir), with_ray, ray_cpus)
        }
        self._children: dict[str, subprocess.Popen] = {}  # reaped here when this process started them

    # -- state -----------------------------------------------------------------------------------
    def _state(self) -> dict[str, int]:
        return _read_state(self.dir)

    def _save_state(self, state: dict[str, int]) -> None:
        path = self.dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(path)

    def log_path(self, name: str) -> Path:
        return self.dir / "logs" / f"{name}.log"

    def pid(self, name: str) -> int | None:
        pid = self._state().get(name)
        child = self._children.get(name)
        if child is not None and child.poll() is not None:  # reap it: a zombie would look alive
            return None
        return pid if pid and _alive(pid, self.services[name].argv[0]) else None

    # -- health ----------------------------------------------------------------------------------
    def healthy(self, name: str) -> bool:
        service = self.services[name]
        try:
            if service.health_url:
                return httpx.get(service.health_url, timeout=5).is_success
            if name == POSTGRES:
                return self._postgres_accepts()
            if name == PREFECT_WORKER:
                return self._worker_online()
            if name == RAY:
                return self._port_open(self.settings.ray_port) and self._port_open(self.settings.ray_client_port)
        except (httpx.HTTPError, OSError):
            return False
        return self.pid(name) is not None

    def _port_open(self, port: int) -> bool:
        with socket.socket() as probe:
            probe.settimeout(2)
            return probe.connect_ex((self.settings.host, port)) == 0

    def _postgres_accepts(self) -> bool:
        result = subprocess.run(
            [
                str(postgres.postgres_bin_dir() / "pg_isready"),
                "-h",
                self.settings.host,
                "-p",
                str(self.settings.postgres_port),
            ],
            capture_output=True,
        )
        return result.returncode == 0

    def _worker_online(self) -> bool:
        url = f"{prefect_api_url(self.settings)}/work_pools/{self.settings.work_pool}/workers/filter"
        response = httpx.post(url, json={}, timeout=5)
        return response.is_success and any(worker.get("status") == "ONLINE" for worker in response.json())

    # -- start and stop --------------------------------------------------------------------------
    def up(self, progress: Callable[[str], None] = lambda _: None) -> Path:
        """Start every service not running, a wave at a time (`START_WAVES`: the services of a
        wave start together once the wave before is healthy); write and return client.env."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.with_ray:
            self._ensure_ray_token()
        env_file = self.write_client_env()
        for wave in START_WAVES:
            launched = {name: self._launch(name) for name in wave if name in self.services}
            for name, child in launched.items():
                if child is not None:
                    self._until_ready(name, child)
                progress(f"{name}: {'started' if child is not None else 'already running'}")
        return env_file

    def start(self, name: str) -> bool:
        """Start one service unless it runs; wait until it is healthy. Return whether it was started."""
        child = self._launch(name)
        if child is not None:
            self._until_ready(name, child)
        return child is not None

    def _launch(self, name: str) -> subprocess.Popen | None:
        """The service's process, started unless one runs (None), not yet waited for."""
        service = self.services[name]
        if self.pid(name) is not None:
            return None
        user = None
        if name == POSTGRES:
            postgres.init_data_dir(self.dir / "postgres", self.settings)
            user = postgres.system_user()
        log = self.log_path(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as output:
            child = subprocess.Popen(
                service.argv,
                env={**os.environ, **service.env},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: it outlives us, and stops as a whole
                cwd=self.dir,
                user=user,
            )
        self._children[name] = child
        self._save_state({**self._state(), name: child.pid})
        return child

    def _until_ready(self, name: str, child: subprocess.Popen) -> None:
        self._wait_ready(self.services[name], child)
        if name == POSTGRES:
            postgres.bootstrap(self.settings)

    def _wait_ready(self, service: Service, child: subprocess.Popen) -> None:
        deadline = time.monotonic() + service.ready_seconds
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise StackError(
                    f"{service.name} exited with code {child.returncode} while starting; the end of "
                    f"{self.log_path(service.name)}:\n{_log_tail(self.log_path(service.name))}"
                )
            if self.healthy(service.name):
                return
            time.sleep(0.5)
        raise StackError(
            f"{service.name} did not become healthy in {service.ready_seconds:.0f} s; the end of "
            f"{self.log_path(service.name)}:\n{_log_tail(self.log_path(service.name))}"
        )

    def stop(self, name: str, kill: bool = False) -> bool:
        """Stop one service (`kill`: SIGKILL at once, as a crash would). Return whether it ran."""
        pid = self.pid(name)
        if pid is None:
            self._forget(name)
            return False
        service = self.services[name]
        if kill:
            os.killpg(pid, signal.SIGKILL)
        elif service.stops_its_processes:
            os.kill(pid, getattr(signal, service.stop_signal))
        else:
            os.killpg(pid, getattr(signal, service.stop_signal))
        deadline = time.monotonic() + service.stop_seconds
        while self.pid(name) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.pid(name) is not None:
            os.killpg(pid, signal.SIGKILL)
        child = self._children.pop(name, None)
        if child is not None:
            child.wait()
        self._forget(name)
        return True

    def _forget(self, name: str) -> None:
        state = self._state()
        if name in state:
            del state[name]
            self._save_state(state)

    def restart(self, name: str) -> None:
        self.stop(name)
        self.start(name)

    def down(self, progress: Callable[[str], None] = lambda _: None) -> None:
        for name in reversed([name for name in ORDER if name in self.services]):
            if self.stop(name):
                progress(f"{name}: stopped")

    def status(self) -> list[ServiceStatus]:
        return [ServiceStatus(name, self.pid(name), self.healthy(name)) for name in self.services]

    # -- clients ---------------------------------------------------------------------------------
    def client_env(self) -> dict[str, str]:
        return client_env(self.settings, self.dir, self.with_ray)

    def _ensure_ray_token(self) -> None:
        """The stack's Ray token, made once: what a client needs to join the head."""
        import secrets

        path = self.dir / RAY_TOKEN_FILE
        if not path.exists():
            _write_private(path, secrets.token_hex(32))

    def write_client_env(self) -> Path:
        path = self.dir / CLIENT_ENV
        lines = [f"# Written by `dreamgym stack up`: load with  set -a; . {path}; set +a"]
        lines += [f"{key}='{value}'" for key, value in self.client_env().items()]
        _write_private(path, "\n".join(lines) + "\n")
        return path
