import dataclasses
import json
import logging
import math
from collections import Counter
from pathlib import Path

import pytest

from dreamgym.config import load_config
from dreamgym.curriculum import (
    Curriculum,
    binary_entropy,
    check_variation,
    domain_variation_writer,
    reward_variance,
    task_score,
    variation_id,
    weighted_sample,
)
from dreamgym.envs.base import Task
from dreamgym.errors import ConfigError, DreamgymError
from dreamgym.rl.config import CurriculumConfig
from dreamgym.state import AbstractState, format_state

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def state(location: str, *actions: str, inventory: tuple[str, ...] = ()) -> str:
    return format_state(AbstractState(location=location, visible=("table",), inventory=inventory, actions=actions))


KITCHEN = state("kitchen", "go north", "open fridge", "take knife from table")
PANTRY = state("pantry", "go south", "take salt from shelf", inventory=("knife",))
GARDEN = state("garden", "go east", "take apple from tree")


def seed_tasks() -> list[Task]:
    return [
        Task("solved", "eat the meal", "tw-cooking", initial_state=KITCHEN, max_score=3),
        Task("failed", "cook the salt", "tw-cooking", initial_state=PANTRY, max_score=2),
        Task("mixed", "slice the apple", "tw-cooking", initial_state=GARDEN, max_score=4),
    ]


def config(**values) -> CurriculumConfig:
    return CurriculumConfig(**{"variation_fraction": 0.0, "tasks_per_epoch": 8, "selection": "entropy", **values})


def record_three(curriculum: Curriculum) -> None:
    curriculum.record("solved", [1.0] * 4, [True] * 4)
    curriculum.record("failed", [0.0, 0.5, 0.0, 0.5], [False] * 4)
    curriculum.record("mixed", [1.0, 0.0, 1.0, 0.0], [True, False, True, False])


# ---------------------------------------------------------------- pure functions


@pytest.mark.parametrize(
    "p, bits",
    [
        (0.0, 0.0),
        (1.0, 0.0),
        (0.5, 1.0),
        (0.25, 0.8112781244591328),  # -(0.25 log2 0.25 + 0.75 log2 0.75) = 0.5 + 0.311278...
    ],
)
def test_binary_entropy_by_hand(p, bits):
    assert binary_entropy(p) == pytest.approx(bits)


def test_binary_entropy_is_symmetric_and_rejects_non_probabilities():
    assert binary_entropy(0.1) == pytest.approx(binary_entropy(0.9))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        binary_entropy(1.2)


def test_reward_variance_by_hand():
    assert reward_variance([1.0, 0.0, 1.0, 0.0]) == pytest.approx(0.25)
    assert reward_variance([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) == pytest.approx(4.0)
    assert reward_variance([3.0]) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        reward_variance([])


def test_task_score_by_hand():
    assert task_score([1, 0, 0, 0], [True, False, False, False], "entropy") == pytest.approx(0.8112781244591328)
    assert task_score([1, 0, 1, 0], [True, False, True, False], "variance") == pytest.approx(0.25)
    # Always solved: no outcome to learn; all failed but scoring differently: the score's signal.
    assert task_score([1, 1], [True, True], "entropy") == 0.0
    assert task_score([0.0, 0.5], [False, False], "variance") == pytest.approx(0.0625)
    assert task_score([2.0, 2.0], [False, False], "variance") == 0.0
    with pytest.raises(ValueError, match="2 returns but 1 successes"):
        task_score([1, 0], [True], "entropy")
    with pytest.raises(ValueError, match="unknown selection"):
        task_score([1, 0], [True, False], "surprise")


def test_weighted_sample_without_then_with_replacement():
    import random

    rng = random.Random(0)
    assert sorted(weighted_sample(rng, ["a", "b", "c"], [1, 1, 1], 3)) == ["a", "b", "c"]
    assert weighted_sample(rng, ["a", "b"], [1.0, 0.0], 5) == ["a"] * 5


# ---------------------------------------------------------------- scoring and drawing


def test_scores_follow_the_recorded_outcomes():
    curriculum = Curriculum(seed_tasks(), config())
    assert [curriculum.score(t) for t in ("solved", "failed", "mixed")] == [1.0, 1.0, 1.0]  # unseen
    record_three(curriculum)
    assert [curriculum.score(t) for t in ("solved", "failed", "mixed")] == [0.0, 0.0, 1.0]
    variance = Curriculum(seed_tasks(), config(selection="variance"))
    record_three(variance)
    assert variance.score("mixed") == pytest.approx(0.25)
    assert variance.score("solved") == 0.0
    assert variance.score("failed") == pytest.approx(0.0625)  # all failed, but scored 0 or 0.5


def test_draws_pick_the_uncertain_task_first_and_fill_the_epoch_with_others_not_repeats():
    curriculum = Curriculum(seed_tasks(), config(tasks_per_epoch=1))
    record_three(curriculum)
    assert {curriculum.draw(epoch)[0].task_id for epoch in range(20)} == {"mixed"}
    # Two slots, one uncertain task: the other slot goes to a settled task, not to "mixed" again.
    curriculum = Curriculum(seed_tasks(), config(tasks_per_epoch=2))
    record_three(curriculum)
    for epoch in range(20):
        drawn = [task.task_id for task in curriculum.draw(epoch)]
        assert "mixed" in drawn and len(set(drawn)) == 2, drawn
    # Only a pool smaller than the epoch repeats tasks, the uncertain one most.
    curriculum = Curriculum(seed_tasks(), config(tasks_per_epoch=16))
    record_three(curriculum)
    counts = Counter(task.task_id for epoch in range(5) for task in curriculum.draw(epoch))
    assert sum(counts.values()) == 80 and set(counts) == {"mixed", "solved", "failed"}
    assert counts["mixed"] > counts["solved"] and counts["mixed"] > counts["failed"]


def test_uncertain_tasks_are_drawn_in_proportion_to_their_score():
    seeds = seed_tasks()
    curriculum = Curriculum(seeds, config(tasks_per_epoch=1))
    curriculum.record("solved", [1, 0, 0, 0], [True, False, False, False])  # 0.81 bits
    curriculum.record("failed", [1, 0], [True, False])  # 1 bit
    curriculum.record("mixed", [1, 1], [True, True])  # 0
    counts = Counter(curriculum.draw(epoch)[0].task_id for epoch in range(2000))
    assert "mixed" not in counts
    assert counts["failed"] / counts["solved"] == pytest.approx(1 / 0.8112781244591328, rel=0.15)


def test_unseen_tasks_come_before_tried_ones_that_score_zero():
    seeds = [*seed_tasks(), Task("new", "find the pepper", "tw-cooking", initial_state=KITCHEN)]
    for selection in ("entropy", "variance"):
        curriculum = Curriculum(seeds, config(tasks_per_epoch=1, selection=selection))
        curriculum.record("solved", [1.0], [True])
        curriculum.record("failed", [0.0], [False])
        curriculum.record("mixed", [0.5, 0.5], [False, False])
        assert curriculum.score("new") == 1.0
        assert {curriculum.draw(epoch)[0].task_id for epoch in range(20)} == {"new"}


def test_all_zero_scores_fall_back_to_uniform():
    curriculum = Curriculum(seed_tasks(), config(tasks_per_epoch=3))
    curriculum.record("solved", [1.0], [True])
    curriculum.record("failed", [0.0], [False])
    curriculum.record("mixed", [1.0], [True])
    assert sorted(task.task_id for task in curriculum.draw(0)) == ["failed", "mixed", "solved"]


def test_window_keeps_only_recent_rollouts():
    curriculum = Curriculum(seed_tasks(), config(window=2))
    curriculum.record("mixed", [1.0, 0.0], [True, False])
    curriculum.record("mixed", [0.0, 0.0], [False, False])
    assert curriculum.score("mixed") == 0.0


def test_record_rejects_unknown_tasks_and_mismatched_groups():
    curriculum = Curriculum(seed_tasks(), config())
    with pytest.raises(ValueError, match="unknown task id 'nope'"):
        curriculum.record("nope", [1.0], [True])
    with pytest.raises(ValueError, match="2 returns but 1 successes"):
        curriculum.record("mixed", [1.0, 0.0], [True])
    with pytest.raises(ValueError, match="not a finite number"):
        curriculum.record("mixed", [math.nan], [True])


def test_draw_is_deterministic_for_a_seed_and_epoch():
    def draws(seed):
        curriculum = Curriculum(
            seed_tasks() + [Task(f"t{i}", f"task {i}", "tw-cooking", initial_state=KITCHEN) for i in range(10)],
            config(tasks_per_epoch=5),
            seed=seed,
        )
        record_three(curriculum)
        return [[task.task_id for task in curriculum.draw(epoch)] for epoch in range(4)]

    assert draws(0) == draws(0)
    assert draws(0) != draws(1)
    assert len(set(map(tuple, draws(0)))) > 1  # epochs differ


def test_curriculum_off_is_uniform_over_seeds_and_writes_nothing():
    def never(seeds, count):
        raise AssertionError("write_variations must not be called with the curriculum off")

    seeds = seed_tasks()
    curriculum = Curriculum(
        seeds, config(enabled=False, variation_fraction=0.5, tasks_per_epoch=1), write_variations=never
    )
    record_three(curriculum)  # settled tasks still drawn: no scores used
    counts = Counter(curriculum.draw(epoch)[0].task_id for epoch in range(1500))
    assert set(counts) == {"solved", "failed", "mixed"}
    assert all(400 < count < 600 for count in counts.values())
    big = Curriculum(seeds, config(enabled=False, tasks_per_epoch=3))
    assert sorted(task.task_id for task in big.draw(0)) == ["failed", "mixed", "solved"]


# ---------------------------------------------------------------- variations


def test_check_variation_names_each_problem():
    seed = seed_tasks()[2]
    verbs = {"go", "open", "take"}
    known = {(seed.instruction, seed.initial_state)}
    ok = dataclasses.replace(
        seed, instruction="slice the pear", initial_state=state("garden", "go east", "take pear from tree")
    )
    assert check_variation(ok, seed, known, verbs) is None
    cases = {
        "instruction is empty": dataclasses.replace(ok, instruction="  "),
        "initial_state is missing": dataclasses.replace(ok, initial_state=None),
        "does not parse: expected 4 lines": dataclasses.replace(ok, initial_state="location: garden"),
        "no available actions": dataclasses.replace(ok, initial_state=state("garden")),
        "duplicates a known task": dataclasses.replace(
            ok, instruction=seed.instruction, initial_state=seed.initial_state
        ),
        "unknown verbs 'fly'": dataclasses.replace(ok, initial_state=state("garden", "fly north", "go east")),
    }
    for problem, candidate in cases.items():
        reason = check_variation(candidate, seed, known, verbs)
        assert reason is not None and problem in reason and "variation of mixed" in reason


def write_some(seeds, count):
    """A variation writer as the experience model would be: some good answers, some broken."""
    mixed = next(seed for seed in seeds if seed.task_id == "mixed")
    good = [
        dataclasses.replace(
            mixed, instruction="slice the pear", initial_state=state("garden", "go east", "take pear from tree")
        ),
        dataclasses.replace(
            mixed,
            task_id="mixed~abc",
            instruction="slice the plum",
            initial_state=state("orchard", "go west", "take plum from tree"),
        ),
    ]
    bad = [
        dataclasses.replace(mixed, instruction="slice the fig", initial_state="not a state"),
        dataclasses.replace(mixed, instruction="slice the fig", initial_state=state("garden")),
        dataclasses.replace(
            mixed,
            instruction="slice the pear",  # same as good[0]
            initial_state=state("garden", "go east", "take pear from tree"),
        ),
        dataclasses.replace(mixed, instruction="fly", initial_state=state("sky", "fly north")),
        dataclasses.replace(mixed, task_id="elsewhere", instruction="x", initial_state=state("garden", "go east")),
    ]
    return (good + bad)[:count]


def test_variations_are_checked_logged_counted_and_pooled(caplog):
    seeds = seed_tasks()
    calls = []

    def writer(top, count):
        calls.append(([task.task_id for task in top], count))
        return write_some(top, count)

    curriculum = Curriculum(
        seeds, config(tasks_per_epoch=7, variation_fraction=1.0, top_fraction=0.33), write_variations=writer
    )
    record_three(curriculum)
    with caplog.at_level(logging.WARNING, logger="dreamgym.curriculum"):
        drawn = curriculum.draw(0)
    assert calls == [(["mixed"], 7)]  # top 33% of 3 seeds: the one uncertain task
    reasons = [record.getMessage() for record in caplog.records]
    assert len(reasons) == 5
    for problem in (
        "does not parse",
        "no available actions",
        "duplicates a known task",
        "unknown verbs 'fly'",
        "names none of the offered seeds",
    ):
        assert sum(problem in reason for reason in reasons) == 1, problem
    pear = variation_id(seeds[2], "slice the pear", state("garden", "go east", "take pear from tree"))
    plum = variation_id(seeds[2], "slice the plum", state("orchard", "go west", "take plum from tree"))
    assert pear.startswith("mixed~") and pear != plum
    assert curriculum.pool[pear].env == "tw-cooking" and curriculum.pool[pear].max_score == 4
    ids = Counter(task.task_id for task in drawn)
    assert len(drawn) == 7 and ids[pear] == 1 and ids[plum] == 1
    # The 5 rejected slots go to the other pool tasks: each of the 3 once before any repeats.
    assert sum(ids[task] for task in ("mixed", "solved", "failed")) == 5
    assert all(ids[task] >= 1 for task in ("mixed", "solved", "failed"))
    metrics = curriculum.metrics()
    assert metrics["variations_accepted"] == 2 and metrics["variations_rejected"] == 5
    assert metrics["curriculum_tasks"] == 5
    assert metrics["curriculum_entropy"] == pytest.approx(1 / 3)  # 0, 0, 1 bits over tried tasks
    # Accepted variations are pool tasks from now on: recorded, scored, drawn.
    curriculum.record(pear, [1.0, 0.0], [True, False])
    assert curriculum.score(pear) == 1.0


class Adverbs:
    """A toy domain: the same start poses the task done twice or slowly."""

    def instruction_variants(self, instruction: str) -> tuple[str, ...]:
        return (f"{instruction} twice", f"{instruction} slowly")


def test_domain_variations_pose_other_tasks_from_the_seeds_start_each_once():
    seeds = seed_tasks()
    cfg = config(tasks_per_epoch=8, variation_fraction=0.25, top_fraction=1.0)
    curriculum = Curriculum(seeds, cfg, seed=3, write_variations=domain_variation_writer(Adverbs(), seed=3))
    new_per_epoch = []
    for epoch in range(4):
        before = set(curriculum.pool)
        curriculum.draw(epoch)
        new_per_epoch.append([curriculum.pool[task_id] for task_id in curriculum.pool if task_id not in before])
    assert [len(new) for new in new_per_epoch] == [2, 2, 2, 0]  # 3 seeds x 2 variants, then none left
    origins = {task.task_id: task for task in seeds}
    for task in (task for new in new_per_epoch for task in new):
        origin = origins[task.task_id.split("~")[0]]
        assert task.initial_state == origin.initial_state
        assert task.instruction in Adverbs().instruction_variants(origin.instruction)
    assert curriculum.metrics()["variations_rejected"] == 0
    # Resumed after epoch 0 with a new writer: the same tasks, epoch by epoch.
    original = Curriculum(seeds, cfg, seed=3, write_variations=domain_variation_writer(Adverbs(), seed=3))
    original.draw(0)
    state = json.loads(json.dumps(original.state_dict()))
    resumed = Curriculum.from_state_dict(state, seeds, cfg, write_variations=domain_variation_writer(Adverbs(), seed=3))
    for epoch in (1, 2, 3):
        assert resumed.draw(epoch) == original.draw(epoch)
    assert resumed.pool == original.pool == curriculum.pool


def test_the_dream_curriculum_has_its_variations_written_by_whom_the_config_names():
    from types import SimpleNamespace

    from dreamgym.config import PipelineConfig
    from dreamgym.experience.variations import dream_curriculum

    served = SimpleNamespace(domain=Adverbs(), model=None, tokenizer=None)  # a model served over HTTP: no weights here
    settings = config(variation_fraction=0.25, top_fraction=1.0)
    by_rules = dream_curriculum(
        seed_tasks(), served, PipelineConfig(curriculum=dataclasses.replace(settings, variations="domain"))
    )
    by_rules.draw(0)
    written = [task for task_id, task in by_rules.pool.items() if "~" in task_id]
    assert len(written) == 2 and all(task.instruction.endswith((" twice", " slowly")) for task in written)
    by_backbone = dream_curriculum(
        seed_tasks(), served, PipelineConfig(curriculum=dataclasses.replace(settings, variations="model"))
    )
    assert by_backbone.write_variations is None  # `model` variations need the backbone's weights
    # `games` (the default): the environment's game maker, which only the environment can give
    with pytest.raises(DreamgymError, match="no game maker was given"):
        dream_curriculum(seed_tasks(), served, PipelineConfig(curriculum=settings))
    by_games = dream_curriculum(seed_tasks(), served, PipelineConfig(curriculum=settings), game_writer=write_some)
    assert by_games.write_variations is write_some


def test_no_action_types_to_check_against_is_an_error():
    real = [Task("g1", "cook", "tw-cooking", game_file="g1.z8")]
    with pytest.raises(ValueError, match="pass known_verbs"):
        Curriculum(real, config(variation_fraction=0.5), write_variations=write_some)
    Curriculum(real, config(variation_fraction=0.5), write_variations=write_some, known_verbs={"go"})


# ---------------------------------------------------------------- resuming


def test_state_dict_round_trip_gives_identical_draws():
    seeds = seed_tasks()
    cfg = config(tasks_per_epoch=6, variation_fraction=0.34)
    original = Curriculum(seeds, cfg, seed=7, write_variations=write_some)
    record_three(original)
    original.draw(0)
    state = json.loads(json.dumps(original.state_dict()))
    resumed = Curriculum.from_state_dict(state, seeds, cfg, write_variations=write_some)
    assert resumed.pool == original.pool and resumed.metrics() == original.metrics()
    for epoch in (1, 2):
        assert resumed.draw(epoch) == original.draw(epoch)
    assert resumed.state_dict() == original.state_dict()


def test_state_dict_from_other_seeds_is_refused():
    original = Curriculum(seed_tasks(), config())
    record_three(original)
    with pytest.raises(ValueError, match="not among the seeds"):
        Curriculum.from_state_dict(original.state_dict(), seed_tasks()[:1], config())


# ---------------------------------------------------------------- configuration


def test_params_yaml_has_the_curriculum_defaults():
    assert load_config(PARAMS).curriculum == CurriculumConfig()


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "curriculum.variation_fraction",
            1.5,
            "curriculum.variation_fraction = 1.5: Input should be less than or equal to 1",
        ),
        ("curriculum.top_fraction", 0.0, "curriculum.top_fraction = 0.0: Input should be greater than 0"),
        (
            "curriculum.selection",
            "surprise",
            "curriculum.selection = 'surprise': Input should be 'entropy' or 'variance'",
        ),
        ("curriculum.window", 0, "curriculum.window = 0: Input should be greater than or equal to 1"),
    ],
)
def test_bad_curriculum_values_are_explained(tmp_path, key, value, message):
    import yaml

    values = yaml.safe_load(PARAMS.read_text())
    values["curriculum"][key.split(".")[1]] = value
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(values))
    with pytest.raises(ConfigError) as error:
        load_config(params)
    assert message in str(error.value) and "fix it in" in str(error.value)
