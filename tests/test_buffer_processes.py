"""The buffer's upsert across real OS processes, against the real embedded Postgres.

Each child process opens the per-test database through DATABASE_URL and runs `upsert_transitions`
on a real collected Parquet file. Embeddings are a deterministic function of the content hash
(no sentence model in the children: loading it takes seconds per process). Progress is gated on
lines the children print, never on sleeps, so a loaded machine only makes the tests slower.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from sqlalchemy import text

from dreamgym.buffer.store import HNSW_INDEX
from dreamgym.data.schema import read_transitions, write_transitions

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # seconds per child: generous for a loaded 2-core machine

# argv: parquet, batch_rows, go file ("-": start at once), hold_at (commit number to stall in; 0: never),
# bulk_load_fraction (0: one transaction with the HNSW index rebuilt; 2: a transaction per batch).
CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from sqlalchemy import event
from dreamgym.buffer import store
from dreamgym.buffer.db import open_database
from dreamgym.data.schema import read_transitions

path, batch_rows, go, hold_at = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
bulk_load_fraction = float(sys.argv[5])
table = read_transitions(path)
vectors = np.stack([np.random.default_rng(int(h[:8], 16)).standard_normal(384)
                    for h in table["content_hash"].to_pylist()])
vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
database = open_database("unused")  # DATABASE_URL names the test's database

in_transaction, commits = store._in_transaction, 0
def reporting_in_transaction(*args, **kwargs):
    inserted = in_transaction(*args, **kwargs)
    print("batch", inserted, flush=True)  # printed only once the transaction has committed
    return inserted
store._in_transaction = reporting_in_transaction

@event.listens_for(database.engine, "commit")  # fires before COMMIT is sent: inside the batch
def stall(_connection):
    global commits
    commits += 1
    if commits == hold_at:
        print("holding", flush=True)
        time.sleep(3600)  # the parent kills us here, mid-transaction

print("ready", flush=True)
while go != "-" and not Path(go).exists():
    time.sleep(0.005)
result = store.upsert_transitions(database, table, embeddings=vectors, batch_rows=batch_rows,
                                  bulk_load_fraction=bulk_load_fraction)
print("result", json.dumps({"inserted": result.inserted, "skipped": result.skipped,
                            "bulk": result.bulk}), flush=True)
"""


class Child:
    """A child process whose stdout lines arrive on a queue (read by a thread, so waits time out)."""

    def __init__(self, script: Path, stderr: Path, url: str, *args: object):
        self.stderr_path = stderr
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *map(str, args)],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=stderr.open("w"),
            env={**os.environ, "DATABASE_URL": url},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, word: str) -> list[str]:
        """Lines up to and including the first that starts with `word`."""
        seen = []
        while True:
            try:
                line = self.lines.get(timeout=TIMEOUT)
            except queue.Empty:
                pytest.fail(f"no {word!r} from the child within {TIMEOUT} s; got {seen}")
            if line is None:
                self.proc.wait(TIMEOUT)
                pytest.fail(
                    f"child exited ({self.proc.returncode}) before {word!r}; got {seen}\n{self.stderr_path.read_text()}"
                )
            seen.append(line)
            if line.startswith(word):
                return seen

    def result(self) -> dict:
        """Wait for a clean exit and return the upsert's counts."""
        line = self.expect("result")[-1]
        assert self.proc.wait(TIMEOUT) == 0
        stderr = self.stderr_path.read_text()
        assert "Traceback" not in stderr, stderr
        return json.loads(line.split(" ", 1)[1])


@pytest.fixture
def spawn(tmp_path, buffer_db):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    url = buffer_db.engine.url.render_as_string(hide_password=False)
    children: list[Child] = []

    def start(*args: object) -> Child:
        children.append(Child(script, tmp_path / f"stderr-{len(children)}.txt", url, *args))
        return children[-1]

    yield start
    for child in children:  # a failed test must not leave writers behind
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()


def _column(database, sql: str) -> list:
    with database.engine.connect() as connection:
        return [row[0] for row in connection.execute(text(sql))]


def _hnsw_index(database) -> str | None:
    with database.engine.connect() as connection:
        return connection.execute(text("SELECT pg_get_indexdef(to_regclass(:name))"), {"name": HNSW_INDEX}).scalar()


@pytest.mark.parametrize("bulk_load_fraction", [2.0, 0.0], ids=["per-batch", "bulk"])
def test_two_processes_ingesting_overlapping_files_at_once_end_with_the_union(
    offline_dataset, buffer_db, spawn, tmp_path, bulk_load_fraction
):
    table = read_transitions(offline_dataset)
    n = table.num_rows
    cut = int(n * 0.3)
    # A holds rows [0, 70%); B holds rows [70%, 100%) then [30%, 70%). The shared rows sit at the
    # same offset in both files, so the two writers reach them together, in the same batches.
    file_a = write_transitions(table.slice(0, n - cut), tmp_path / "a.parquet")
    file_b = write_transitions(
        pa.concat_tables([table.slice(n - cut), table.slice(cut, n - 2 * cut)]), tmp_path / "b.parquet"
    )
    go = tmp_path / "go"
    index_before = _hnsw_index(buffer_db)
    children = [spawn(file_a, 20, go, 0, bulk_load_fraction), spawn(file_b, 20, go, 0, bulk_load_fraction)]
    for child in children:  # both connected and loaded before either writes
        child.expect("ready")
    go.touch()
    results = [child.result() for child in children]

    union = set(table["content_hash"].to_pylist())
    stored = _column(buffer_db, "SELECT content_hash FROM transitions")
    assert len(stored) == len(union) and set(stored) == union
    assert sum(r["inserted"] for r in results) == len(union)
    assert [r["inserted"] + r["skipped"] for r in results] == [n - cut, n - cut]
    assert sorted(_column(buffer_db, "SELECT task_id FROM tasks")) == sorted(set(table["task_id"].to_pylist()))
    assert sorted(_column(buffer_db, "SELECT trajectory_id FROM trajectories")) == sorted(
        set(table["trajectory_id"].to_pylist())
    )
    assert [r["bulk"] for r in results] == [bulk_load_fraction == 0.0] * 2
    assert _hnsw_index(buffer_db) == index_before  # rebuilt as it was, by whichever loaded last


def test_a_process_killed_mid_ingest_then_rerun_ends_with_exactly_the_files_rows(offline_dataset, buffer_db, spawn):
    hashes = read_transitions(offline_dataset)["content_hash"].to_pylist()
    batch_rows, committed = 5, 3
    assert len(hashes) > batch_rows * (committed + 1), "the dataset is too small for this test"

    # The child commits three batches, then stalls inside the fourth batch's transaction (its
    # rows already inserted, not committed) until SIGKILL: the crash every writer must survive.
    child = spawn(offline_dataset, batch_rows, "-", committed + 1, 2.0)
    lines = child.expect("holding")
    assert sum(line.startswith("batch") for line in lines) == committed
    child.proc.send_signal(signal.SIGKILL)
    assert child.proc.wait(TIMEOUT) == -signal.SIGKILL

    # Whole batches only: the three committed ones, none of the killed one.
    present = _column(buffer_db, "SELECT content_hash FROM transitions")
    assert set(present) == set(hashes[: batch_rows * committed])
    assert len(present) == len(set(present))

    result = spawn(offline_dataset, batch_rows, "-", 0, 2.0).result()
    stored = _column(buffer_db, "SELECT content_hash FROM transitions")
    assert len(stored) == len(set(hashes)) and set(stored) == set(hashes)
    assert result["inserted"] == len(set(hashes)) - len(present)
    assert result["skipped"] == len(hashes) - result["inserted"]


def test_a_process_killed_in_a_bulk_load_leaves_the_buffer_and_its_index_as_they_were(
    offline_dataset, buffer_db, spawn, tmp_path
):
    table = read_transitions(offline_dataset)
    first = write_transitions(table.slice(0, 10), tmp_path / "first.parquet")
    assert spawn(first, 10, "-", 0, 2.0).result()["bulk"] is False
    index = _hnsw_index(buffer_db)
    assert index is not None

    # The bulk load stalls after dropping the index, inserting and building it again, just
    # before its COMMIT, until SIGKILL.
    child = spawn(offline_dataset, 10, "-", 1, 0.0)
    child.expect("holding")
    child.proc.send_signal(signal.SIGKILL)
    assert child.proc.wait(TIMEOUT) == -signal.SIGKILL
    before = set(read_transitions(first)["content_hash"].to_pylist())
    assert set(_column(buffer_db, "SELECT content_hash FROM transitions")) == before
    assert _hnsw_index(buffer_db) == index

    result = spawn(offline_dataset, 10, "-", 0, 0.0).result()
    hashes = set(table["content_hash"].to_pylist())
    assert result["bulk"] is True and result["inserted"] == len(hashes - before)
    stored = _column(buffer_db, "SELECT content_hash FROM transitions")
    assert len(stored) == len(hashes) and set(stored) == hashes
    assert _hnsw_index(buffer_db) == index
