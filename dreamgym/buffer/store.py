"""Write transitions into the buffer: bulk, idempotent, safe to run twice or at once.

Rows go into a temporary staging table by binary `COPY`, then into `tasks`, `trajectories` and
`transitions` with `INSERT ... ON CONFLICT DO NOTHING` (the content hash is unique), so a re-run
inserts nothing and two processes loading overlapping files end with exactly the union. Rows are
inserted in content-hash order, so concurrent writers take their locks in the same order; a
deadlock that happens anyway is retried, since the work is idempotent.

Two ways in, chosen by how much the load adds. A small load (new rows under `bulk_load_fraction`
of the buffer) is a transaction per batch, each row inserted into the HNSW index as it goes (~1k
rows/s at 10k rows, a few hundred at 100k: the graph search per insert is the cost). A large load
is one transaction that drops the index, inserts, and builds the index again (COPY runs at >10k
rows/s and a build is much cheaper than as many inserts); a crash in either leaves whole
transactions only.

Every row is checked against the transition contract (`data/contract.py`: finite reward, a
content hash that is the row's own, ...) before anything is written: whoever calls, a bad row is
refused with its reason, never stored and never skipped as "already there". Embeddings are
computed only for content hashes not stored yet, and checked (size, finite) before anything of
their transaction is written. An error the database raises anyway (a constraint of the schema) is
reported in one line naming the constraint, never with the row it was given.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from psycopg import errors as pg_errors
from sqlalchemy import text
from tqdm import tqdm

from dreamgym.buffer.config import BufferConfig
from dreamgym.buffer.db import Database
from dreamgym.buffer.embeddings import check_embeddings, lazy_embedder, transition_text
from dreamgym.data.contract import check_contract
from dreamgym.data.schema import read_transitions, to_table
from dreamgym.errors import DreamgymError

# Staging and transitions columns, in COPY order, with their Postgres types for binary COPY.
_COLUMNS = (
    ("content_hash", "text"),
    ("trajectory_id", "text"),
    ("task_id", "text"),
    ("env", "text"),
    ("step", "int4"),
    ("state", "text"),
    ("action", "text"),
    ("expert_action", "text"),
    ("next_state", "text"),
    ("reward", "float8"),
    ("terminated", "bool"),
    ("truncated", "bool"),
    ("won", "bool"),
    ("lost", "bool"),
    ("score", "int8"),
    ("max_score", "int8"),
    ("reasoning", "text"),
    ("source", "text"),
    ("policy", "text"),
    ("model_version", "text"),
    ("run_id", "text"),
    ("data_version", "text"),
    ("recorded_at", "timestamptz"),
    ("embedding", "vector"),
)
_NAMES = ", ".join(name for name, _ in _COLUMNS)
_DEADLOCK_RETRIES = 5
HNSW_INDEX = "transitions_embedding_hnsw"  # its definition lives in sql/001_buffer.sql
_EMBED_CHUNK = 256  # texts per embed call: progress moves every few seconds on a CPU

Embed = Callable[[list[str]], np.ndarray]


class BufferWriteError(DreamgymError):
    """The database refused a load (nothing of its transaction was written)."""


@dataclass(frozen=True)
class UpsertResult:
    inserted: int
    skipped: int
    seconds: float
    bulk: bool = False  # loaded with the HNSW index rebuilt


def embedding_dim(database: Database) -> int:
    """The dimension the buffer's schema stores."""
    with database.engine.connect() as connection:
        dim = connection.exec_driver_sql(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'transitions'::regclass AND attname = 'embedding'"
        ).scalar()
    if dim is None:
        raise DreamgymError("the buffer has no transitions table; run the migrations first")
    return int(dim)


def _new_rows(database: Database, rows: list[dict], batch_rows: int) -> list[int]:
    """Offsets of the rows whose content hash is neither stored nor earlier in `rows`."""
    new, seen = [], set()
    with database.engine.connect() as connection:
        for start in range(0, len(rows), batch_rows):
            hashes = [row["content_hash"] for row in rows[start : start + batch_rows]]
            stored = {
                row[0]
                for row in connection.execute(
                    text("SELECT content_hash FROM transitions WHERE content_hash = ANY(:hashes)"), {"hashes": hashes}
                )
            }
            for offset, content in enumerate(hashes, start):
                if content not in stored and content not in seen:
                    seen.add(content)
                    new.append(offset)
    return new


def _insert(cursor, rows: list[dict], vectors: np.ndarray, data_version: str | None, bar: tqdm) -> int:
    """Stage `rows` by binary COPY and insert those not stored; return how many were new."""
    cursor.execute(
        f"CREATE TEMP TABLE staging ON COMMIT DROP AS "
        f"SELECT {_NAMES}, ''::text AS instruction FROM transitions WITH NO DATA"
    )
    with cursor.copy(f"COPY staging ({_NAMES}, instruction) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types([kind for _, kind in _COLUMNS] + ["text"])
        for row, vector in zip(rows, vectors):
            record = {**row, "data_version": data_version, "embedding": vector, "recorded_at": row["created_at"]}
            copy.write_row([record[name] for name, _ in _COLUMNS] + [row["instruction"]])
    cursor.execute(
        "INSERT INTO tasks (task_id, env, instruction) "
        "SELECT DISTINCT ON (task_id) task_id, env, instruction FROM staging "
        "ORDER BY task_id ON CONFLICT DO NOTHING"
    )
    cursor.execute(
        "INSERT INTO trajectories (trajectory_id, task_id, env, source, policy, "
        "model_version, run_id, data_version) "
        "SELECT DISTINCT ON (trajectory_id) trajectory_id, task_id, env, source, "
        "policy, model_version, run_id, data_version FROM staging "
        "ORDER BY trajectory_id ON CONFLICT DO NOTHING"
    )
    cursor.execute(
        f"INSERT INTO transitions ({_NAMES}) SELECT {_NAMES} FROM staging "
        "ORDER BY content_hash ON CONFLICT (content_hash) DO NOTHING"
    )
    bar.update(len(rows))
    return cursor.rowcount


def _in_transaction(database: Database, work: Callable) -> int:
    """Run `work(cursor)` in one transaction, again if it was chosen as a deadlock's victim."""
    attempt = 0
    while True:
        try:
            with database.engine.begin() as connection, connection.connection.driver_connection.cursor() as cursor:
                return work(cursor)
        except Exception as error:
            cause = getattr(error, "orig", error)
            attempt += 1
            if isinstance(cause, pg_errors.IntegrityError):
                raise _refused(cause) from None
            if not isinstance(cause, pg_errors.DeadlockDetected) or attempt == _DEADLOCK_RETRIES:
                raise
            time.sleep(0.05 * attempt)


def _refused(error: pg_errors.IntegrityError) -> BufferWriteError:
    """The database's refusal in one line: the constraint and table, never the row (its text and
    embedding would fill the screen, and a row may hold what a log should not)."""
    diagnostic = error.diag
    what = diagnostic.constraint_name or type(error).__name__
    return BufferWriteError(
        f"the buffer refused the load ({type(error).__name__} on {diagnostic.table_name}: "
        f"{what}); nothing of it was written. Run `dreamgym validate` on the file "
        "and ingest the clean rows it writes"
    )


def _load_in_bulk(
    cursor, rows: list[dict], vectors: np.ndarray, data_version: str | None, build_memory: str, bar: tqdm
) -> int:
    """Insert with the HNSW index dropped, then build it again from its own definition.

    All in the caller's transaction: readers see the old rows and the old index until it commits,
    and a crash at any point leaves both as they were. The lock, taken in the order the per-batch
    path takes its locks, makes concurrent writers wait instead of deadlocking.
    """
    cursor.execute("LOCK TABLE tasks, trajectories, transitions IN SHARE ROW EXCLUSIVE MODE")
    cursor.execute("SELECT pg_get_indexdef(to_regclass(%s))", (HNSW_INDEX,))
    definition = cursor.fetchone()[0]
    if definition:
        cursor.execute(f"DROP INDEX {HNSW_INDEX}")
    inserted = _insert(cursor, rows, vectors, data_version, bar)
    if definition:
        bar.set_postfix_str("building the HNSW index")
        cursor.execute("SELECT set_config('maintenance_work_mem', %s, true)", (build_memory,))
        cursor.execute(definition)
    return inserted


def _embed_chunks(embed: Embed, rows: list[dict], dim: int, bar: tqdm) -> np.ndarray:
    """Embeddings of `rows`, a chunk at a time so the progress bar moves."""
    chunks = []
    for start in range(0, len(rows), _EMBED_CHUNK):
        chunk = rows[start : start + _EMBED_CHUNK]
        texts = [transition_text(row["instruction"], row["state"], row["action"]) for row in chunk]
        chunks.append(check_embeddings(embed(texts), dim, len(chunk)))
        bar.update(len(chunk))
    return np.concatenate(chunks) if chunks else np.zeros((0, dim), dtype=np.float32)


def upsert_transitions(
    database: Database,
    table: pa.Table,
    *,
    embed: Embed | None = None,
    embeddings: np.ndarray | None = None,
    data_version: str | None = None,
    batch_rows: int = 2000,
    bulk_load_fraction: float = 0.2,
    index_build_memory: str = "1GB",
    progress: bool = False,
    reward_range: tuple[float, float] | None = None,
) -> UpsertResult:
    """Insert the table's transitions that the buffer does not hold yet; `ContractError` when any
    row breaks the transition contract (with rewards in `reward_range`, when given).

    Give either `embed` (texts -> vectors, called only for new rows) or `embeddings`
    (precomputed, one row per table row, all checked before anything is written). When the new
    rows are at least `bulk_load_fraction` of the buffer after the load, they go in as one
    transaction with the HNSW index rebuilt (see `_load_in_bulk`); otherwise a transaction per
    `batch_rows` rows.
    """
    if (embed is None) == (embeddings is None):
        raise ValueError("give exactly one of embed= or embeddings=")
    started = time.perf_counter()
    dim = embedding_dim(database)
    rows = table.to_pylist()
    check_contract(rows, reward_range)
    if embeddings is not None:
        embeddings = check_embeddings(embeddings, dim, len(rows))
    new = _new_rows(database, rows, batch_rows)
    with database.engine.connect() as connection:
        stored = connection.exec_driver_sql("SELECT count(*) FROM transitions").scalar()
    bulk = bool(new) and len(new) >= bulk_load_fraction * (stored + len(new))
    # Embedding and writing each move the bar once per new row.
    with tqdm(total=2 * len(new) if embed else len(new), desc="buffer upsert", unit="row", disable=not progress) as bar:
        if bulk:
            new_rows = [rows[offset] for offset in new]
            vectors = embeddings[new] if embed is None else _embed_chunks(embed, new_rows, dim, bar)
            inserted = _in_transaction(
                database, lambda cursor: _load_in_bulk(cursor, new_rows, vectors, data_version, index_build_memory, bar)
            )
        else:
            inserted = 0
            for start in range(0, len(new), batch_rows):
                offsets = new[start : start + batch_rows]
                chunk = [rows[offset] for offset in offsets]
                vectors = embeddings[offsets] if embed is None else _embed_chunks(embed, chunk, dim, bar)
                work = functools.partial(_insert, rows=chunk, vectors=vectors, data_version=data_version, bar=bar)
                inserted += _in_transaction(database, work)
    return UpsertResult(
        inserted=inserted, skipped=len(rows) - inserted, bulk=bulk, seconds=time.perf_counter() - started
    )


def ingest_file(
    database: Database,
    path,
    config: BufferConfig,
    data_version: str | None = None,
    progress: bool = True,
    reward_range: tuple[float, float] | None = None,
) -> UpsertResult:
    """Upsert a transitions Parquet file, embedding its new rows with the configured encoder."""
    return upsert_transitions(
        database,
        read_transitions(path),
        embed=lazy_embedder(config.encoder, config.encode_batch_size),
        data_version=data_version,
        batch_rows=config.upsert_batch_rows,
        bulk_load_fraction=config.bulk_load_fraction,
        index_build_memory=config.index_build_memory,
        progress=progress,
        reward_range=reward_range,
    )


def write_back(
    database: Database, rows: Sequence[dict], config: BufferConfig, embed: Embed | None = None, progress: bool = False
) -> UpsertResult:
    """Upsert synthetic transitions (`DreamEnv.take_transitions`) through the same idempotent
    path as real data: a transition already stored (same content hash) is skipped, so writing
    back the same rollouts twice, or after a retried step, adds nothing."""
    not_synthetic = sorted({row["source"] for row in rows} - {"synthetic"})
    if not_synthetic:
        raise ValueError(
            f"write_back takes synthetic transitions only, got source {not_synthetic}: "
            "real data goes in through `dreamgym buffer ingest`"
        )
    return upsert_transitions(
        database,
        to_table(rows),
        embed=embed or lazy_embedder(config.encoder, config.encode_batch_size),
        batch_rows=config.upsert_batch_rows,
        bulk_load_fraction=config.bulk_load_fraction,
        index_build_memory=config.index_build_memory,
        progress=progress,
    )
