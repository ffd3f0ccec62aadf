import subprocess

import pytest

from dreamgym.data.versioning import read_version, version_data
from dreamgym.errors import DreamgymError


def test_dvc_add_gives_a_stable_version_that_follows_the_data(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "data" / "games").mkdir(parents=True)
    (tmp_path / "data" / "games" / "a.txt").write_text("first")

    first = version_data(tmp_path)
    assert first.changed and first.files == 1 and len(first.md5) == 32
    assert (tmp_path / ".dvc").is_dir() and (tmp_path / "data.dvc").is_file()
    assert "/data" in (tmp_path / ".gitignore").read_text()
    assert read_version(tmp_path) == first.__class__(**{**first.__dict__, "changed": False})

    again = version_data(tmp_path)
    assert (again.md5, again.changed) == (first.md5, False)

    (tmp_path / "data" / "games" / "b.txt").write_text("second")
    changed = version_data(tmp_path)
    assert changed.changed and changed.md5 != first.md5 and changed.files == 2


def test_missing_data_folder_is_explained(tmp_path):
    with pytest.raises(DreamgymError, match="does not exist"):
        version_data(tmp_path)
    assert read_version(tmp_path) is None
