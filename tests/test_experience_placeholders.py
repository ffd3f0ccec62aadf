"""Placeholder names: game-specific objects shown as obj1, obj2, ... and put back in predictions,
so that an experience model handles objects it never saw (real games; a tiny real model)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import TINY_EXPERIENCE, train_experience

from dreamgym.data.schema import read_transitions
from dreamgym.envs.dynamics import Completion, Query, Step
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.examples import build_examples, load_kept_names, queries_of, save_examples
from dreamgym.experience.format import FormatError, parse_completion, with_real_names
from dreamgym.experience.generate import (
    SETTINGS_FILE,
    ExperienceModel,
    save_settings,
    trained_kept_names,
    trained_settings,
)
from dreamgym.lm.model import load_model
from dreamgym.placeholders import Placeholders, kept_names
from dreamgym.renaming import Renamer
from dreamgym.state import AbstractState, parse_state

TINY = dataclasses.replace(TINY_EXPERIENCE, placeholders=True)


def _row(task: str, state: AbstractState, next_state: AbstractState) -> dict:
    return {"task_id": task, "state": state.to_text(), "next_state": next_state.to_text()}


def test_kept_names_are_the_objects_never_carried_or_in_most_tasks():
    def kitchen(food: str) -> AbstractState:
        return AbstractState(
            "kitchen",
            ("fridge (closed)", f"{food} (on table)", "table"),
            ("knife",),
            ("open fridge", f"take {food} from table"),
        )

    rows = [_row(f"game-{food}", kitchen(food), kitchen(food)) for food in ("carrot", "tomato", "carrot", "leek")]
    # Furniture is never carried; the knife is carried in all three tasks; each food can be taken
    # but is in one task only.
    assert kept_names(rows) == {"fridge", "table", "knife"}


def test_placeholders_number_the_action_first_then_carried_then_visible_and_restore_names():
    kept = frozenset({"counter", "knife"})
    # A new piece of furniture (the BBQ) cannot be taken: it keeps its name though not kept.
    state = AbstractState(
        "kitchen",
        ("BBQ", "counter", "red apple (on counter)", "yellow potato (on counter)"),
        ("carrot (sliced)", "knife"),
        ("eat carrot", "take red apple from counter", "take yellow potato from counter"),
    )
    names = Placeholders.of(kept, "take yellow potato from counter", [state])
    assert names.mapping == {"yellow potato": "obj1", "carrot": "obj2", "red apple": "obj3"}
    shown = names.forward.abstract(state)
    assert shown == AbstractState(
        "kitchen",
        ("BBQ", "counter", "obj1 (on counter)", "obj3 (on counter)"),
        ("knife", "obj2 (sliced)"),
        ("eat obj2", "take obj1 from counter", "take obj3 from counter"),
    )
    assert names.backward.abstract(shown) == state
    predicted = Completion(
        "obj1 goes into the inventory; obj9 appears.",
        AbstractState(
            "kitchen",
            ("BBQ", "counter", "obj3 (on counter)", "obj9"),
            ("knife", "obj1", "obj2 (sliced)"),
            ("drop obj1",),
        ),
        0.0,
        False,
    )
    restored = with_real_names(predicted, names)
    # A name the model wrote from memory beside the placeholder that stands for it would repeat an
    # item once restored: a failed attempt (generated again), never a state with a repeated item.
    twice = Completion(None, AbstractState("kitchen", ("BBQ",), ("obj1", "yellow potato"), ()), 0.0, False)
    with pytest.raises(FormatError, match="both by its placeholder and by its real name"):
        with_real_names(twice, names)
    # A placeholder the prompt never gave (an imagined object) stays as the model wrote it.
    assert restored.reasoning == "yellow potato goes into the inventory; obj9 appears."
    assert restored.next_state == AbstractState(
        "kitchen",
        ("BBQ", "counter", "obj9", "red apple (on counter)"),
        ("carrot (sliced)", "knife", "yellow potato"),
        ("drop yellow potato",),
    )


def test_objects_the_model_imagines_are_named_after_what_the_task_asks_for():
    """Opening the fridge, the model writes placeholders its prompt never gave (the prompt's own
    are obj1 and obj2): lowest number first, they take the task's objects the episode has not
    shown; any more stay as written."""
    state = AbstractState(
        "kitchen",
        ("fridge (closed)", "red apple (on counter)"),
        ("carrot",),
        ("open fridge", "take red apple from counter"),
    )
    names = Placeholders.of(frozenset({"fridge"}), "open fridge", [state], imagined=("white onion", "milk"))
    assert names.mapping == {"carrot": "obj1", "red apple": "obj2"}
    opened = AbstractState(
        "kitchen",
        ("fridge (open)", "obj12 (in fridge)", "obj2 (on counter)", "obj3 (in fridge)", "obj4 (in fridge)"),
        ("obj1",),
        ("take obj12 from fridge", "take obj3 from fridge", "take obj4 from fridge"),
    )
    restored = with_real_names(Completion("obj3 and obj4 appear.", opened, 0.0, False), names)
    assert restored.next_state == AbstractState(
        "kitchen",
        ("fridge (open)", "milk (in fridge)", "obj12 (in fridge)", "red apple (on counter)", "white onion (in fridge)"),
        ("carrot",),
        ("take milk from fridge", "take obj12 from fridge", "take white onion from fridge"),
    )
    assert restored.reasoning == "white onion and milk appear."
    # Nothing left to ask for: imagined objects stay placeholders, as they were written.
    assert with_real_names(Completion(None, opened, 0.0, False), Placeholders(names.mapping)).next_state == (
        Placeholders(names.mapping).backward.abstract(opened)
    )


def test_the_imagined_names_are_the_tasks_objects_the_episode_has_not_shown():
    task = "Recipe: ingredients: carrot, white onion, milk. directions: slice the carrot; prepare meal."
    state = AbstractState("kitchen", ("fridge (closed)",), ("carrot",), ("open fridge",))
    history = (Step("take milk from counter", 0.0, "pantry"), Step("drop milk", 0.0, "pantry"))
    model = ExperienceModel(None, None, TINY, kept_names=frozenset())
    assert model.imagined_names(Query(task, state, "open fridge", history, "t")) == ("white onion",)
    assert model.imagined_names(Query(task, state, "open fridge", (), "t")) == ("white onion", "milk")
    off = ExperienceModel(None, None, dataclasses.replace(TINY, name_imagined=False), kept_names=frozenset())
    assert off.imagined_names(Query(task, state, "open fridge", (), "t")) == ()


@pytest.fixture(scope="module")
def rows(offline_dataset) -> list[dict]:
    return sorted(read_transitions(offline_dataset).to_pylist(), key=lambda row: (row["trajectory_id"], row["step"]))


def test_examples_name_no_game_specific_object_and_read_back_to_the_real_step(rows, tmp_path):
    kept = kept_names(rows)
    game_specific = {
        name for row in rows for column in ("state", "next_state") for name in Placeholders.of_row(kept, row).mapping
    }
    assert {"knife", "cookbook", "fridge"} <= kept and game_specific, "the games should have foods"
    assert not game_specific & kept
    examples = build_examples(None, None, rows, ExperienceConfig(neighbours=0, history=2), ef_search=40)
    for example, row in zip(examples, rows):
        names = Placeholders.of_row(kept, row)
        # No game-specific object the step shows is named anywhere, the task and history included
        # (a recipe's ingredient the state does not show yet keeps its name, in training as later).
        hidden = Renamer({name: name for name in names.mapping})
        assert not hidden.found(example.prompt) and not hidden.found(example.completion)
        shown = parse_state(example.prompt.split("<state>\n")[1].split("\n</state>")[0])
        assert shown == names.forward.abstract(parse_state(row["state"]))
        restored = with_real_names(parse_completion(example.completion, shown, reasoning=True), names)
        assert restored.next_state == parse_state(row["next_state"])
        assert (restored.reward, restored.done) == (row["reward"], row["terminated"])
    # The kept names travel with the examples, and from them to the model's settings.
    path = save_examples(examples, tmp_path / "examples.parquet", kept=kept)
    assert load_kept_names(path) == kept
    assert load_kept_names(save_examples(examples, tmp_path / "plain.parquet")) is None
    save_settings(tmp_path, ExperienceConfig(), load_kept_names(path))
    trained = trained_settings(tmp_path, TINY_EXPERIENCE)
    assert trained_kept_names(tmp_path) == kept and trained.placeholders
    assert trained.retrieval_pool == ExperienceConfig().retrieval_pool > 0
    assert trained_settings(tmp_path, dataclasses.replace(TINY_EXPERIENCE, copy_examples=False)).copy_examples
    # A model saved before placeholders (retrieval by situation, examples named in completions)
    # existed was trained without them.
    legacy = json.loads((tmp_path / SETTINGS_FILE).read_text())
    del legacy["placeholders"], legacy["kept_names"], legacy["retrieval_pool"], legacy["copy_examples"]
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(legacy))
    trained = trained_settings(tmp_path, TINY)
    assert trained_kept_names(tmp_path) is None and not trained.placeholders
    assert trained.retrieval_pool == 0 and not trained.copy_examples
    with pytest.raises(ValueError, match="kept names"):
        ExperienceModel(None, None, ExperienceConfig(neighbours=0))
    with pytest.raises(ValueError, match="retrieval_pool"):
        ExperienceConfig(neighbours=3, retrieval_pool=2)


def _exact(predictions, rows) -> float:
    return sum(
        p.ok and p.completion.next_state == parse_state(row["next_state"]) for p, row in zip(predictions, rows)
    ) / len(rows)


@pytest.mark.long
def test_a_model_with_placeholders_predicts_objects_it_never_saw(rows, first_episode, tiny_experience, tmp_path):
    kept = kept_names(rows)
    examples = build_examples(None, None, first_episode, TINY, ef_search=40, kept=kept)
    result = train_experience(examples, TINY, tmp_path)
    with_placeholders = ExperienceModel(*load_model(result.model_dir), TINY, kept_names=kept)
    # The same episode in a game whose foods have names no training game has.
    foods = {name for row in first_episode for name in Placeholders.of_row(kept, row).mapping}
    unseen = Renamer({name: f"zelmor {name}" for name in foods})
    renamed = [unseen.row(row) for row in first_episode]
    queries, renamed_queries = queries_of(first_episode, TINY.history), queries_of(renamed, TINY.history)

    # The model is shown the same states and actions (only a recipe's ingredient that no state
    # shows yet keeps its name, in the task), and writes the steps in the new names.
    def shown(model, queries):
        return [prompt.split("<state>")[1] for prompt in model.prompts(queries)]

    assert shown(with_placeholders, renamed_queries) == shown(with_placeholders, queries)
    seen, new = with_placeholders.predict(queries), with_placeholders.predict(renamed_queries)
    assert _exact(new, renamed) >= 0.5 and _exact(seen, first_episode) >= 0.5
    # Without placeholders, the same tiny model trained on the same episode writes the names it
    # learnt: it gets the renamed episode wrong wherever a food changes.
    without = ExperienceModel(*load_model(tiny_experience.model_dir), TINY_EXPERIENCE)
    baseline = _exact(without.predict(renamed_queries), renamed)
    assert baseline < _exact(new, renamed), baseline
