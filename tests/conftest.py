"""Shared fixtures: a few real TextWorld games and a real collected dataset, made once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from filelock import FileLock

# `make test` runs two pytest-xdist workers, one per core of CI's two: each computes on one thread
# (two threads each would fight over the cores). Set before torch is imported; the subprocesses
# a test starts inherit it, so a run killed in a subprocess computes like the one it is compared to.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
# Prefect reads its settings at import: no telemetry (no network here), patience on a slow start.
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"

from dreamgym.data.collect import CollectionSettings, collect
from dreamgym.envs.textworld.config import GamesConfig
from dreamgym.envs.textworld.games import generate_games, plan_games, target_folder, target_settings
from dreamgym.experience.config import ExperienceConfig


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that hold a `long` test first, the rest in their order: `make test` hands whole
    files to its two workers in this order (--no-loadscope-reorder), so the minutes-long ones start
    at once and the short ones fill in around them, instead of one worker ending alone on one."""
    long_files = {item.path for item in items if item.get_closest_marker("long")}
    items.sort(key=lambda item: item.path not in long_files)  # a stable sort keeps each file's order


# Small games keep the suite fast: one or two ingredients, one or six rooms.
TINY_GAMES = GamesConfig(recipe=(1, 2), take=(1, 2), go=(1, 6), train_count=3, test_count=1, task_count=1)
# A from-scratch experience model small enough to learn one episode by heart in ~30 s of CPU; no
# retrieval (no buffer needed), no reasoning, no placeholders (test_experience_placeholders.py has
# them). Modules import it as `from conftest import ...`.
TINY_EXPERIENCE = ExperienceConfig(
    history=1,
    neighbours=0,
    reasoning=False,
    placeholders=False,
    vocab_size=512,
    hidden_size=128,
    layers=2,
    heads=4,
    max_length=768,
    epochs=80,
    batch_size=4,
    learning_rate=3e-3,
    save_steps=10_000,
    max_new_tokens=160,
    retries=1,
    multi_step=3,
)


def write_params(project: Path, overrides: dict, name: str = "params.yaml") -> Path:
    """The repo's params.yaml with dotted-key overrides, written into `project` as `name`."""
    import yaml

    values = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    for key, value in overrides.items():
        *parents, last = key.split(".")
        section = values
        for part in parents:
            section = section[part]
        section[last] = value
    path = project / name
    path.write_text(yaml.safe_dump(values))
    return path


def free_ports(count: int = 1) -> list[int]:
    """Ports nothing listens on now (all distinct: held open together while asked for)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for each in sockets:
            each.bind(("127.0.0.1", 0))
        return [each.getsockname()[1] for each in sockets]
    finally:
        for each in sockets:
            each.close()


@contextmanager
def made_once(tmp_path_factory, name: str) -> Iterator[Path]:
    """A folder for what a session fixture makes, shared by the run's xdist workers: the first to
    take the lock makes it, the other waits and finds it made (each maker here reuses a finished
    result: games, collection, training) instead of both computing the same thing on CI's two
    cores. Without xdist, a folder of the session's own."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # pytest-<n>/: this run's, shared by its workers
    with FileLock(root / f"{name}.lock"):
        yield root / name


@pytest.fixture(scope="session")
def train_games(tmp_path_factory) -> list[Path]:
    specs = plan_games(TINY_GAMES, "train", TINY_GAMES.train_count, seed=0)
    with made_once(tmp_path_factory, "train-games") as folder:
        paths, _ = generate_games(specs, folder, workers=2, progress=False)
    return paths


@pytest.fixture(scope="session")
def task_games(tmp_path_factory) -> list[Path]:
    """The training-split games after the training ones, whose tasks RL practises (games.task_count)."""
    specs = plan_games(TINY_GAMES, "train", TINY_GAMES.task_count, seed=0, first=TINY_GAMES.train_count)
    with made_once(tmp_path_factory, "task-games") as folder:
        paths, _ = generate_games(specs, folder, workers=2, progress=False)
    return paths


@pytest.fixture(scope="session")
def test_games(tmp_path_factory) -> list[Path]:
    specs = plan_games(TINY_GAMES, "test", TINY_GAMES.test_count, seed=0)
    with made_once(tmp_path_factory, "test-games") as folder:
        paths, _ = generate_games(specs, folder, workers=2, progress=False)
    return paths


@pytest.fixture(scope="session")
def project_games(train_games, test_games, task_games, tmp_path_factory) -> dict[str, list[Path]]:
    """A tiny project's games by folder of data/games: the three above, and the held-out and task
    games of the target preset (`games.target`), made once: each project's pipeline would otherwise
    make them again with tw-make (5-10 s a game, ~10 projects in the suite)."""
    target = target_settings(TINY_GAMES)
    planned = {
        target_folder("test", TINY_GAMES): plan_games(target, "test", TINY_GAMES.test_count, seed=0),
        target_folder("tasks", TINY_GAMES): plan_games(
            target, "train", TINY_GAMES.task_count, seed=0, first=TINY_GAMES.train_count
        ),
    }
    games = {"train": train_games, "test": test_games, "tasks": task_games}
    for folder_name, specs in planned.items():
        if folder_name not in games:  # with games.target 'same' the target's games are those above
            with made_once(tmp_path_factory, f"{folder_name}-games") as folder:
                games[folder_name], _ = generate_games(specs, folder, workers=2, progress=False)
    return games


@pytest.fixture(scope="session")
def offline_dataset(train_games, tmp_path_factory) -> Path:
    """Noisy-expert transitions on the training games: successes and failures."""
    with made_once(tmp_path_factory, "offline") as folder:
        out = folder / "offline.parquet"
        collect(
            train_games,
            out,
            CollectionSettings("noisy-expert", 0.3, 4, seed=0, max_steps=30),
            workers=2,
            progress=False,
        )
    return out


@pytest.fixture(scope="session")
def first_episode(offline_dataset) -> list[dict]:
    """The transitions of the dataset's first trajectory (by id), in step order."""
    from dreamgym.data.schema import read_transitions

    rows = read_transitions(offline_dataset).to_pylist()
    first = min(row["trajectory_id"] for row in rows)
    return sorted((row for row in rows if row["trajectory_id"] == first), key=lambda row: row["step"])


def train_experience(examples: list, config, out: Path):
    """An experience model trained (seed 0, quietly) on `examples` (experience.examples.Example);
    the TrainResult. Modules import it as `from conftest import ...`."""
    from dreamgym.lm.sft import train_sft

    records = [{"prompt": e.prompt, "completion": e.completion} for e in examples]
    return train_sft(records, config, out, seed=0, progress=False)


@pytest.fixture(scope="session")
def tiny_experience(first_episode, tmp_path_factory):
    """`TINY_EXPERIENCE` trained once on `first_episode`, for every module that needs a trained
    model (the TrainResult; its settings file saved beside the weights)."""
    from dreamgym.experience.examples import build_examples
    from dreamgym.experience.generate import save_settings

    examples = build_examples(None, None, first_episode, TINY_EXPERIENCE, ef_search=40)
    with made_once(tmp_path_factory, "tiny-experience") as folder:
        result = train_experience(examples, TINY_EXPERIENCE, folder)
        if not result.reused:  # a worker that found it made leaves the file the other may be reading
            save_settings(result.model_dir, TINY_EXPERIENCE)
    return result


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """One temporary Prefect server (with its own database) for every flow test."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@contextmanager
def tracking_store(path: Path) -> Iterator[str]:
    """MLflow tracking into the SQLite store at `path` while the block runs (the environment
    variable too: subprocesses and the CLI read it)."""
    import mlflow
    import mlflow.tracking.fluent

    uri = f"sqlite:///{path}"
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    mlflow.set_tracking_uri(uri)
    try:
        yield uri
    finally:
        mlflow.set_tracking_uri(None)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
        # set_experiment (the CLI calls it) remembers the experiment id process-wide (and in
        # MLFLOW_EXPERIMENT_ID); a later test with another store would start runs in an id it lacks.
        mlflow.tracking.fluent._active_experiment_id = None
        os.environ.pop("MLFLOW_EXPERIMENT_ID", None)


@pytest.fixture
def mlflow_tracking(tmp_path) -> Iterator[str]:
    """A private MLflow store (SQLite) for one test."""
    with tracking_store(tmp_path / "mlflow.db") as uri:
        yield uri


@pytest.fixture(scope="session")
def encoder():
    """The default sentence encoder (all-MiniLM-L6-v2 shipped by a PyPI package), loaded once."""
    from dreamgym.buffer.embeddings import Encoder

    return Encoder()


@pytest.fixture(scope="session")
def buffer_server(tmp_path_factory):
    """One real embedded Postgres with pgvector for the session; tests get their own database."""
    from dreamgym.buffer.db import open_database

    database = open_database(tmp_path_factory.mktemp("buffer-run"), shared_buffers="160MB")
    yield database
    database.close()


@pytest.fixture
def buffer_db(buffer_server, request):
    """A fresh, migrated database on the session's server (dropped afterwards)."""
    from sqlalchemy import text

    from dreamgym.buffer.db import open_database
    from dreamgym.buffer.migrations import apply_migrations, load_migrations

    name = "t_" + "".join(ch if ch.isalnum() else "_" for ch in request.node.name.lower())[:50]
    admin = buffer_server.engine.execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = buffer_server.engine.url.set(database=name).render_as_string(hide_password=False)
    database = open_database("unused", url=url)
    apply_migrations(database.engine, load_migrations(384))
    yield database
    database.close()
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
