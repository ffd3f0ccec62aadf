"""The replay buffer against a real embedded Postgres with pgvector, with real transitions and the
real sentence encoder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from sqlalchemy import text

from dreamgym.buffer.embeddings import EmbeddingError, inference_dtype, length_batches, transition_text
from dreamgym.buffer.migrations import MIGRATIONS_DIR, MigrationError, apply_migrations, load_migrations
from dreamgym.buffer.retrieval import Filters, search
from dreamgym.buffer.stats import buffer_stats
from dreamgym.buffer.store import HNSW_INDEX, upsert_transitions
from dreamgym.data.schema import content_hash, read_transitions, to_table

ROOT = Path(__file__).resolve().parents[1]


def count(database, table: str = "transitions") -> int:
    with database.engine.connect() as connection:
        return connection.execute(text(f"SELECT count(*) FROM {table}")).scalar()


@pytest.fixture(scope="module")
def offline_rows(offline_dataset) -> list[dict]:
    return read_transitions(offline_dataset).to_pylist()


@pytest.fixture(scope="module")
def offline_vectors(offline_rows, encoder) -> np.ndarray:
    return encoder.encode([transition_text(r["instruction"], r["state"], r["action"]) for r in offline_rows])


@pytest.fixture
def filled(buffer_db, offline_dataset, offline_vectors):
    upsert_transitions(
        buffer_db, read_transitions(offline_dataset), embeddings=offline_vectors, data_version="md5-test"
    )
    return buffer_db


def test_migrations_apply_once_and_refuse_an_edited_history(buffer_db, tmp_path):
    assert apply_migrations(buffer_db.engine, load_migrations(384)) == []  # the fixture applied them
    with buffer_db.engine.connect() as connection:
        recorded = connection.execute(text("SELECT name, checksum FROM schema_migrations")).all()
    assert [(name, checksum) for name, checksum in recorded] == [(m.name, m.checksum) for m in load_migrations(384)]

    edited = tmp_path / "sql"
    shutil.copytree(MIGRATIONS_DIR, edited)
    first = sorted(edited.glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- an edit after the fact\n")
    with pytest.raises(MigrationError, match="applied migrations must not change"):
        apply_migrations(buffer_db.engine, load_migrations(384, edited))
    with pytest.raises(MigrationError, match="embedding_dim needs a new database"):
        apply_migrations(buffer_db.engine, load_migrations(768))
    with pytest.raises(MigrationError, match="does not know"):
        apply_migrations(buffer_db.engine, [])


def test_upsert_is_idempotent_and_never_embeds_a_stored_row(buffer_db, offline_dataset, offline_rows, encoder):
    table = read_transitions(offline_dataset)
    embedded: list[int] = []

    def embed(texts):
        embedded.append(len(texts))
        return encoder.encode(texts)

    first = upsert_transitions(buffer_db, table, embed=embed, data_version="md5-a", batch_rows=50)
    assert (first.inserted, first.skipped) == (len(offline_rows), 0)
    assert sum(embedded) == len(offline_rows)

    again = upsert_transitions(buffer_db, table, embed=embed, data_version="md5-a", batch_rows=50)
    assert (again.inserted, again.skipped) == (0, len(offline_rows))
    assert sum(embedded) == len(offline_rows), "a stored content hash was embedded again"

    assert count(buffer_db) == len(offline_rows)
    assert count(buffer_db, "trajectories") == len({r["trajectory_id"] for r in offline_rows})
    assert count(buffer_db, "tasks") == len({r["task_id"] for r in offline_rows})
    with buffer_db.engine.connect() as connection:
        versions = connection.execute(text("SELECT DISTINCT data_version, source FROM transitions")).all()
    assert versions == [("md5-a", "real")]


def test_the_encoder_encodes_each_text_once_and_keeps_only_the_most_recent(encoder, monkeypatch):
    first, second, third = (f"action: take apple\ntask: encoder test {n}\n-= Kitchen =-" for n in range(3))
    encoded: list[list[str]] = []
    encode_uncached = encoder._encode
    monkeypatch.setattr(encoder, "_encode", lambda texts: encoded.append(list(texts)) or encode_uncached(texts))

    vectors = encoder.encode([first, second, first])
    assert encoded == [[first, second]], "a repeated text was encoded twice"
    np.testing.assert_array_equal(vectors[0], vectors[2])
    again = encoder.encode([second, third])
    assert encoded == [[first, second], [third]], "a text encoded before was encoded again"
    np.testing.assert_array_equal(again[0], vectors[1])
    # The same vectors as encoding without the cache, up to the padding of the batch.
    assert (np.sum(again * encode_uncached([second, third]), axis=1) > 0.9999).all()

    monkeypatch.setattr(encoder, "cache_size", 2)
    encoder.encode([first])  # kept; the least recently used (second) goes
    encoder.encode([first, third])
    assert encoded[2:] == []
    encoder.encode([second])
    assert encoded[2:] == [[second]]


def test_texts_are_batched_with_texts_of_alike_length():
    lengths = [100, 60, 62, 158, 61, 99, 160]
    assert length_batches(lengths, size=64) == [[1, 4, 2], [5, 0], [3, 6]]
    assert length_batches(lengths, size=2) == [[1, 4], [2], [5, 0], [3, 6]]
    assert length_batches([50] * 5, size=2) == [[0, 1], [2, 3], [4]]
    assert length_batches([], size=8) == []


def test_each_text_gets_its_own_vector_whatever_batch_it_was_encoded_in(encoder):
    texts = [f"action: take {'red ' * n}apple\ntask: encoder test\n-= Kitchen =-" for n in (40, 0, 20, 1, 39)]
    together = encoder._encode(texts)
    alone = np.stack([encoder._encode([text])[0] for text in texts])
    assert (np.sum(together * alone, axis=1) > 0.9999).all()
    assert (together @ together.T < 0.9999).sum() == 20, "two texts of the batch got the same vector"


def test_the_encoder_computes_in_bf16_on_a_cpu_only_with_native_bf16_instructions():
    # /proc/cpuinfo, not torch, says what the CPU has: oneDNN calls bf16 "supported" where it
    # only emulates it, ~3x slower than float32.
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo to read the CPU's instructions from")
    flags = {flag for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for flag in line.split()}
    native = bool(flags & {"avx512_bf16", "amx_bf16"})
    assert inference_dtype(torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)


def _unique_text_rows(rows: list[dict]) -> list[int]:
    texts = [transition_text(r["instruction"], r["state"], r["action"]) for r in rows]
    repeats = Counter(texts)
    return [i for i, t in enumerate(texts) if repeats[t] == 1]


def test_a_large_load_rebuilds_the_index_and_a_small_one_inserts_into_it(
    buffer_db, offline_dataset, offline_rows, offline_vectors
):
    with buffer_db.engine.connect() as connection:
        index = connection.execute(text("SELECT pg_get_indexdef(to_regclass(:n))"), {"n": HNSW_INDEX}).scalar()
    table, cut = read_transitions(offline_dataset), int(len(offline_rows) * 0.9)
    large = upsert_transitions(buffer_db, table.slice(0, cut), embeddings=offline_vectors[:cut])
    small = upsert_transitions(buffer_db, table.slice(cut), embeddings=offline_vectors[cut:])
    assert large.bulk and not small.bulk
    assert large.inserted + small.inserted == count(buffer_db) == len(offline_rows)
    with buffer_db.engine.connect() as connection:
        assert connection.execute(text("SELECT pg_get_indexdef(to_regclass(:n))"), {"n": HNSW_INDEX}).scalar() == index
    # Rows of both loads are reachable through the index.
    unique = _unique_text_rows(offline_rows)
    probes = [i for i in unique if i < cut][:3] + [i for i in unique if i >= cut][:3]
    assert len(probes) == 6
    for probe, neighbours in zip(probes, search(buffer_db, offline_vectors[probes], k=1)):
        assert neighbours[0].transition["content_hash"] == offline_rows[probe]["content_hash"]


def test_the_embedded_server_runs_with_the_configured_shared_buffers(buffer_server):
    with buffer_server.engine.connect() as connection:
        assert connection.exec_driver_sql("SHOW shared_buffers").scalar() == "160MB"


def test_a_stored_transition_is_its_own_nearest_neighbour(filled, offline_rows, offline_vectors):
    unique = _unique_text_rows(offline_rows)[:10]
    assert unique, "the dataset should have transitions whose text is unique"
    results = search(filled, offline_vectors[unique], k=5)
    for index, neighbours in zip(unique, results):
        assert neighbours[0].transition["content_hash"] == offline_rows[index]["content_hash"]
        assert neighbours[0].similarity == pytest.approx(1.0, abs=1e-4)
        assert [n.similarity for n in neighbours] == sorted((n.similarity for n in neighbours), reverse=True)


def test_batched_and_one_by_one_retrieval_agree(filled, offline_vectors):
    queries = offline_vectors[::7][:8]
    batched = search(filled, queries, k=4)
    single = [search(filled, query[None], k=4)[0] for query in queries]
    assert [[n.transition["content_hash"] for n in hits] for hits in batched] == [
        [n.transition["content_hash"] for n in hits] for hits in single
    ]


def test_rows_read_once_come_from_the_cache_and_no_caller_can_change_them(filled, offline_rows, offline_vectors):
    from dreamgym.buffer.db import RowCache

    filled.rows = RowCache()
    queries = offline_vectors[:4]
    first = search(filled, queries, k=6)
    cached = len(filled.rows._rows)
    assert 6 <= cached <= 24  # every row returned, once
    with pytest.raises(TypeError):
        first[0][0].transition["action"] = "changed by a caller"
    added = first[0][0].transition | {"instruction": "a caller's own copy"}
    assert added["instruction"] == "a caller's own copy" and "instruction" not in first[0][0].transition
    again = search(filled, queries, k=6)
    assert len(filled.rows._rows) == cached  # nothing new was read
    assert [[n.transition for n in hits] for hits in again] == [[n.transition for n in hits] for hits in first]
    by_hash = {row["content_hash"]: row for row in offline_rows}
    assert again[0][0].transition["action"] == by_hash[again[0][0].transition["content_hash"]]["action"]
    # The least recently used rows leave a full cache.
    small = RowCache(capacity=2)
    small.add({1: {"a": 1}, 2: {"a": 2}})
    assert small.known([1]) == {1: {"a": 1}}
    small.add({3: {"a": 3}})
    assert small.known([1, 2, 3]) == {1: {"a": 1}, 3: {"a": 3}}


def test_filters_are_honoured(filled, offline_rows, offline_vectors):
    query, row = offline_vectors[3:4], offline_rows[3]
    [hits] = search(filled, query, k=10, filters=Filters(exclude_trajectory_ids=(row["trajectory_id"],)))
    assert len(hits) == 10 and all(h.transition["trajectory_id"] != row["trajectory_id"] for h in hits)
    [hits] = search(filled, query, k=10, filters=Filters(exclude_task_id=row["task_id"]))
    assert len(hits) == 10 and all(h.transition["task_id"] != row["task_id"] for h in hits)
    assert search(filled, query, k=10, filters=Filters(env="scienceworld")) == [[]]
    assert search(filled, query, k=10, filters=Filters(source="synthetic")) == [[]]

    # A synthetic copy of the row: same text, so it is as near as the real one.
    synthetic = {
        **row,
        "source": "synthetic",
        "model_version": "dreamgym-experience/1",
        "trajectory_id": "synthetic-trajectory",
    }
    synthetic["content_hash"] = content_hash(synthetic)
    upsert_transitions(filled, to_table([synthetic]), embeddings=query)
    [real_only] = search(filled, query, k=10, filters=Filters(source="real"))
    assert all(h.transition["source"] == "real" for h in real_only)
    [synthetic_only] = search(filled, query, k=10, filters=Filters(source="synthetic"))
    assert [h.transition["content_hash"] for h in synthetic_only] == [synthetic["content_hash"]]

    # One filter per query in a single batched call.
    per_query = [Filters(exclude_trajectory_ids=(r["trajectory_id"],)) for r in offline_rows[:3]]
    for r, hits in zip(offline_rows[:3], search(filled, offline_vectors[:3], k=5, filters=per_query)):
        assert all(h.transition["trajectory_id"] != r["trajectory_id"] for h in hits)


def test_bad_embeddings_are_rejected_and_nothing_is_written(buffer_db, offline_dataset, offline_vectors):
    table = read_transitions(offline_dataset)
    with pytest.raises(EmbeddingError, match=r"shape \(\d+, 384\), got \(\d+, 10\)"):
        upsert_transitions(buffer_db, table, embeddings=np.ones((table.num_rows, 10)))
    poisoned = offline_vectors.copy()
    poisoned[-1, 5] = np.nan
    with pytest.raises(EmbeddingError, match="NaN or infinity"):
        upsert_transitions(buffer_db, table, embeddings=poisoned, batch_rows=10)
    with pytest.raises(EmbeddingError, match="NaN or infinity"):
        upsert_transitions(buffer_db, table, embed=lambda texts: np.full((len(texts), 384), np.nan))
    assert count(buffer_db) == 0 and count(buffer_db, "tasks") == 0


def test_stats(filled, offline_rows):
    stats = buffer_stats(filled)
    assert stats["transitions"] == len(offline_rows)
    assert stats["by_source_env"] == [{"source": "real", "env": "textworld", "transitions": len(offline_rows)}]
    assert stats["hnsw_index"] and stats["without_embedding"] == 0
    assert stats["migrations"] == ["001_buffer", "002_embedding_inline", "003_expert_action", "004_finite_rewards"]


def test_command_line(buffer_db, offline_dataset, offline_rows):
    environment = {**os.environ, "DATABASE_URL": buffer_db.engine.url.render_as_string(hide_password=False)}

    def dreamgym(*args):
        done = subprocess.run(
            [sys.executable, "-m", "dreamgym.cli", "buffer", *args, "--params", str(ROOT / "params.yaml")],
            capture_output=True,
            text=True,
            env=environment,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert dreamgym("ingest", str(offline_dataset)) == {"inserted": len(offline_rows), "skipped": 0}
    assert dreamgym("ingest", str(offline_dataset)) == {"inserted": 0, "skipped": len(offline_rows)}
    assert dreamgym("stats", "--json")["transitions"] == len(offline_rows)
    row = offline_rows[0]
    hits = dreamgym(
        "query", "--task", row["task_id"], "--state", row["state"], "--action", row["action"], "-k", "3", "--json"
    )
    assert len(hits) == 3 and hits[0]["similarity"] == pytest.approx(1.0, abs=1e-4)
    assert hits[0]["state"] == row["state"] and hits[0]["action"] == row["action"]
