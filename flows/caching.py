"""Versioned Prefect tasks: a task's result is reused when nothing it depends on has changed.

A stage task's cache key is built from exactly what its result depends on -- the config sections
it reads, the IDs and settings passed to it, the content of the files it reads -- plus the code
version (a digest of the library's and the flows' sources). So an unchanged re-run is a cache hit
and a changed parameter re-runs only the tasks that read it (and those downstream, whose inputs
then change). A task that writes files is reused only while those files are still there: a
deleted output folder makes the task run again rather than hand back paths to nothing.

Results are persisted by Prefect's result store (`$PREFECT_HOME/storage`, inside the run
directory for the embedded default). `dreamgym run --refresh` ignores cached results.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dreamgym.config import config_to_dict

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def code_version() -> str:
    """A digest of every Python source of the library and the flows: any code change is a new version."""
    digest = hashlib.sha256()
    for package in ("dreamgym", "flows"):
        for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
            digest.update(path.relative_to(PROJECT_ROOT).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def file_digest(path: str | Path) -> str:
    """The content digest of a file, or of every file under a folder (names included)."""
    path = Path(path)
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if item.is_file():
            digest.update(item.relative_to(path).as_posix().encode() if path.is_dir() else b"")
            with item.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, Path):
        return str(value)
    return value


def _paths(value: Any) -> Iterable[str]:
    return [str(item) for item in value] if isinstance(value, list | tuple) else [str(value)]


def stage_key(
    *,
    sections: tuple[str, ...] = (),
    params: tuple[str, ...] = (),
    files: tuple[str, ...] = (),
    outputs: tuple[str, ...] = (),
    environment: tuple[str, ...] = (),
) -> Callable[[Any, dict[str, Any]], str | None]:
    """A Prefect `cache_key_fn` over what a task's result depends on.

    sections: parts of the task's `config` parameter (a PipelineConfig) it reads, e.g. "policy",
    "seed"; params: other parameters by name (dataclasses compared by value); files: parameters
    naming files or folders whose content it reads (a path or a list of paths); outputs: parameters
    naming files or folders it writes -- while any is missing the task is not reused; environment:
    variables that choose a service (e.g. DATABASE_URL).
    """

    def key(context, parameters: dict[str, Any]) -> str | None:
        settings = config_to_dict(parameters["config"]) if sections else {}
        parts = {
            "task": context.task.name,
            "code": code_version(),
            "sections": {name: settings[name] for name in sections},
            "params": {name: _plain(parameters[name]) for name in params},
            "files": {name: [file_digest(path) for path in _paths(parameters[name])] for name in files},
            "environment": {name: os.environ.get(name) for name in environment},
        }
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
        if any(not Path(path).exists() for name in outputs for path in _paths(parameters[name])):
            from prefect.results import get_result_store

            # A result cached for files since deleted: run again, uncached; the files come back at
            # the same paths, which makes the cached result true again for the next run.
            if get_result_store().exists(digest):
                return None
        return digest

    return key


class Stages:
    """Calls a flow's versioned tasks and remembers which ones Prefect answered from its cache, so
    that a run can say what it did itself and what an earlier run did (a cache hit's result holds
    the earlier run's figures: rows it inserted, seconds it took)."""

    def __init__(self) -> None:
        self.cached: list[str] = []

    def run(self, task, *args, **kwargs) -> Any:
        state = task(*args, return_state=True, **kwargs)
        result = state.result()  # raises what the task raised
        if state.name == "Cached":
            self.cached.append(task.name)
        return result

    def was_cached(self, task) -> bool:
        return task.name in self.cached

    def tag(self) -> None:
        """Tag the active MLflow run: `dreamgym.cached_stages` lists the tasks an earlier run did."""
        import mlflow

        mlflow.set_tag("dreamgym.cached_stages", ",".join(self.cached) or "none")
