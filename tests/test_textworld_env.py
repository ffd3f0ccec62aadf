"""The TextWorld adapter on real generated games."""

import pytest

from dreamgym.envs.base import EnvError, GameFileError, Task
from dreamgym.envs.checker import EnvCheckError, check_env
from dreamgym.envs.real import tasks_at_start
from dreamgym.envs.textworld.env import TextWorldEnv, check_game_file, compact_recipe, load_task
from dreamgym.envs.textworld.games import generate_games, spec_of
from dreamgym.state import parse_state


def test_check_env_passes_on_every_generated_game(train_games, test_games):
    tasks = [load_task(game) for game in train_games + test_games]
    check_env(lambda: TextWorldEnv(max_steps=15), tasks)


def test_check_env_catches_a_broken_environment(train_games):
    class MergesDoneFlags(TextWorldEnv):
        def step(self, action):
            observation, reward, terminated, truncated, info = super().step(action)
            return observation, reward, terminated or truncated, truncated, info

    with pytest.raises(EnvCheckError, match="never both"):
        check_env(lambda: MergesDoneFlags(max_steps=3), [load_task(train_games[0])])


def test_expert_wins_and_rewards_add_up_to_the_max_score(train_games):
    env = TextWorldEnv(max_steps=100)
    for game in train_games:
        _observation, info = env.reset(load_task(game))
        total, terminated = 0.0, False
        while not terminated:
            _observation, reward, terminated, truncated, info = env.step(info["expert_action"])
            total += reward
            assert not truncated
        assert info["won"] and not info["lost"]
        assert total == info["max_score"] == info["score"]
    env.close()


def test_state_shows_location_visible_inventory_and_sorted_actions(train_games):
    env = TextWorldEnv()
    observation, info = env.reset(load_task(train_games[0]))
    state = parse_state(observation)
    assert state.location
    assert "cookbook" in {item.split(" (")[0] for item in state.visible + state.inventory}
    assert list(state.actions) == sorted(state.actions)
    assert info["expert_action"] in state.actions
    env.close()


def test_a_door_says_the_way_it_leads_and_opening_it_opens_that_way(train_games, test_games):
    """As the game's prose says "a closed patio door leading east": opening it adds `go east`."""
    env, opened = TextWorldEnv(max_steps=100), set()
    for game in train_games + test_games:
        observation, info = env.reset(load_task(game))
        terminated = False
        while not terminated:
            state = parse_state(observation)
            closed = [item for item in state.visible if item.split(" (")[0].endswith("door") and "(closed, " in item]
            if closed:  # open it on the way (the expert plans again from there)
                name, way = closed[0].split(" (")[0], closed[0].split(", ")[-1].rstrip(")")
                assert way in ("north", "south", "east", "west") and f"go {way}" not in state.actions
                observation, _, terminated, _, info = env.step(f"open {name}")
                assert f"{name} (open, {way})" in observation and f"go {way}" in parse_state(observation).actions
                opened.add((game, name))
            else:
                observation, _, terminated, _, info = env.step(info["expert_action"])
    env.close()
    assert opened, "no game of the fixtures has a closed door"


def test_unknown_and_inadmissible_actions_change_nothing(train_games):
    env = TextWorldEnv()
    observation, _ = env.reset(load_task(train_games[0]))
    for action in ("dance with the fridge", "take the moon", ""):
        after, reward, terminated, truncated, _ = env.step(action)
        assert (after, reward, terminated, truncated) == (observation, 0.0, False, False)
    env.close()


def test_truncated_at_the_step_limit_not_terminated(train_games):
    env = TextWorldEnv(max_steps=3)
    env.reset(load_task(train_games[0]))
    results = [env.step("look") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert not any(r[2] for r in results)
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("look")
    env.close()


def test_task_instruction_carries_the_recipe(train_games):
    task = load_task(train_games[0])
    assert task.task_id == train_games[0].stem
    assert "Recipe: ingredients:" in task.instruction and "directions:" in task.instruction


def test_compact_recipe():
    text = (
        "\nRecipe #1\n---------\nGather all.\n\nIngredients:\nred apple\n  white onion\n\n"
        "Directions:\nslice the red apple\n  prepare meal\n"
    )
    assert compact_recipe(text) == (
        "Recipe: ingredients: red apple, white onion. directions: slice the red apple; prepare meal."
    )


def test_missing_and_corrupt_game_files_are_rejected_before_loading(train_games, tmp_path):
    with pytest.raises(GameFileError, match="does not exist"):
        check_game_file(tmp_path / "nope.z8")
    story = train_games[0].read_bytes()
    truncated = tmp_path / "truncated.z8"
    truncated.write_bytes(story[:2000])
    with pytest.raises(GameFileError, match="truncated"):
        check_game_file(truncated)
    flipped = tmp_path / "flipped.z8"
    flipped.write_bytes(story[:5000] + bytes([story[5000] ^ 0xFF]) + story[5001:])
    flipped.with_suffix(".json").write_bytes(train_games[0].with_suffix(".json").read_bytes())
    with pytest.raises(GameFileError, match="checksum"):
        check_game_file(flipped)
    no_metadata = tmp_path / "alone.z8"
    no_metadata.write_bytes(story)
    with pytest.raises(GameFileError, match=r"no alone\.json"):
        check_game_file(no_metadata)
    with pytest.raises(GameFileError, match="not a Z-machine"):
        (tmp_path / "text.z8").write_text("hello" * 100)
        check_game_file(tmp_path / "text.z8")
    with pytest.raises(GameFileError, match="does not exist"):
        TextWorldEnv().reset(Task("x", "cook", "textworld", game_file=str(tmp_path / "nope.z8")))


def test_a_games_task_at_its_start_is_its_first_observation(task_games, train_games):
    """RL in DreamEnv starts from these (games.task_count): the state a reset shows, no step taken."""
    tasks = tasks_at_start(task_games + train_games[:1])
    env = TextWorldEnv()
    for task, game in zip(tasks, task_games + train_games[:1]):
        observation, info = env.reset(load_task(game))
        assert task.initial_state == observation and task.game_file == str(game.resolve())
        assert task.task_id == game.stem and task.max_score == info["max_score"]
        assert parse_state(task.initial_state).actions
    env.close()


# An RL policy's greedy episode on the headroom game below, up to its 41st step: after it, "go west"
# sent TextWorld's walkthrough planner round a four-move loop forever, and a policy evaluation hung.
LOOPING_GAME = "cooking-test-r2t2g9-okc-s9100016"
LOOPING_EPISODE = [
    "open plain door",
    "go west",
    "open fridge",
    "close fridge",
    "look",
    "take cookbook from table",
    "open fridge",
    "close fridge",
    "look",
    "go west",
    "go east",
    "drop cookbook",
    "open fridge",
    "close fridge",
    "look",
    "take cookbook",
    "go east",
    "go west",
    "put cookbook on counter",
    "open fridge",
    "close fridge",
    "look",
    "take cookbook from counter",
    "close plain door",
    "open fridge",
    "look",
    "close fridge",
    "look",
    "go west",
    "put cookbook on sofa",
    "go east",
    "open fridge",
    "look",
    "close fridge",
    "look",
    "go west",
    "take cookbook from sofa",
    "go south",
    "go east",
    "open patio door",
]


@pytest.mark.timeout(60)
def test_a_walkthrough_textworld_plans_round_a_loop_is_no_expert_action_not_a_hang(tmp_path):
    [game], _ = generate_games([spec_of(LOOPING_GAME)], tmp_path, workers=1, progress=False)
    env = TextWorldEnv(max_steps=50)
    _, info = env.reset(load_task(game))
    first_expert_action = info["expert_action"]
    for action in LOOPING_EPISODE:
        observation, _, terminated, _, info = env.step(action)
        assert not terminated and info["expert_action"] is not None
    assert parse_state(observation).location == "corridor"
    observation, reward, terminated, truncated, info = env.step("go west")
    assert parse_state(observation).location != "corridor" and info["expert_action"] is None
    assert (reward, terminated, truncated) == (0.0, False, False)
    # The episode plays on, without a walkthrough; the next one plans again from the start.
    after, _, _, _, info = env.step("go east")
    assert parse_state(after).location == "corridor" and info["expert_action"] is None
    _, info = env.reset(load_task(game))
    assert info["expert_action"] == first_expert_action
    env.close()
