"""Before a run starts: are the servers the environment names reachable?

A pipeline pointed at a shared server that is down would otherwise find out late — the buffer's
database only at the upsert, minutes in, and MLflow after its client's retries (minutes more) —
and with a traceback. `check_servers` asks each configured server once, briefly, and reports all
that did not answer in one error naming the variable and the fix. Embedded services (the variable
unset) are not checked: the run starts them. Credentials never appear in the message.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import httpx

from dreamgym.errors import DreamgymError

TIMEOUT_SECONDS = 5.0
FIX = (
    "start it (`dreamgym stack up`; `dreamgym stack status` shows which service is down) "
    "or unset {var} to use the embedded default"
)


class ServerUnreachable(DreamgymError):
    """A server the environment names does not answer."""


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _reason(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _http_problem(name: str, var: str, url: str, health_path: str) -> str | None:
    try:
        response = httpx.get(url.rstrip("/") + health_path, timeout=TIMEOUT_SECONDS)
    except httpx.HTTPError as error:
        return f"cannot reach the {name} at {_without_credentials(url)} ({var}): {_reason(error)}"
    if response.status_code >= 500:
        return f"the {name} at {_without_credentials(url)} ({var}) answers HTTP {response.status_code}"
    return None


def _database_problem(url: str) -> str | None:
    import psycopg
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    try:
        params = parsed.translate_connect_args(username="user", database="dbname")
        with psycopg.connect(connect_timeout=int(TIMEOUT_SECONDS), **params):
            return None
    except psycopg.OperationalError as error:
        return f"cannot connect to the buffer's database at {shown} (DATABASE_URL): {_reason(error)}"


def check_servers(environ: dict[str, str] | None = None) -> None:
    """Raise `ServerUnreachable` naming every configured server that does not answer."""
    environ = dict(os.environ if environ is None else environ)
    problems = []
    tracking = environ.get("MLFLOW_TRACKING_URI", "")
    if tracking.startswith(("http://", "https://")):
        problem = _http_problem("MLflow tracking server", "MLFLOW_TRACKING_URI", tracking, "/health")
        problems.append(problem and f"{problem}; {FIX.format(var='MLFLOW_TRACKING_URI')}")
    prefect = environ.get("PREFECT_API_URL", "")
    if prefect:
        problem = _http_problem("Prefect server", "PREFECT_API_URL", prefect, "/health")
        problems.append(problem and f"{problem}; {FIX.format(var='PREFECT_API_URL')}")
    database = environ.get("DATABASE_URL", "")
    if database:
        problem = _database_problem(database)
        problems.append(problem and f"{problem}; {FIX.format(var='DATABASE_URL')}")
    problems = [problem for problem in problems if problem]
    if problems:
        raise ServerUnreachable("; and ".join(problems))
