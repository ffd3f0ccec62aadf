"""What the buffer holds: counts by source and environment, and the state of its index."""

from __future__ import annotations

from sqlalchemy import text

from dreamgym.buffer.db import Database
from dreamgym.buffer.store import HNSW_INDEX


def buffer_stats(database: Database) -> dict:
    with database.engine.connect() as connection:
        by_source_env = [
            {"source": row.source, "env": row.env, "transitions": row.count}
            for row in connection.execute(
                text("SELECT source, env, count(*) FROM transitions GROUP BY source, env ORDER BY 1, 2")
            )
        ]
        totals = connection.execute(
            text(
                "SELECT (SELECT count(*) FROM transitions) AS transitions,"
                " (SELECT count(*) FROM transitions WHERE embedding IS NULL) AS without_embedding,"
                " (SELECT count(*) FROM trajectories) AS trajectories,"
                " (SELECT count(*) FROM tasks) AS tasks"
            )
        ).one()
        index = connection.execute(
            text("SELECT indexdef FROM pg_indexes WHERE tablename = 'transitions' AND indexname = :name"),
            {"name": HNSW_INDEX},
        ).scalar()
        migrations = [row[0] for row in connection.execute(text("SELECT name FROM schema_migrations ORDER BY version"))]
    return {
        "transitions": totals.transitions,
        "trajectories": totals.trajectories,
        "tasks": totals.tasks,
        "by_source_env": by_source_env,
        "without_embedding": totals.without_embedding,
        "hnsw_index": index is not None,
        "migrations": migrations,
        "database": database.display_url,
    }
