"""Fault injection: damaged files, values that break the transition contract, refused writes, a
server user killed with SIGKILL, out-of-range options. Each case ends in one `error:` line that
names the problem and the fix (exit code 2), nothing bad stored, nothing left running."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psycopg
import pyarrow.parquet as pq
import pytest
from sqlalchemy import text

from dreamgym.buffer.db import HANDLE_FILE, open_database
from dreamgym.buffer.store import _refused, upsert_transitions
from dreamgym.data.contract import ContractError
from dreamgym.data.schema import content_hash, read_transitions, to_table, write_transitions
from dreamgym.envs.textworld.config import MAX_SEED, GamesConfig
from dreamgym.envs.textworld.games import plan_games
from dreamgym.errors import DreamgymError

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"


def dreamgym(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dreamgym.cli", *args, "--params", str(PARAMS)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def vectors(count: int) -> np.ndarray:
    rows = np.random.default_rng(0).standard_normal((count, 384))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def stored(database) -> int:
    with database.engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM transitions")).scalar()


@pytest.fixture(scope="module")
def rows(offline_dataset) -> list[dict]:
    return read_transitions(offline_dataset).to_pylist()[:40]


# --- files ------------------------------------------------------------------------------------


def test_a_damaged_data_page_is_one_error_line_for_validate_and_ingest(offline_dataset, tmp_path):
    data = bytearray(offline_dataset.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8  # the footer (schema) stays readable
    middle = (len(data) - footer) // 2
    data[middle : middle + 256] = bytes(256)  # zeroes over a compressed data page
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(bytes(data))
    pq.read_schema(damaged)  # the schema reads: only the data is damaged
    for command in (("validate", str(damaged)), ("buffer", "ingest", str(damaged))):
        one_line_error(dreamgym(*command), "damaged.parquet", "the file is damaged", "dreamgym collect")


def test_strings_rewritten_by_pandas_as_large_string_are_the_same_data(offline_dataset, tmp_path):
    rewritten = tmp_path / "pandas.parquet"
    pd.read_parquet(offline_dataset).to_parquet(rewritten)
    assert "large_string" in str(pq.read_schema(rewritten).field("env").type)
    assert read_transitions(rewritten).equals(read_transitions(offline_dataset))
    done = dreamgym("validate", str(rewritten))
    assert done.returncode == 0 and "PASSED" in done.stderr, done.stderr


def test_validate_names_a_nan_reward_as_not_finite_not_null(rows, tmp_path):
    bad = [dict(row) for row in rows]
    bad[3]["reward"] = math.nan
    write_transitions(to_table(bad), tmp_path / "nan.parquet")
    done = dreamgym("validate", str(tmp_path / "nan.parquet"))
    assert done.returncode == 1
    assert "reward is not a finite number: 1 row" in done.stderr and "null" not in done.stderr


# --- the buffer's contract --------------------------------------------------------------------


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf])
def test_the_buffer_refuses_a_reward_that_is_not_finite_and_stores_nothing(buffer_db, rows, reward):
    bad = [dict(row) for row in rows]
    bad[5]["reward"] = reward
    bad[5]["content_hash"] = content_hash(bad[5])  # a consistent row: only the value is wrong
    with pytest.raises(
        ContractError,
        match=r"1 of 40 rows .* row 5 \(trajectory .*\): reward is .*not a "
        r"finite number.*dreamgym validate",
    ):
        upsert_transitions(buffer_db, to_table(bad), embeddings=vectors(len(bad)))
    assert stored(buffer_db) == 0


def test_a_hash_that_is_not_the_rows_own_is_an_error_not_a_silent_skip(buffer_db, rows):
    upsert_transitions(buffer_db, to_table(rows[:10]), embeddings=vectors(10))
    forged = [dict(row) for row in rows[10:20]]
    forged[2]["content_hash"] = rows[0]["content_hash"]  # already stored: once skipped as "already there"
    with pytest.raises(ContractError, match=r"row 2 .*content_hash is not the hash of the row's content"):
        upsert_transitions(buffer_db, to_table(forged), embeddings=vectors(10))
    assert stored(buffer_db) == 10


def test_rewards_outside_the_configured_range_are_refused_when_a_range_is_given(buffer_db, rows):
    bad = [dict(row) for row in rows]
    bad[0]["reward"] = 50.0
    bad[0]["content_hash"] = content_hash(bad[0])
    with pytest.raises(ContractError, match=r"reward 50 is outside \[-1, 10\]"):
        upsert_transitions(buffer_db, to_table(bad), embeddings=vectors(len(bad)), reward_range=(-1.0, 10.0))
    assert stored(buffer_db) == 0


def test_a_write_the_database_refuses_is_one_line_naming_the_constraint_not_the_row(buffer_db, rows):
    upsert_transitions(buffer_db, to_table(rows[:1]), embeddings=vectors(1))
    url = buffer_db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url) as connection, pytest.raises(psycopg.errors.CheckViolation) as refused:
        # Past the Python check (another writer, an old client): the schema itself refuses NaN.
        connection.execute("UPDATE transitions SET reward = 'NaN'::float8")
    error = _refused(refused.value)
    assert "transitions_reward_finite" in str(error) and "dreamgym validate" in str(error)
    assert rows[0]["state"][:20] not in str(error) and "\n" not in str(error)
    with buffer_db.engine.connect() as connection:
        assert connection.execute(text("SELECT reward FROM transitions")).scalar() == rows[0]["reward"]


def test_ingest_on_the_command_line_refuses_the_rows_and_says_how_to_fix_them(buffer_db, rows, tmp_path):
    bad = [dict(row) for row in rows]
    bad[7]["step"] = -7
    bad[7]["content_hash"] = content_hash(bad[7])
    write_transitions(to_table(bad), tmp_path / "bad.parquet")
    environment = {**os.environ, "DATABASE_URL": buffer_db.engine.url.render_as_string(hide_password=False)}
    line = one_line_error(
        dreamgym("buffer", "ingest", str(tmp_path / "bad.parquet"), env=environment),
        "row 7",
        "step is -7",
        "dreamgym validate",
    )
    assert bad[7]["state"][:20] not in line  # the reason, not the row
    assert stored(buffer_db) == 0


# --- the embedded server ----------------------------------------------------------------------

USER = r"""
import sys, time
from dreamgym.buffer.db import open_database
database = open_database(sys.argv[1])
with database.engine.connect() as connection:
    connection.exec_driver_sql("SELECT 1")
print("open", flush=True)
if sys.argv[2] == "hold":
    time.sleep(600)
"""


def server_pid(run_dir: Path) -> int | None:
    pid_file = run_dir / "postgres" / "postmaster.pid"
    return int(pid_file.read_text().split("\n")[0]) if pid_file.exists() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_user_killed_with_sigkill_no_longer_keeps_the_embedded_server_running(tmp_path):
    environment = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    holder = subprocess.Popen(
        [sys.executable, "-c", USER, str(tmp_path), "hold"], stdout=subprocess.PIPE, text=True, env=environment
    )
    try:
        assert holder.stdout.readline().strip() == "open"
    finally:
        holder.kill()  # SIGKILL: no atexit, its PID stays in the server's list of users
        holder.wait()
    server = server_pid(tmp_path)
    assert server and alive(server)
    handles = tmp_path / "postgres" / HANDLE_FILE
    assert str(holder.pid) in handles.read_text()

    # The next command finds the dead user, drops it, and as the last user stops the server.
    done = subprocess.run(
        [sys.executable, "-c", USER, str(tmp_path), "exit"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=180,
        check=False,
    )
    assert done.stdout.strip() == "open", done.stderr
    deadline = time.monotonic() + 30
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(server), "the embedded server outlived the commands that used it"
    assert handles.read_text().strip() == "[]"


def test_an_unreachable_database_url_says_so_not_that_pgvector_is_missing(tmp_path):
    with pytest.raises(DreamgymError, match="cannot connect to the database") as raised:
        open_database(tmp_path, url="postgresql://nobody:secret@127.0.0.1:9/none")
    assert "pgvector" not in str(raised.value) and "secret" not in str(raised.value)


# --- options ----------------------------------------------------------------------------------


def test_a_seed_past_what_tw_make_takes_is_refused_with_the_bound(tmp_path):
    with pytest.raises(DreamgymError, match=f"use 0 to {MAX_SEED}"):
        plan_games(GamesConfig(), "train", 1, MAX_SEED + 1)
    assert plan_games(GamesConfig(), "train", 1, MAX_SEED)[0].seed < 2**32
    one_line_error(
        dreamgym("games", "--seed", str(MAX_SEED + 1), "--count", "1", "--out", str(tmp_path)), "--seed", str(MAX_SEED)
    )


def test_eval_on_a_damaged_game_stops_before_opening_a_run(train_games, tmp_path):
    project = tmp_path / "project"
    (project / "games").mkdir(parents=True)
    for suffix in (".z8", ".json", ".ni"):
        (project / "games" / f"game{suffix}").write_bytes(train_games[0].with_suffix(suffix).read_bytes())
    story = project / "games" / "game.z8"
    story.write_bytes(story.read_bytes()[:1000])
    (project / "params.yaml").write_text(PARAMS.read_text())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dreamgym.cli",
            "eval",
            "--policy",
            "models:/dreamgym-policy@champion",
            "--games",
            str(project / "games"),
            "--json",
            str(project / "eval.json"),
            "--params",
            str(project / "params.yaml"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    one_line_error(done, "game.z8 is truncated", "regenerate it")
    assert not (project / ".dreamgym").exists()  # no MLflow store, so no FAILED run in it


def test_model_references_that_name_nothing_say_what_to_write(mlflow_tracking):
    import mlflow

    from dreamgym.ops.registry import model_version

    client = mlflow.MlflowClient()
    with pytest.raises(
        DreamgymError, match=r"not a model URI: write models:/NAME/VERSION.*models:/dreamgym-policy@champion"
    ):
        model_version(client, "models:dreamgym-policy")
    with pytest.raises(DreamgymError, match="nothing is registered yet: `dreamgym run` registers"):
        model_version(client, "dreamgym-policy")


def test_every_numeric_option_has_bounds_that_help_states_and_errors_name():
    import typer

    from dreamgym.cli import app

    def commands(group, path=()):
        for name, command in getattr(group, "commands", {}).items():
            yield from commands(command, (*path, name)) if hasattr(command, "commands") else [((*path, name), command)]

    unbounded = [
        f"{' '.join(path)} --{param.name}"
        for path, command in commands(typer.main.get_command(app))
        for param in command.params
        if param.type_descriptor.annotation in (int, float) and param.min is None and param.max is None
    ]
    assert unbounded == []
    one_line_error(
        dreamgym("collect", "--games", ".", "--out", "x.parquet", "--epsilon", "2"),
        "--epsilon",
        "less than or equal to 1",
        "dreamgym collect --help",
    )
    one_line_error(dreamgym("no-such-command"), "No such command")


def test_two_commands_starting_at_once_on_a_new_run_directory_both_get_the_tracking_store(tmp_path):
    """MLflow creates its SQLite schema on first use; two processes doing it at once failed with
    "duplicate column name" (10 of 12 processes, measured before the fix)."""
    code = (
        "import sys, mlflow; from dreamgym.ops.tracking import configure_services, experiment_id; "
        "configure_services(sys.argv[1]); experiment_id('dreamgym', sys.argv[1])"
    )  # as every command starts
    environment = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    for attempt in range(2):
        run_dir = tmp_path / f"run-{attempt}"
        both = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(run_dir)], env=environment, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        for process in both:
            _, stderr = process.communicate(timeout=300)
            assert process.returncode == 0, stderr[-2000:]
            # a user's command (`dreamgym serve` prints one line) shows no MLflow table-creation logs
            assert "database tables" not in stderr, stderr[-2000:]
