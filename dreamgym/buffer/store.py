"""Write transitions into the buffer: bulk, idempotent, safe to run twice or at once.

Each batch is one transaction: its rows go into a temporary staging table by binary `COPY`, then
into `tasks`, `trajectories` and `transitions` with `INSERT ... ON CONFLICT DO NOTHING` (the
content hash is unique), so a re-run inserts nothing, a crashed run leaves whole batches only,
and two processes loading overlapping files end with exactly the union. Rows are inserted in
content-hash order, so concurrent writers take their locks in the same order; a deadlock that
happens anyway is retried, since the batch is idempotent.

Embeddings are computed only for content hashes not stored yet, and checked (size, finite)
before anything of their batch is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from psycopg import errors as pg_errors
from sqlalchemy import text
from tqdm import tqdm

from dreamgym.buffer.db import Database
from dreamgym.buffer.embeddings import check_embeddings, transition_text
from dreamgym.errors import DreamgymError

# Staging and transitions columns, in COPY order, with their Postgres types for binary COPY.
_COLUMNS = (
    ("content_hash", "text"), ("trajectory_id", "text"), ("task_id", "text"), ("env", "text"),
    ("step", "int4"), ("state", "text"), ("action", "text"), ("next_state", "text"),
    ("reward", "float8"), ("terminated", "bool"), ("truncated", "bool"), ("won", "bool"),
    ("lost", "bool"), ("score", "int8"), ("max_score", "int8"), ("reasoning", "text"),
    ("source", "text"), ("policy", "text"), ("model_version", "text"), ("run_id", "text"),
    ("data_version", "text"), ("recorded_at", "timestamptz"), ("embedding", "vector"),
)
_NAMES = ", ".join(name for name, _ in _COLUMNS)
_DEADLOCK_RETRIES = 5
_EMBED_CHUNK = 256  # texts per embed call: progress moves every few seconds on a CPU

Embed = Callable[[list[str]], np.ndarray]


@dataclass(frozen=True)
class UpsertResult:
    inserted: int
    skipped: int
    seconds: float


def embedding_dim(database: Database) -> int:
    """The dimension the buffer's schema stores."""
    with database.engine.connect() as connection:
        dim = connection.exec_driver_sql(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'transitions'::regclass "
            "AND attname = 'embedding'").scalar()
    if dim is None:
        raise DreamgymError("the buffer has no transitions table; run the migrations first")
    return int(dim)


def _stored_hashes(connection, hashes: list[str]) -> set[str]:
    rows = connection.execute(text("SELECT content_hash FROM transitions "
                                   "WHERE content_hash = ANY(:hashes)"), {"hashes": hashes})
    return {row[0] for row in rows}


def _write_batch(database: Database, rows: list[dict], vectors: np.ndarray,
                 data_version: str | None) -> int:
    """Insert one batch in one transaction; return how many transitions were new."""
    attempt = 0
    while True:
        try:
            with database.engine.begin() as connection:
                cursor = connection.connection.driver_connection.cursor()
                cursor.execute(f"CREATE TEMP TABLE staging ON COMMIT DROP AS "
                               f"SELECT {_NAMES}, ''::text AS instruction FROM transitions WITH NO DATA")
                with cursor.copy(f"COPY staging ({_NAMES}, instruction) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types([kind for _, kind in _COLUMNS] + ["text"])
                    for row, vector in zip(rows, vectors):
                        record = {**row, "data_version": data_version, "embedding": vector,
                                  "recorded_at": row["created_at"]}
                        copy.write_row([record[name] for name, _ in _COLUMNS] + [row["instruction"]])
                cursor.execute("INSERT INTO tasks (task_id, env, instruction) "
                               "SELECT DISTINCT ON (task_id) task_id, env, instruction FROM staging "
                               "ORDER BY task_id ON CONFLICT DO NOTHING")
                cursor.execute("INSERT INTO trajectories (trajectory_id, task_id, env, source, policy, "
                               "model_version, run_id, data_version) "
                               "SELECT DISTINCT ON (trajectory_id) trajectory_id, task_id, env, source, "
                               "policy, model_version, run_id, data_version FROM staging "
                               "ORDER BY trajectory_id ON CONFLICT DO NOTHING")
                cursor.execute(f"INSERT INTO transitions ({_NAMES}) SELECT {_NAMES} FROM staging "
                               "ORDER BY content_hash ON CONFLICT (content_hash) DO NOTHING")
                return cursor.rowcount
        except Exception as error:  # noqa: BLE001 - only deadlocks are retried
            attempt += 1
            if not isinstance(getattr(error, "orig", error), pg_errors.DeadlockDetected) \
                    or attempt == _DEADLOCK_RETRIES:
                raise
            time.sleep(0.05 * attempt)


def _embed_chunk(embed: Embed, rows: list[dict], dim: int, bar: tqdm) -> np.ndarray:
    texts = [transition_text(row["instruction"], row["state"], row["action"]) for row in rows]
    vectors = check_embeddings(embed(texts), dim, len(rows))
    bar.update(len(rows))
    return vectors


def upsert_transitions(database: Database, table: pa.Table, *, embed: Embed | None = None,
                       embeddings: np.ndarray | None = None, data_version: str | None = None,
                       batch_rows: int = 2000, progress: bool = False) -> UpsertResult:
    """Insert the table's transitions that the buffer does not hold yet.

    Give either `embed` (texts -> vectors, called only for new rows) or `embeddings`
    (precomputed, one row per table row, all checked before anything is written).
    """
    if (embed is None) == (embeddings is None):
        raise ValueError("give exactly one of embed= or embeddings=")
    started = time.perf_counter()
    dim = embedding_dim(database)
    rows = table.to_pylist()
    if embeddings is not None:
        embeddings = check_embeddings(embeddings, dim, len(rows))
    inserted = 0
    with tqdm(total=len(rows), desc="buffer upsert", unit="row", disable=not progress) as bar:
        for start in range(0, len(rows), batch_rows):
            batch = rows[start:start + batch_rows]
            with database.engine.connect() as connection:
                stored = _stored_hashes(connection, [row["content_hash"] for row in batch])
            seen: set[str] = set()
            new = []
            for offset, row in enumerate(batch):
                if row["content_hash"] not in stored and row["content_hash"] not in seen:
                    seen.add(row["content_hash"])
                    new.append(offset)
            bar.update(len(batch) - len(new))
            if new:
                new_rows = [batch[offset] for offset in new]
                if embeddings is not None:
                    vectors = embeddings[[start + offset for offset in new]]
                else:
                    vectors = np.concatenate([_embed_chunk(embed, new_rows[i:i + _EMBED_CHUNK], dim, bar)
                                              for i in range(0, len(new_rows), _EMBED_CHUNK)])
                inserted += _write_batch(database, new_rows, vectors, data_version)
                if embeddings is not None:
                    bar.update(len(new))
    return UpsertResult(inserted=inserted, skipped=len(rows) - inserted,
                        seconds=time.perf_counter() - started)
