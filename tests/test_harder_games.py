"""Curriculum variations as real games one step harder than their seed (dreamgym/data/harder_games.py)."""

from __future__ import annotations

import dataclasses

from dreamgym.config import CurriculumConfig
from dreamgym.curriculum import Curriculum, state_verbs
from dreamgym.data.games import GameSpec, game_setting, spec_of
from dreamgym.data.harder_games import harder_game_writer, harder_specs
from dreamgym.envs.textworld_env import TextWorldEnv, tasks_at_start
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


def test_the_curriculum_takes_a_harder_real_game_that_its_walkthrough_wins(task_games, tmp_path):
    seeds = tasks_at_start(task_games)
    seed = seeds[0]
    settings = CurriculumConfig(tasks_per_epoch=4, variation_fraction=0.5, top_fraction=1.0, variations="games")
    _, _, played = play_expert(seed)  # the action types the offline data would show in the seed's game
    writer = harder_game_writer(tmp_path, seed=0)
    curriculum = Curriculum([seed], settings, seed=0, write_variations=writer, known_verbs=played)

    curriculum.draw(0)
    variations = [task for task_id, task in curriculum.pool.items() if task_id != seed.task_id]
    assert len(variations) == 2 and curriculum.rejected == 0
    base = spec_of(seed.task_id)
    for variation in variations:
        assert variation.task_id.startswith(f"{seed.task_id}~")
        made = spec_of(variation.game_file.rsplit("/", 1)[-1].removesuffix(".z8"))
        assert made in harder_specs(base)  # one setting raised, the split and seed kept
        assert parse_state(variation.initial_state).actions
        if made.recipe > base.recipe:
            assert variation.max_score > seed.max_score  # one more ingredient to score
        won, score, _ = play_expert(variation)
        assert won and score == variation.max_score

    curriculum.draw(1)  # the next epoch: other harder games, never the same one twice
    made = [task.game_file for task in curriculum.pool.values() if task.game_file and "~" in task.task_id]
    assert len(made) == len(set(made)) == min(4, len(harder_specs(base)))
