"""DreamEnv: a real (tiny, from-scratch) experience model trained on real TextWorld transitions,
stepped as an environment under the same contract as the real one, and its write-back into a
real Postgres buffer."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import TINY_EXPERIENCE, train_experience

from dreamgym.buffer.config import BufferConfig
from dreamgym.buffer.retrieval import Filters, search
from dreamgym.buffer.store import upsert_transitions, write_back
from dreamgym.curriculum import Curriculum, check_variation
from dreamgym.data.schema import read_transitions, score_before, to_table
from dreamgym.envs.base import EnvError
from dreamgym.envs.checker import check_env
from dreamgym.envs.dream_env import DreamEnv, step_together
from dreamgym.envs.dynamics import Completion, Prediction, Query, Step
from dreamgym.envs.recall import RecallingDynamics
from dreamgym.experience.examples import neighbours
from dreamgym.experience.generate import ExperienceModel
from dreamgym.experience.variations import (
    parse_variation,
    seed_rows,
    seed_tasks,
    variation_examples,
    variation_prompt,
    variation_writer,
    write_variations,
)
from dreamgym.lm.model import init_model, load_model
from dreamgym.rl.config import CurriculumConfig
from dreamgym.state import format_state, parse_state

# The shared tiny model; longer completions: the episode's first step writes a long delta.
TINY = dataclasses.replace(TINY_EXPERIENCE, max_new_tokens=256)


@pytest.fixture(scope="module")
def rows(offline_dataset) -> list[dict]:
    return sorted(read_transitions(offline_dataset).to_pylist(), key=lambda row: (row["trajectory_id"], row["step"]))


@pytest.fixture(scope="module")
def experience(tiny_experience) -> ExperienceModel:
    model, tokenizer = load_model(tiny_experience.model_dir)
    return ExperienceModel(model, tokenizer, TINY)


@pytest.fixture(scope="module")
def task(first_episode, rows):
    return next(t for t in seed_tasks(rows) if t.task_id == first_episode[0]["task_id"])


def test_dream_env_passes_the_same_check_as_the_real_env(experience, task):
    check_env(lambda: DreamEnv(experience, max_steps=4), [task], seed=0)


def test_each_step_is_the_models_prediction_for_the_episode_so_far(experience, first_episode, task):
    env = DreamEnv(experience, max_steps=50)
    observation, info = env.reset(task)
    assert observation == first_episode[0]["state"] and info["expert_action"] is None
    history = []
    for row in first_episode[:3]:
        state = parse_state(observation)
        so_far = task.start_score + sum(step.reward for step in history)  # the game's score before the step
        expected = experience.predict(
            [
                Query(
                    task.instruction,
                    state,
                    row["action"],
                    tuple(history[-TINY.history :]),
                    env._episode.trajectory_id,
                    score=so_far,
                )
            ]
        )[0]
        observation, reward, terminated, _truncated, info = env.step(row["action"])
        if not expected.ok:
            assert (observation, reward, info["model_failure"]) == (format_state(state), 0.0, expected.error)
            break
        assert observation == format_state(expected.completion.next_state)
        assert (reward, terminated) == (expected.completion.reward, expected.completion.done)
        assert (
            info["won"] == (terminated and reward > 0)
            and info["score"] == sum(step.reward for step in history) + reward
        )
        history.append(Step(row["action"], reward, state.location))
        if terminated:
            break
    assert env.model_steps == len(history) + (not expected.ok)


class _RecordedDynamics:
    """Dynamics that know only the transitions they were given: (state, action) -> what followed.
    A second implementation of the protocol, with no language model: DreamEnv needs nothing else."""

    history = 0

    def __init__(self, rows):
        self.known = {(row["state"], row["action"]): row for row in rows}
        self.scores = []  # each query's score before its step

    def predict(self, queries):
        predictions = []
        for query in queries:
            self.scores.append(query.score)
            row = self.known.get((format_state(query.state), query.action))
            if row is None:
                predictions.append(Prediction(None, "", 1, error="no recorded transition"))
                continue
            completion = Completion(None, parse_state(row["next_state"]), row["reward"], row["terminated"])
            predictions.append(Prediction(completion, "", 1))
        return predictions


def test_any_dynamics_drives_dream_env_and_a_recorded_episode_replays_exactly(first_episode, task):
    env = DreamEnv(_RecordedDynamics(first_episode), max_steps=len(first_episode) + 1, policy="replay")
    observation, _ = env.reset(task)
    for row in first_episode:
        assert observation == row["state"]
        observation, reward, terminated, _, info = env.step(row["action"])
        assert (observation, reward, terminated) == (row["next_state"], row["reward"], row["terminated"])
    assert info["won"] == first_episode[-1]["won"] and env.failures == 0
    written = env.take_transitions()
    assert [(r["state"], r["action"], r["next_state"]) for r in written] == [
        (r["state"], r["action"], r["next_state"]) for r in first_episode
    ]
    env.reset(task)
    unknown = next(a for a in parse_state(first_episode[0]["state"]).actions if a != first_episode[0]["action"])
    observation, reward, terminated, _, info = env.step(unknown)  # a failure changes nothing, and says why
    assert (observation, reward, terminated, info["model_failure"]) == (
        first_episode[0]["state"],
        0.0,
        False,
        "no recorded transition",
    )


def test_a_query_carries_the_games_score_from_the_tasks_start(first_episode, task):
    """What a step pays can hang on the score so far (ScienceWorld credits some subgoals at the
    start, and pays each once): the query says it, from the task's starting score on."""
    dynamics = _RecordedDynamics(first_episode)
    env = DreamEnv(dynamics, max_steps=len(first_episode) + 1, policy="replay")
    started = dataclasses.replace(task, start_score=8.33)
    _, info = env.reset(started)
    assert info["score"] == 8.33
    for row in first_episode:
        env.step(row["action"])
    rewards = [row["reward"] for row in first_episode]
    assert dynamics.scores == pytest.approx([8.33 + sum(rewards[:t]) for t in range(len(rewards))])
    # A seed task read from the data starts at its first row's score before the step.
    assert task.start_score == score_before(first_episode[0]) == 0


def test_an_unavailable_action_changes_nothing_and_asks_no_model(experience, task):
    env = DreamEnv(experience, max_steps=3)
    start, _ = env.reset(task)
    observation, reward, terminated, truncated, info = env.step("dance with the fridge")
    assert (observation, reward, terminated, truncated) == (start, 0.0, False, False)
    assert env.model_steps == 0 and info["model_failure"] is None and env.take_transitions() == []
    env.step("sing")  # not "look": whether the model ends the episode there is the model's say
    observation, _, _, truncated, _ = env.step("dance")
    assert truncated and env.model_steps == 0  # the step limit is the env's, not the model's
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("look")


def test_batched_and_one_by_one_stepping_give_the_same_episodes(experience, first_episode, task):
    actions = [row["action"] for row in first_episode[:4]] + ["look"]
    one_by_one = []
    for slot in range(3):
        env = DreamEnv(experience, max_steps=len(actions), slot=slot)
        env.reset(task)
        one_by_one.append([env.step(action)[:4] for action in actions])
    together = [DreamEnv(experience, max_steps=len(actions), slot=slot) for slot in range(3)]
    for env in together:
        env.reset(task)
    batched = [[] for _ in together]
    for action in actions:
        for steps, result in zip(batched, step_together(together, [action] * len(together))):
            steps.append(result[:4])
    assert batched == one_by_one
    with pytest.raises(ValueError, match="appears twice"):
        step_together([together[0], together[0]], ["look", "look"])


def test_unparsable_predictions_are_counted_not_made_up(experience, task):
    untrained = ExperienceModel(
        init_model(experience.tokenizer, TINY, seed=0),
        experience.tokenizer,
        dataclasses.replace(TINY, max_new_tokens=8, retries=1),
    )
    env = DreamEnv(untrained, max_steps=5)
    start, _ = env.reset(task)
    action = parse_state(start).actions[0]
    observation, reward, terminated, _, info = env.step(action)
    assert (observation, reward, terminated) == (start, 0.0, False)
    assert info["model_failure"] and info["model_failures"] == 1 == env.failures
    assert env.take_transitions() == []  # nothing predicted, nothing to write back


def _replay(experience, task, rows) -> list[dict]:
    """The synthetic transitions of `rows`' actions played in a fresh DreamEnv, as written back."""
    env = DreamEnv(
        experience, max_steps=6, model_version="models:/dreamgym-experience/7", policy="policy-v3", run_id="run-1"
    )
    env.reset(task)
    for row in rows:
        if env.step(row["action"])[2]:
            break
    transitions = env.take_transitions()
    assert env.take_transitions() == []  # taken once
    return transitions


def test_write_back_is_tagged_idempotent_and_kept_out_of_real_retrieval(
    experience, first_episode, task, rows, buffer_db, encoder
):
    upsert_transitions(buffer_db, to_table(rows), embed=encoder.encode)
    synthetic = _replay(experience, task, first_episode[:5])
    assert synthetic
    config = BufferConfig()
    first = write_back(buffer_db, synthetic, config, embed=encoder.encode)
    assert first.inserted == len(synthetic)
    assert write_back(buffer_db, synthetic, config, embed=encoder.encode).inserted == 0
    with buffer_db.engine.connect() as connection:
        stored = connection.exec_driver_sql(
            "SELECT source, model_version, policy, run_id, count(*) FROM transitions "
            "WHERE source = 'synthetic' GROUP BY 1, 2, 3, 4"
        ).all()
    assert [tuple(r) for r in stored] == [
        ("synthetic", "models:/dreamgym-experience/7", "policy-v3", "run-1", len(synthetic))
    ]
    # Replaying the same rollouts (same task, slot, versions, episode number) gives the same ids.
    again = _replay(experience, task, first_episode[:5])
    assert [r["content_hash"] for r in again] == [r["content_hash"] for r in synthetic]
    assert write_back(buffer_db, again, config, embed=encoder.encode).inserted == 0
    with pytest.raises(ValueError, match="synthetic transitions only"):
        write_back(buffer_db, first_episode[:1], config, embed=encoder.encode)
    # Grounding: by default retrieval returns real transitions only, synthetic ones on request.
    query = [{"instruction": task.instruction, "state": synthetic[0]["state"], "action": synthetic[0]["action"]}]
    real_only = neighbours(buffer_db, encoder, query, k=5, ef_search=100)[0]
    assert real_only and all(t["source"] == "real" for t in real_only)
    vector = encoder.encode([f"action: {synthetic[0]['action']}"])
    found = search(buffer_db, vector, 50, filters=[Filters(source="synthetic")], ef_search=200)[0]
    assert {hit.transition["content_hash"] for hit in found} == {r["content_hash"] for r in synthetic}


# --- variations: the second objective ----------------------------------------------------------


def test_variation_examples_pair_a_seed_with_real_tasks_and_renamed_copies(rows):
    examples = variation_examples(rows, per_task=4)
    seeds = {row["task_id"]: row for row in seed_rows(rows)}
    assert len(examples) == 4 * len(seeds) and {e.objective for e in examples} == {"variation"}
    real_tasks = {(row["instruction"], row["state"]) for row in seeds.values()}
    for example in examples:
        seed = seeds[example.task_id]
        assert example.prompt == variation_prompt(seed["instruction"], seed["state"])
        instruction, state = parse_variation(example.completion)
        assert (instruction, state) != (seed["instruction"], seed["state"])
        target = parse_state(state)  # a well-formed initial state, with actions to take
        assert target.actions
        if (instruction, state) not in real_tasks:  # the seed renamed: same layout, new objects
            assert target.location == parse_state(seed["state"]).location
            assert len(target.actions) == len(parse_state(seed["state"]).actions)
    assert parse_variation("<task>t</task>\n<state>\nbroken") is None


def test_written_variations_are_checked_before_use(rows, tmp_path):
    seeds = seed_tasks(rows)[:3]
    seed_ids = {task.task_id for task in seeds}
    examples = variation_examples([row for row in rows if row["task_id"] in seed_ids], per_task=2)
    config = dataclasses.replace(TINY, epochs=100, max_length=1024)
    result = train_experience(examples, config, tmp_path)
    model, tokenizer = load_model(result.model_dir)
    written = write_variations(model, tokenizer, seeds, count=6, seed=0, max_new_tokens=480)
    assert len(written) == 6
    known = {(task.instruction, task.initial_state) for task in seeds}
    verbs = {action.split()[0] for task in seeds for action in parse_state(task.initial_state).actions}
    reasons = []
    for variant, seed in zip(written, [seeds[i % 3] for i in range(6)]):
        assert variant.task_id.startswith(f"{seed.task_id}~") and variant.env == seed.env
        reason = check_variation(variant, seed, known, verbs)
        if reason is None:
            parsed = parse_state(variant.initial_state)
            assert parsed.actions and variant.instruction
            known.add((variant.instruction, variant.initial_state))
        reasons.append(reason)
    # Trained on few examples, the tiny model writes some usable variants (its renamed copies)
    # and some it must not use (copies of known tasks, broken states); each refusal says why.
    assert any(reason is None for reason in reasons), reasons
    assert all(reason is None or len(reason) > 10 for reason in reasons)
    # The curriculum asks the same model, checks what it writes and pools what it accepts.
    curriculum = Curriculum(
        seeds,
        CurriculumConfig(tasks_per_epoch=4, variation_fraction=0.5),
        write_variations=variation_writer(model, tokenizer, max_new_tokens=480),
    )
    drawn = curriculum.draw(epoch=0)
    metrics = curriculum.metrics()
    assert len(drawn) == 4 and metrics["variations_accepted"] + metrics["variations_rejected"] == 2
    assert metrics["curriculum_tasks"] == 3 + metrics["variations_accepted"]


def test_recalled_steps_replay_the_real_game_and_the_model_predicts_the_rest(experience, rows, first_episode, task):
    """rl.recall_real: a step the real data recorded gets the game's outcome, is counted apart from
    the model's steps and is not written back; any other step is the model's prediction."""
    recalling = RecallingDynamics(experience, rows)
    env = DreamEnv(recalling, max_steps=len(first_episode) + 1)
    observation, _ = env.reset(task)
    for row in first_episode:
        observation, reward, terminated, _, info = env.step(row["action"])
        assert (observation, reward, terminated) == (row["next_state"], row["reward"], row["terminated"])
    assert info["won"] == first_episode[-1]["won"]
    assert (env.recalled_steps, env.model_steps, recalling.recalled) == (len(first_episode), 0, len(first_episode))
    assert env.take_transitions() == []  # real rows already: nothing synthetic to write back

    start = parse_state(first_episode[0]["state"])
    recorded = {row["action"] for row in rows if row["task_id"] == task.task_id and parse_state(row["state"]) == start}
    unrecorded = next(action for action in start.actions if action not in recorded)
    query = Query(task.instruction, start, unrecorded, (), None, task.task_id)
    [expected] = experience.predict([query])
    [answered] = recalling.predict([query])
    assert not answered.recalled and answered == expected


def test_a_step_is_recalled_only_in_its_own_task_and_when_the_record_has_one_outcome(experience, rows, task):
    row = next(r for r in rows if r["task_id"] == task.task_id)
    query = Query(row["instruction"], parse_state(row["state"]), row["action"], (), None, task.task_id)
    other_outcome = next(r["next_state"] for r in rows if r["next_state"] != row["next_state"])
    [known] = RecallingDynamics(experience, [row]).predict([query])
    assert known.recalled and known.completion.next_state == parse_state(row["next_state"])
    # Another game with the same visible state may go elsewhere: its task id must match.
    [elsewhere] = RecallingDynamics(experience, [row]).predict([dataclasses.replace(query, task_id="another-game")])
    # A hidden state (what a closed container holds) can give one visible step two outcomes.
    ambiguous = RecallingDynamics(experience, [row, row | {"next_state": other_outcome}])
    [undecided] = ambiguous.predict([query])
    assert not elsewhere.recalled and not undecided.recalled and ambiguous.ambiguous == 1
