import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import pytest

from dreamgym.envs.real import games_if_any, list_games
from dreamgym.envs.textworld.config import GamesConfig
from dreamgym.envs.textworld.env import GameFileError
from dreamgym.envs.textworld.games import (
    _SERIAL_AT,
    STORY_SERIAL,
    GameGenerationError,
    _portable,
    _tw_make,
    fix_serial,
    game_setting,
    generate_games,
    plan_games,
    target_folder,
    target_settings,
)
from dreamgym.errors import DreamgymError


def test_plan_is_deterministic_and_draws_from_the_configured_settings():
    config = GamesConfig(recipe=(1, 2), take=(1, 2), go=(1, 6))
    plan = plan_games(config, "train", 30, seed=3)
    assert plan == plan_games(config, "train", 30, seed=3)
    assert plan != plan_games(config, "train", 30, seed=4)
    assert {spec.recipe for spec in plan} == {1, 2} and {spec.go for spec in plan} == {1, 6}
    assert all(spec.take <= spec.recipe for spec in plan)
    assert len({spec.name for spec in plan}) == 30
    assert plan[0].name.startswith("cooking-train-r") and plan[0].name.endswith("-okc-s300000")


def test_a_games_setting_is_read_back_from_its_name():
    plan = plan_games(GamesConfig(recipe=(3,), take=(2,), go=(12,), cook=False), "test", 2, seed=5)
    assert {game_setting(spec.name) for spec in plan} == {"recipe 3, take 2, rooms 12, open/cut"}
    bare = plan_games(GamesConfig(recipe=(1,), take=(1,), go=(1,), open=False, cook=False, cut=False), "train", 1, 0)
    assert game_setting(bare[0].name) == "recipe 1, take 1, rooms 1"
    assert game_setting("tw-simple-game") == "other"


def test_the_headroom_target_draws_the_preset_s_harder_games_into_folders_of_their_own():
    config, same = GamesConfig(target="headroom"), GamesConfig(target="same")
    plan = plan_games(target_settings(config), "test", 30, seed=3)
    assert {spec.recipe for spec in plan} == {2, 3} and {spec.take for spec in plan} == {2, 3}
    assert {spec.go for spec in plan} == {6, 9} and all(spec.open and spec.cook and spec.cut for spec in plan)
    # The training games keep the configured settings; only the target's games move.
    assert target_settings(same) == same
    assert (target_folder("test", config), target_folder("test", same)) == ("test-headroom", "test")


def test_unknown_split_is_rejected():
    with pytest.raises(DreamgymError, match="unknown split 'dev': use one of train, valid, test"):
        plan_games(GamesConfig(), "dev", 1, 0)


def test_existing_games_are_reused_and_a_seed_gives_identical_files(train_games, tmp_path):
    config = GamesConfig(recipe=(1, 2), take=(1, 2), go=(1, 6), train_count=3)
    specs = plan_games(config, "train", 3, seed=0)
    before = {path: path.stat().st_mtime_ns for path in train_games}
    paths, made = generate_games(specs, train_games[0].parent, progress=False)
    assert (paths, made) == (train_games, 0)
    assert {path: path.stat().st_mtime_ns for path in train_games} == before

    again, made = generate_games(specs[:1], tmp_path, progress=False)
    assert made == 1
    for suffix in (".z8", ".json"):
        digest = [hashlib.md5(p.with_suffix(suffix).read_bytes()).hexdigest() for p in (again[0], train_games[0])]
        assert digest[0] == digest[1], f"{suffix} differs between two generations of the same seed"
    assert not list(tmp_path.glob(".tw-make-*")), "scratch folders must be cleaned up"
    # Inform would write today's date as the serial number: another day gave other bytes.
    assert again[0].read_bytes()[_SERIAL_AT] == STORY_SERIAL
    # Nothing of this machine is recorded in a game, so other machines make the same bytes.
    metadata = again[0].with_suffix(".json").read_text()
    assert sys.prefix not in metadata and str(tmp_path) not in metadata
    assert '"text_grammars_path": "textworld/' in metadata


def test_a_game_made_after_another_in_one_process_has_the_bytes_of_its_own_tw_make_run(train_games, tmp_path):
    """Workers make their games one after another in one process: nothing TextWorld keeps between
    two games may change the second. The fixture's two workers made games 0 then 2, and 1."""
    spec = plan_games(GamesConfig(recipe=(1, 2), take=(1, 2), go=(1, 6)), "train", 3, seed=0)[2]
    alone = tmp_path / f"{spec.name}.z8"
    subprocess.run([_tw_make(), *spec.tw_make_args(alone)], env={**os.environ, "PYTHONHASHSEED": "0"}, check=True)
    metadata = alone.with_suffix(".json")
    metadata.write_text(json.dumps(_portable(json.loads(metadata.read_text()), alone)))
    fix_serial(alone)
    for suffix in (".z8", ".json", ".ni"):
        assert train_games[2].with_suffix(suffix).read_bytes() == alone.with_suffix(suffix).read_bytes(), suffix


def test_only_a_z_machine_story_gets_its_serial_fixed(tmp_path):
    not_a_story = tmp_path / "game.z8"
    not_a_story.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GameFileError, match=r"game\.z8 is not a Z-machine version 8 story"):
        fix_serial(not_a_story)
    assert not_a_story.read_bytes() == b"PK\x03\x04" + bytes(100)


def test_a_game_textworld_cannot_make_fails_with_its_name_and_the_reason(tmp_path):
    spec = dataclasses.replace(plan_games(GamesConfig(recipe=(1,), take=(1,), go=(1,)), "train", 1, seed=0)[0], go=3)
    with pytest.raises(GameGenerationError, match=rf"tw-make failed for {spec.name}: \w+"):
        generate_games([spec], tmp_path, progress=False)
    assert not list(tmp_path.glob("*.z8")) and not list(tmp_path.glob(".tw-make-*"))


def test_a_half_written_game_is_made_again(train_games, tmp_path):
    spec = plan_games(GamesConfig(recipe=(1,), take=(1,), go=(1,)), "train", 1, seed=9)[0]
    (tmp_path / f"{spec.name}.z8").write_bytes(train_games[0].read_bytes()[:100])
    paths, made = generate_games([spec], tmp_path, progress=False)
    assert made == 1 and list_games(tmp_path) == paths


def test_list_games_explains_an_empty_or_missing_folder(tmp_path):
    with pytest.raises(DreamgymError, match="does not exist"):
        list_games(tmp_path / "nope")
    with pytest.raises(DreamgymError, match=r"no games \(\.z8\) or tasks \(\.swtask\)"):
        list_games(tmp_path)


def test_task_games_come_after_the_training_games_as_the_same_seeds_would_make_them():
    config = GamesConfig(train_count=3, task_count=2)
    training = plan_games(config, "train", config.train_count, seed=7)
    tasks = plan_games(config, "train", config.task_count, seed=7, first=config.train_count)
    assert tasks == plan_games(config, "train", 5, seed=7)[3:]
    assert not {spec.name for spec in tasks} & {spec.name for spec in training}
    with pytest.raises(DreamgymError, match=r"games 99999\.\.100000 are out of range"):
        plan_games(config, "train", 2, seed=7, first=99_999)
    with pytest.raises(ValueError, match=r"train_count \+ task_count \+ target_train_count is 100047, .* lower"):
        GamesConfig(train_count=40, task_count=99_999)


def test_games_if_any_is_none_for_no_missing_or_empty_folder_and_the_games_otherwise(train_games, tmp_path):
    """`games.task_count: 0` leaves data/games/tasks empty, and RL then practises the training games only."""
    (tmp_path / "empty").mkdir()
    assert games_if_any(None) == games_if_any(tmp_path / "nope") == games_if_any(tmp_path / "empty") == []
    assert games_if_any(train_games[0].parent) == list_games(train_games[0].parent)
