"""Version the offline dataset with DVC: `dvc add data` writes `data.dvc`, whose md5 is the
dataset version every downstream step records.

Runs the `dvc` command in the project directory (DVC's Python API resolves paths against the
process's working directory, which a multi-threaded flow must not change). A project that is not a DVC repository yet is
initialised (inside git when there is one, without it otherwise). Adding unchanged data is cheap
(DVC keeps a hash cache) and leaves `data.dvc` as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from dreamgym.errors import DreamgymError

os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@dataclass(frozen=True)
class DataVersion:
    md5: str  # DVC's directory md5 (".dir" suffix stripped), the dataset version
    dvc_file: str  # the .dvc file that records it
    files: int
    size_bytes: int
    changed: bool  # whether this call changed the recorded version


def _dvc_file(project_dir: Path, data_dir: str) -> Path:
    return project_dir / f"{Path(data_dir).name}.dvc"


def read_version(project_dir: str | Path, data_dir: str = "data") -> DataVersion | None:
    """The version recorded in the data's .dvc file, or None if there is none."""
    dvc_file = _dvc_file(Path(project_dir), data_dir)
    if not dvc_file.is_file():
        return None
    outs = (yaml.safe_load(dvc_file.read_text()) or {}).get("outs") or [{}]
    md5 = outs[0].get("md5")
    if not md5:
        return None
    return DataVersion(
        md5=md5.removesuffix(".dir"),
        dvc_file=str(dvc_file),
        files=int(outs[0].get("nfiles", 1)),
        size_bytes=int(outs[0].get("size", 0)),
        changed=False,
    )


def _dvc(project_dir: Path, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=project_dir, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        detail = " ".join((done.stderr or done.stdout).split())
        raise DreamgymError(f"dvc {' '.join(args)} failed in {project_dir}: {detail}")


def ensure_dvc_repo(project_dir: str | Path) -> None:
    project_dir = Path(project_dir)
    if not (project_dir / ".dvc").is_dir():
        _dvc(project_dir, "init", "--quiet", *([] if (project_dir / ".git").exists() else ["--no-scm"]))


def version_data(project_dir: str | Path, data_dir: str = "data") -> DataVersion:
    """`dvc add` the data folder and return its version.

    Inside a `dvc repro` stage (DVC sets DVC_STAGE) DVC holds the repository's lock, and the stage
    graph starts from data that data.dvc already versions: the recorded version is read instead.
    """
    project_dir = Path(project_dir).resolve()
    if os.environ.get("DVC_STAGE"):
        recorded = read_version(project_dir, data_dir)
        if recorded is None:
            raise DreamgymError(
                f"{_dvc_file(project_dir, data_dir).name} records no data version; run "
                "`dreamgym run` once to make and version the data before `dvc repro`"
            )
        return recorded
    data_path = project_dir / data_dir
    if not data_path.is_dir():
        raise DreamgymError(f"data folder {data_path} does not exist; run `dreamgym run` to make it")
    if data_path.parent != project_dir:
        raise DreamgymError(f"paths.data_dir must be a folder directly in the project ({project_dir}), got {data_dir}")
    ensure_dvc_repo(project_dir)
    before = read_version(project_dir, data_dir)
    _dvc(project_dir, "add", "--quiet", data_path.name)
    after = read_version(project_dir, data_dir)
    if after is None:
        raise DreamgymError(f"dvc add {data_dir} wrote no md5 to {_dvc_file(project_dir, data_dir)}")
    return DataVersion(
        md5=after.md5,
        dvc_file=after.dvc_file,
        files=after.files,
        size_bytes=after.size_bytes,
        changed=before is None or before.md5 != after.md5,
    )


def commit_stage(project_dir: str | Path, stage: str) -> None:
    """Record a `dvc.yaml` stage whose outputs were made outside `dvc repro` (by a flow) in
    `dvc.lock`, so that `dvc status` agrees and `dvc repro` has nothing to redo. Inside a
    `dvc repro` stage, DVC records its stages itself."""
    if os.environ.get("DVC_STAGE"):
        return
    _dvc(Path(project_dir), "commit", "--force", "--quiet", stage)


def dvc_stage_params(project_dir: str | Path, stage: str) -> list[str] | None:
    """The params.yaml keys a `dvc.yaml` stage declares, or None when there is no such stage."""
    path = Path(project_dir) / "dvc.yaml"
    if not path.is_file():
        return None
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages") or {}
    if stage not in stages:
        return None
    return [str(item) for item in stages[stage].get("params") or []]
