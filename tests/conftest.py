"""Shared fixtures: a few real TextWorld games and a real collected dataset, made once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
# Prefect reads its settings at import: no telemetry (no network here), patience on a slow start.
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"

from dreamgym.config import GamesConfig  # noqa: E402
from dreamgym.data.collect import CollectionSettings, collect  # noqa: E402
from dreamgym.data.games import generate_games, plan_games  # noqa: E402

# Small games keep the suite fast: one or two ingredients, one or six rooms.
TINY_GAMES = GamesConfig(recipe=(1, 2), take=(1, 2), go=(1, 6), train_count=3, test_count=1)


@pytest.fixture(scope="session")
def games_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("games")


@pytest.fixture(scope="session")
def train_games(games_root) -> list[Path]:
    specs = plan_games(TINY_GAMES, "train", TINY_GAMES.train_count, seed=0)
    paths, _ = generate_games(specs, games_root / "train", workers=2, progress=False)
    return paths


@pytest.fixture(scope="session")
def test_games(games_root) -> list[Path]:
    specs = plan_games(TINY_GAMES, "test", TINY_GAMES.test_count, seed=0)
    paths, _ = generate_games(specs, games_root / "test", workers=2, progress=False)
    return paths


@pytest.fixture(scope="session")
def offline_dataset(train_games, tmp_path_factory) -> Path:
    """Noisy-expert transitions on the training games: successes and failures."""
    out = tmp_path_factory.mktemp("offline") / "offline.parquet"
    collect(train_games, out, CollectionSettings("noisy-expert", 0.3, 4, seed=0, max_steps=30),
            workers=2, progress=False)
    return out


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """One temporary Prefect server (with its own database) for every flow test."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def mlflow_tracking(tmp_path, monkeypatch) -> str:
    """A private MLflow store (SQLite) for one test."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(None)


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
