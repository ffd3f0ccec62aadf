"""Curriculum variations as real games one step harder than their seed
(dreamgym/envs/textworld/harder_games.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dreamgym.curriculum import Curriculum, state_verbs
from dreamgym.envs.real import tasks_at_start
from dreamgym.envs.textworld.env import TextWorldEnv
from dreamgym.envs.textworld.games import GameSpec, game_setting, spec_of
from dreamgym.envs.textworld.harder_games import harder_game_writer, harder_specs
from dreamgym.rl.config import CurriculumConfig
from dreamgym.state import parse_state

SPEC = GameSpec("train", 7, recipe=2, take=2, go=6, open=True, cook=True, cut=True)


def test_a_game_name_reads_back_into_its_spec():
    assert spec_of(SPEC.name) == SPEC
    plain = dataclasses.replace(SPEC, open=False, cook=False, cut=False)
    assert spec_of(plain.name) == plain
    assert spec_of("my-own-game") is None
    assert game_setting(SPEC.name) == "recipe 2, take 2, rooms 6, open/cook/cut"
    assert game_setting("my-own-game") == "other"


def test_a_harder_spec_raises_one_setting_within_what_tw_cooking_makes():
    steps = harder_specs(SPEC)
    # take is already the whole recipe: a larger recipe or the next map, nothing else changes
    assert steps == [dataclasses.replace(SPEC, recipe=3), dataclasses.replace(SPEC, go=9)]
    assert dataclasses.replace(SPEC, take=1) in harder_specs(dataclasses.replace(SPEC, take=0))
    assert harder_specs(dataclasses.replace(SPEC, recipe=5, take=5, go=12)) == []


def play_expert(task, max_steps: int = 80) -> tuple[bool, float, set[str]]:
    """Whether the game's walkthrough wins `task`, its final score, and the action types it met."""
    env = TextWorldEnv(max_steps)
    try:
        state, info = env.reset(task)
        verbs = state_verbs([state])
        for _ in range(max_steps):
            state, _, terminated, truncated, info = env.step(info["expert_action"])
            verbs |= state_verbs([state])
            if terminated or truncated:
                break
        return bool(info.get("won")), float(info["score"]), verbs
    finally:
        env.close()


@pytest.fixture(scope="module")
def seed_and_verbs(task_games):
    """A task game's task with its start, and the action types its walkthrough meets (what the
    offline data would show of it)."""
    seed = tasks_at_start(task_games)[0]
    return seed, play_expert(seed)[2]


def curriculum_of(seed, verbs, folder, tasks_per_epoch: int = 4) -> Curriculum:
    """Half of each epoch's tasks new variations of `seed`, made into `folder`."""
    settings = CurriculumConfig(
        tasks_per_epoch=tasks_per_epoch, variation_fraction=0.5, top_fraction=1.0, variations="games"
    )
    return Curriculum([seed], settings, seed=0, write_variations=harder_game_writer(folder), known_verbs=verbs)


def test_the_curriculum_takes_a_harder_real_game_that_its_walkthrough_wins(seed_and_verbs, tmp_path):
    seed, verbs = seed_and_verbs
    curriculum = curriculum_of(seed, verbs, tmp_path)

    curriculum.draw(0)
    variations = [task for task_id, task in curriculum.pool.items() if task_id != seed.task_id]
    assert len(variations) == 2 and curriculum.rejected == 0
    base = spec_of(seed.task_id)
    for variation in variations:
        assert variation.task_id.startswith(f"{seed.task_id}~")
        made = spec_of(Path(variation.game_file).stem)
        assert made in harder_specs(base)  # one setting raised, the split and seed kept
        assert parse_state(variation.initial_state).actions
        if made.recipe > base.recipe:
            assert variation.max_score > seed.max_score  # one more ingredient to score
        won, score, _ = play_expert(variation)
        assert won and score == variation.max_score

    curriculum.draw(1)  # the next epoch: other harder games, never the same one twice
    made = [task.game_file for task in curriculum.pool.values() if task.game_file and "~" in task.task_id]
    assert len(made) == len(set(made)) == min(4, len(harder_specs(base)))


def test_a_resumed_curriculum_takes_the_harder_games_the_uninterrupted_one_takes(seed_and_verbs, tmp_path):
    seed, verbs = seed_and_verbs
    assert len(harder_specs(spec_of(seed.task_id))) >= 2  # TINY_GAMES' settings are never tw-cooking's largest
    original = curriculum_of(seed, verbs, tmp_path, tasks_per_epoch=2)  # one variation an epoch
    original.draw(0)
    state = json.loads(json.dumps(original.state_dict()))
    # killed here: a new process, a new writer that remembers nothing it offered
    resumed = Curriculum.from_state_dict(
        state, [seed], original.config, write_variations=harder_game_writer(tmp_path), known_verbs=verbs
    )
    assert resumed.draw(1) == original.draw(1)
    assert resumed.pool == original.pool and len(original.pool) == 3  # the seed and two harder games
    assert resumed.rejected == 1  # epoch 0's game, offered again first, a duplicate
