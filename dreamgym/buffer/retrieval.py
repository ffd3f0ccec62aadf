"""Retrieve the transitions most similar to a query, many queries in one round-trip.

Similarity is cosine (embeddings are unit length) through the HNSW index. A batch of queries is
one statement: the query vectors and their filters are unnested into rows, and a LATERAL subquery
takes each one's top k from the index (ids and distances only: when the planner prefers an exact
scan, on a small buffer or with a large ef_search, it sorts narrow rows). The statement returns ids
alone, and the rows are read by id only where this open database has not read them before
(`Database.rows`): a row never changes once written (the upsert is ON CONFLICT DO NOTHING), and
DreamEnv's re-ranking fetches hundreds of candidates per query, the same few thousand rows again
and again (measured: results log, 2026-11-25). Every hit of a row shares that row,
read-only (a `MappingProxyType`), and the query vectors go in pgvector's binary form (`%b`): a copy
of the row per hit (thousands a DreamEnv step) and vectors as text slowed the search (measured:
results log, 2026-11-30).
Filters are bound parameters, never SQL text. With filters the index keeps scanning until k rows
pass them (pgvector >= 0.8's iterative scan), so a selective filter does not return fewer than k
neighbours when more exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
from psycopg.types.json import Jsonb

from dreamgym.buffer.db import Database

RETURNED_COLUMNS = (
    "content_hash",
    "trajectory_id",
    "task_id",
    "env",
    "step",
    "state",
    "action",
    "next_state",
    "reward",
    "score",
    "terminated",
    "truncated",
    "won",
    "lost",
    "reasoning",
    "source",
    "policy",
    "model_version",
)


@dataclass(frozen=True)
class Filters:
    """Which transitions a query may return (all by default)."""

    env: str | None = None
    source: str | None = None  # "real" or "synthetic"
    exclude_trajectory_ids: tuple[str, ...] = ()
    exclude_task_id: str | None = None


class Neighbour(NamedTuple):
    similarity: float
    transition: Mapping  # the row, read-only and shared with the other hits of it: copy it to change it


SEARCH_SQL = """
    SELECT q.query_index, 1 - hit.distance AS similarity, hit.id
    FROM unnest(%(vectors)b::vector[], %(envs)s::text[], %(sources)s::text[],
                %(excluded_tasks)s::text[], %(excluded_trajectories)s::jsonb[])
         WITH ORDINALITY AS q(vector, env, source, excluded_task, excluded_trajectories, query_index)
    CROSS JOIN LATERAL (
        SELECT c.id, c.embedding <=> q.vector AS distance
        FROM transitions c
        WHERE c.embedding IS NOT NULL
          AND (q.env IS NULL OR c.env = q.env)
          AND (q.source IS NULL OR c.source = q.source)
          AND (q.excluded_task IS NULL OR c.task_id <> q.excluded_task)
          AND (q.excluded_trajectories IS NULL OR NOT q.excluded_trajectories ? c.trajectory_id)
        ORDER BY c.embedding <=> q.vector
        LIMIT %(k)s
    ) AS hit
    ORDER BY q.query_index, hit.distance
"""
ROWS_SQL = f"SELECT id, {', '.join(RETURNED_COLUMNS)} FROM transitions WHERE id = ANY(%s)"


def search_parameters(vectors: np.ndarray, per_query: Sequence[Filters], k: int) -> dict:
    """The bound parameters of SEARCH_SQL."""
    return {
        "vectors": list(vectors),
        "envs": [f.env for f in per_query],
        "sources": [f.source for f in per_query],
        "excluded_tasks": [f.exclude_task_id for f in per_query],
        "excluded_trajectories": [
            Jsonb(list(f.exclude_trajectory_ids)) if f.exclude_trajectory_ids else None for f in per_query
        ],
        "k": k,
    }


def configure_session(database: Database, cursor, connection_info: dict, ef_search: int, filtered: bool) -> None:
    """Set the HNSW search settings of a pooled connection, sending them only when they change.

    Iterative scans (pgvector >= 0.8) keep a filtered query from returning fewer than k rows, and
    cost ~0.5 ms a query when nothing is filtered out, so they are on only for filtered queries.
    """
    wanted = (ef_search, filtered)
    if connection_info.get("hnsw") == wanted:
        return
    settings, values = "SELECT set_config('hnsw.ef_search', %s, false)", [str(ef_search)]
    if database.pgvector_version >= (0, 8):
        settings += ", set_config('hnsw.iterative_scan', %s, false)"
        values.append("strict_order" if filtered else "off")
    cursor.execute(settings, values)
    connection_info["hnsw"] = wanted


def search(
    database: Database,
    vectors: np.ndarray,
    k: int,
    filters: Filters | Sequence[Filters] = Filters(),
    ef_search: int = 80,
) -> list[list[Neighbour]]:
    """The k nearest transitions of each query vector (one list per query, most similar first).

    `filters` is one `Filters` for every query or one per query.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"expected a (queries, dim) array, got shape {vectors.shape}")
    per_query = [filters] * len(vectors) if isinstance(filters, Filters) else list(filters)
    if len(per_query) != len(vectors):
        raise ValueError(f"{len(per_query)} filters for {len(vectors)} queries")
    if not len(vectors):
        return []
    results: list[list[Neighbour]] = [[] for _ in per_query]
    # The driver's cursor directly: SQLAlchemy's statement and row handling cost ~1 ms a query.
    with database.reader.connect() as connection, connection.connection.driver_connection.cursor() as cursor:
        configure_session(database, cursor, connection.info, ef_search, filtered=any(f != Filters() for f in per_query))
        cursor.execute(SEARCH_SQL, search_parameters(vectors, per_query, k))
        hits = cursor.fetchall()
        ids = {row_id for _, _, row_id in hits}
        rows = database.rows.known(ids)
        missing = list(ids - rows.keys())
        if missing:
            cursor.execute(ROWS_SQL, (missing,))
            read = {
                row_id: MappingProxyType(dict(zip(RETURNED_COLUMNS, values))) for row_id, *values in cursor.fetchall()
            }
            database.rows.add(read)
            rows |= read
    for query_index, similarity, row_id in hits:
        results[query_index - 1].append(Neighbour(float(similarity), rows[row_id]))
    return results


def stored_embeddings(database: Database, hashes: Sequence[str]) -> dict[str, np.ndarray]:
    """The stored embeddings of those content hashes the buffer holds."""
    with database.reader.connect() as connection, connection.connection.driver_connection.cursor() as cursor:
        cursor.execute(
            "SELECT content_hash, embedding FROM transitions WHERE content_hash = ANY(%s) AND embedding IS NOT NULL",
            (list(hashes),),
        )
        return {
            content: np.asarray(vector.to_numpy() if hasattr(vector, "to_numpy") else vector, dtype=np.float32)
            for content, vector in cursor.fetchall()
        }


def task_instructions(database: Database, task_ids: Iterable[str]) -> dict[str, str]:
    """The instruction of each of these tasks that the buffer holds."""
    task_ids = sorted(set(task_ids))
    if not task_ids:
        return {}
    with database.reader.connect() as connection, connection.connection.driver_connection.cursor() as cursor:
        cursor.execute("SELECT task_id, instruction FROM tasks WHERE task_id = ANY(%s)", (task_ids,))
        return dict(cursor.fetchall())


def stored_trajectories(database: Database, trajectory_ids: Iterable[str], source: str | None = None) -> set[str]:
    """Those of `trajectory_ids` that the buffer holds transitions of (of `source` only, if given)."""
    trajectory_ids = sorted(set(trajectory_ids))
    if not trajectory_ids:
        return set()
    sql = "SELECT DISTINCT trajectory_id FROM transitions WHERE trajectory_id = ANY(%s)"
    if source is not None:
        sql += " AND source = %s"
    with database.reader.connect() as connection, connection.connection.driver_connection.cursor() as cursor:
        cursor.execute(sql, (trajectory_ids, source) if source is not None else (trajectory_ids,))
        return {trajectory_id for (trajectory_id,) in cursor.fetchall()}


def nearest_transitions(
    database: Database,
    encoder: str,
    task: str,
    state: str,
    action: str,
    k: int,
    ef_search: int,
    env: str | None = None,
    source: str | None = None,
    exclude_task: bool = False,
) -> list[dict]:
    """`dreamgym buffer query`: the `k` stored transitions nearest to (task, state, action), each
    a dict of its columns and its `similarity` (rounded to 6 places). `task` is a stored task id
    (its instruction is embedded; `exclude_task` then leaves that task out) or an instruction."""
    from sqlalchemy import text

    from dreamgym.buffer.embeddings import Encoder, transition_text

    with database.engine.connect() as connection:
        instruction = connection.execute(text("SELECT instruction FROM tasks WHERE task_id = :t"), {"t": task}).scalar()
    filters = Filters(env=env, source=source, exclude_task_id=task if exclude_task and instruction else None)
    vector = Encoder(encoder).encode([transition_text(instruction or task, state, action)])
    [neighbours] = search(database, vector, k, filters, ef_search)
    return [{"similarity": round(n.similarity, 6), **n.transition} for n in neighbours]
