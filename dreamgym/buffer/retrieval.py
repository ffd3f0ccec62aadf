"""Retrieve the transitions most similar to a query, many queries in one round-trip.

Similarity is cosine (embeddings are unit length) through the HNSW index. A batch of queries is
one statement: the query vectors and their filters are unnested into rows, and a LATERAL subquery
takes each one's top k from the index. Filters are bound parameters, never SQL text. With filters
the index keeps scanning until k rows pass them (pgvector >= 0.8's iterative scan), so a selective
filter does not return fewer than k neighbours when more exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from psycopg.types.json import Jsonb
from sqlalchemy import text

from dreamgym.buffer.db import Database

RETURNED_COLUMNS = ("content_hash", "trajectory_id", "task_id", "env", "step", "state", "action",
                    "next_state", "reward", "terminated", "truncated", "won", "lost", "reasoning",
                    "source", "policy", "model_version")


@dataclass(frozen=True)
class Filters:
    """Which transitions a query may return (all by default)."""

    env: str | None = None
    source: str | None = None                   # "real" or "synthetic"
    exclude_trajectory_ids: tuple[str, ...] = ()
    exclude_task_id: str | None = None


@dataclass(frozen=True)
class Neighbour:
    similarity: float
    transition: dict = field(repr=False)


_SEARCH = text(f"""
    SELECT q.query_index, 1 - hit.distance AS similarity, {', '.join(f'hit.{c}' for c in RETURNED_COLUMNS)}
    FROM unnest(CAST(:vectors AS vector[]), CAST(:envs AS text[]), CAST(:sources AS text[]),
                CAST(:excluded_tasks AS text[]), CAST(:excluded_trajectories AS jsonb[]))
         WITH ORDINALITY AS q(vector, env, source, excluded_task, excluded_trajectories, query_index)
    CROSS JOIN LATERAL (
        SELECT t.embedding <=> q.vector AS distance, {', '.join(f't.{c}' for c in RETURNED_COLUMNS)}
        FROM transitions t
        WHERE t.embedding IS NOT NULL
          AND (q.env IS NULL OR t.env = q.env)
          AND (q.source IS NULL OR t.source = q.source)
          AND (q.excluded_task IS NULL OR t.task_id <> q.excluded_task)
          AND NOT (q.excluded_trajectories ? t.trajectory_id)
        ORDER BY t.embedding <=> q.vector
        LIMIT :k
    ) AS hit
    ORDER BY q.query_index, hit.distance
""")


def search(database: Database, vectors: np.ndarray, k: int,
           filters: Filters | Sequence[Filters] = Filters(), ef_search: int = 40) -> list[list[Neighbour]]:
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
    parameters = {
        "vectors": list(vectors),
        "envs": [f.env for f in per_query],
        "sources": [f.source for f in per_query],
        "excluded_tasks": [f.exclude_task_id for f in per_query],
        "excluded_trajectories": [Jsonb(list(f.exclude_trajectory_ids)) for f in per_query],
        "k": k,
    }
    results: list[list[Neighbour]] = [[] for _ in per_query]
    # SET LOCAL takes no bound parameters; set_config(..., true) is its parameterised form.
    settings = "SELECT set_config('hnsw.ef_search', :ef, true)"
    if database.pgvector_version >= (0, 8):  # iterative index scans came with pgvector 0.8
        settings += ", set_config('hnsw.iterative_scan', 'strict_order', true)"
    with database.engine.begin() as connection:
        connection.execute(text(settings), {"ef": str(ef_search)})
        for row in connection.execute(_SEARCH, parameters).mappings():
            transition = {column: row[column] for column in RETURNED_COLUMNS}
            results[row["query_index"] - 1].append(Neighbour(float(row["similarity"]), transition))
    return results
