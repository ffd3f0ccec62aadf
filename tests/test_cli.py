"""The command line as a user meets it: one-line errors and exit codes, for bad input."""

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def dreamgym(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dreamgym.cli", *args, "--params", str(PARAMS)],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


def assert_one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_unknown_split(tmp_path):
    assert_one_line_error(
        dreamgym("games", "--split", "dev", "--out", str(tmp_path)), "unknown split 'dev'", "train, valid, test"
    )


def test_games_with_other_settings_make_a_shifted_set(tmp_path):
    done = dreamgym("games", "--split", "test", "--count", "1", "--recipe", "3", "--go", "9", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert [game.name for game in tmp_path.glob("*.z8")] == ["cooking-test-r3t2g9-okc-s0.z8"]
    assert_one_line_error(
        dreamgym("games", "--count", "1", "--recipe", "7", "--out", str(tmp_path)), "recipe value 7 is out of range"
    )


def test_missing_game_file(train_games, tmp_path):
    # A game's metadata without its story file: the folder holds no playable game.
    (tmp_path / "only.json").write_bytes(train_games[0].with_suffix(".json").read_bytes())
    assert_one_line_error(
        dreamgym("collect", "--games", str(tmp_path), "--out", str(tmp_path / "o.parquet")),
        "no games (.z8) or tasks (.swtask)",
    )
    assert_one_line_error(
        dreamgym("collect", "--games", str(tmp_path / "nope"), "--out", "o.parquet"), "does not exist"
    )


def test_corrupt_game_file(train_games, tmp_path):
    for suffix in (".z8", ".json"):
        shutil.copy(train_games[0].with_suffix(suffix), tmp_path / f"game{suffix}")
    story = (tmp_path / "game.z8").read_bytes()
    (tmp_path / "game.z8").write_bytes(story[: len(story) // 2])
    assert_one_line_error(
        dreamgym("collect", "--games", str(tmp_path), "--out", str(tmp_path / "o.parquet")),
        "game.z8 is truncated",
        "regenerate it",
    )


def test_parquet_with_missing_columns(offline_dataset, tmp_path):
    table = pq.read_table(offline_dataset).drop_columns(["reward", "next_state"])
    pq.write_table(table, tmp_path / "partial.parquet")
    assert_one_line_error(dreamgym("validate", str(tmp_path / "partial.parquet")), "missing columns next_state, reward")


def test_not_a_parquet_file(tmp_path):
    (tmp_path / "x.parquet").write_text("not parquet")
    assert_one_line_error(dreamgym("validate", str(tmp_path / "x.parquet")), "not a readable Parquet file")


def test_bad_option_value(train_games, tmp_path):
    assert_one_line_error(
        dreamgym(
            "collect", "--games", str(train_games[0].parent), "--out", str(tmp_path / "o.parquet"), "--epsilon", "1.5"
        ),
        "'--epsilon'",
        "less than or equal to 1",
        "collect --help",
    )


@pytest.mark.parametrize("command", ["games", "collect", "validate", "check-env", "run"])
def test_every_command_has_help(command):
    done = subprocess.run(
        [sys.executable, "-m", "dreamgym.cli", command, "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "Usage" in done.stdout


def test_check_env_command(train_games):
    done = dreamgym("check-env", "--games", str(train_games[0].parent), "--max-steps", "10")
    assert done.returncode == 0, done.stderr
    assert "check_env passed on 3 games" in done.stderr
