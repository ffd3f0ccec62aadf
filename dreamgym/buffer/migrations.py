"""Numbered SQL migrations for the buffer, applied in order and recorded with a checksum.

Files `sql/NNN_name.sql` are applied once each, in number order, inside one transaction that
holds an advisory lock, so two processes migrating at once apply each migration once. The text
`{embedding_dim}` in a file is replaced by the encoder's dimension before it runs; the checksum is
over the text that ran. A migration already applied whose text has changed is refused: applied
migrations are history, and a change goes into a new numbered file.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Engine

from dreamgym.buffer.config import BufferConfig
from dreamgym.errors import DreamgymError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "sql"
_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
# Any constant works; it only has to be the same for every process migrating this database.
_ADVISORY_LOCK = 0x64726561  # "drea"


class MigrationError(DreamgymError):
    """A migration history that does not match the migration files."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    checksum: str


def load_migrations(embedding_dim: int, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files of `directory`, rendered for `embedding_dim`, in version order."""
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNN_name.sql (three digits, lower-case name)")
        sql = path.read_text().replace("{embedding_dim}", str(embedding_dim))
        migrations.append(
            Migration(version=int(match[1]), name=path.stem, sql=sql, checksum=hashlib.sha256(sql.encode()).hexdigest())
        )
    if not migrations:
        raise MigrationError(
            f"no migration files (NNN_name.sql) in {directory}: the buffer's schema ships "
            "in the checkout's sql/ folder; run from a complete checkout"
        )
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a number in {directory}")
    return migrations


def apply_migrations(engine: Engine, migrations: list[Migration]) -> list[str]:
    """Apply the migrations not applied yet; return their names (empty when up to date)."""
    applied_now = []
    with engine.begin() as connection:
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_LOCK})
        connection.exec_driver_sql(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        recorded = {
            row.version: row
            for row in connection.execute(text("SELECT version, name, checksum FROM schema_migrations"))
        }
        unknown = sorted(set(recorded) - {m.version for m in migrations})
        if unknown:
            names = ", ".join(recorded[v].name for v in unknown)
            raise MigrationError(
                f"the database has migrations this code does not know ({names}); "
                "update dreamgym, or point DATABASE_URL at another database"
            )
        for migration in migrations:
            previous = recorded.get(migration.version)
            if previous is not None:
                if previous.checksum != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.name} was applied with checksum "
                        f"{previous.checksum[:12]} but its file now gives {migration.checksum[:12]}: "
                        "applied migrations must not change; put the change in a new numbered "
                        "migration (a changed buffer.embedding_dim needs a new database)"
                    )
                continue
            connection.exec_driver_sql(migration.sql)
            connection.execute(
                text("INSERT INTO schema_migrations (version, name, checksum) VALUES (:version, :name, :checksum)"),
                {"version": migration.version, "name": migration.name, "checksum": migration.checksum},
            )
            applied_now.append(migration.name)
    return applied_now


def open_migrated(run_dir, config: BufferConfig, url: str | None = None):
    """Open the buffer database and bring its schema up to date."""
    from dreamgym.buffer.db import open_database  # db does not need migrations

    database = open_database(run_dir, url, shared_buffers=config.embedded_shared_buffers)
    apply_migrations(database.engine, load_migrations(config.embedding_dim))
    return database
