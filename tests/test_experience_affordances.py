"""Actions learnt from objects (experience/affordances.py): what a state offers, learnt from states,
carried to objects and furniture the data never showed."""

from __future__ import annotations

import json

import pytest

from dreamgym.domain import NO_RULES, named_domain
from dreamgym.errors import DreamgymError
from dreamgym.experience.affordances import (
    Affordances,
    adapted_change,
    learnt_from_rows,
    learnt_task_actions,
    template_of,
    with_learnt_actions,
    with_own_states,
)
from dreamgym.experience.format import applied, state_delta
from dreamgym.placeholders import Placeholders
from dreamgym.state import AbstractState, format_state, item_name

KEPT = frozenset({"knife", "table", "counter", "fridge"})


def kitchen(food: str, carried: bool, cut: bool = False, knife: bool = False, on: str = "table") -> AbstractState:
    """A small world with the rules the tests teach: a carried food can be put on each supporter,
    eaten and (with the knife carried, if not cut yet) sliced; a food lying `on` one can be taken."""
    supporters = ["table", "counter"]
    item = f"{food} (sliced)" if cut else food
    visible = list(supporters) + (["knife (on counter)"] if not knife else [])
    inventory = ["knife"] if knife else []
    actions = ["go west", "look"]
    if carried:
        inventory.append(item)
        actions += [f"eat {food}", *(f"put {food} on {s}" for s in supporters)]
        if knife and not cut:
            actions.append(f"slice {food} with knife")
    else:
        visible.append(f"{food} (sliced, on {on})" if cut else f"{food} (on {on})")
        actions.append(f"take {food} from {on}")
    if knife:
        actions += [f"put knife on {s}" for s in supporters]
    else:
        actions.append("take knife from counter")
    return AbstractState("kitchen", tuple(visible), tuple(inventory), tuple(actions))


TRAINING = [
    kitchen(food, carried, cut, knife)
    for food in ("apple", "carrot", "potato")
    for carried in (False, True)
    for cut in (False, True)
    for knife in (False, True)
]


def object_actions(state: AbstractState) -> set[str]:
    names = [item.split(" (")[0] for item in state.visible + state.inventory]
    return {action for action in state.actions if template_of(action, names)[1]}


def test_templates_name_the_objects_of_an_action_longest_first():
    assert template_of("slice red apple with knife", ["apple", "red apple", "knife"]) == (
        "slice {0} with {1}",
        ("red apple", "knife"),
    )
    assert template_of("go west", ["apple"]) == ("go west", ())


def test_actions_are_learnt_for_a_food_the_data_never_showed():
    learnt = Affordances.learn(TRAINING, KEPT)
    for cut in (False, True):
        before = kitchen("pear", carried=False, cut=cut, knife=True)
        after = kitchen("pear", carried=True, cut=cut, knife=True)
        blank = AbstractState(after.location, after.visible, after.inventory, ())
        assert learnt.predict(blank, before) == object_actions(after), cut  # sliced once, never twice


def test_actions_on_objects_a_step_leaves_alone_are_kept_and_a_saved_model_predicts_the_same(tmp_path):
    learnt = Affordances.learn(TRAINING, KEPT)
    # A supporter the data never showed: the previous state shows what it is for.
    before = kitchen("pear", carried=True)
    before = AbstractState(
        before.location,
        (*before.visible, "shelf"),
        before.inventory,
        (*before.actions, "put pear on shelf", "examine shelf"),
    )
    taken = AbstractState(
        "kitchen", tuple(v for v in before.visible if not v.startswith("knife")), ("knife", "pear"), ()
    )
    predicted = learnt.predict(taken, before)
    assert {"slice pear with knife", "put knife on shelf", "put pear on shelf"} <= predicted
    assert "examine shelf" not in predicted  # no training state offered that template
    learnt.save(tmp_path / "affordances.json")
    assert Affordances.load(tmp_path / "affordances.json").predict(taken, before) == predicted


def test_an_examples_change_is_shown_as_the_change_it_makes_here():
    learnt = Affordances.learn(TRAINING, KEPT)
    # An example from a world where the food lay on the counter and the knife was carried: its
    # actions line removes `take obj1 from counter`, which this state does not offer, and adds
    # the slicing this world does not allow.
    there_before, there_after = kitchen("apple", False, knife=True, on="counter"), kitchen("apple", True, knife=True)
    here_before, here_after = kitchen("pear", False), kitchen("pear", True)
    names = Placeholders({"pear": "obj1"})
    example = Placeholders({"apple": "obj1"}).forward
    change = state_delta(example.abstract(there_before), example.abstract(there_after))
    shown = names.forward.abstract(here_before)
    assert applied(shown, change) is None
    adapted = adapted_change(shown, change, names, learnt)
    assert names.backward.abstract(applied(shown, adapted)) == here_after
    # A change that applies but brings its own world's actions (the slicing) is shown as the
    # change it makes here too; one that cannot apply even without its actions is left as it is.
    sliced_there = state_delta(example.abstract(kitchen("apple", False, knife=True)), example.abstract(there_after))
    assert applied(shown, sliced_there) is not None
    assert names.backward.abstract(applied(shown, adapted_change(shown, sliced_there, names, learnt))) == here_after
    assert adapted_change(shown, "inventory: -obj9", names, learnt) == "inventory: -obj9"


def test_actions_on_no_object_follow_the_change_and_a_move_takes_the_exits_it_lists():
    learnt = Affordances.learn(TRAINING, KEPT)
    before, after = kitchen("pear", False), kitchen("pear", True)
    blank = AbstractState(after.location, after.visible, after.inventory, ())
    assert set(with_learnt_actions(before, blank, "actions: -look; +inventory", learnt).actions) == (
        object_actions(after) | {"go west", "inventory"}
    )
    # A move's change replaces the list: its actions on no object are the new room's exits, and
    # its object actions (of the example's room) give way to the learnt ones.
    moved = AbstractState("corridor", ("bench",), after.inventory, ())
    line = "actions = eat pear; go north; go south; put pear on bench"
    offered = with_learnt_actions(before, moved, line, learnt).actions
    assert {action for action in offered if not template_of(action, ["pear", "bench"])[1]} == {"go north", "go south"}
    assert "eat pear" in offered
    assert "go west" in with_learnt_actions(before, moved, "", learnt).actions  # no actions line: unchanged
    # An object the step used up (eaten, or taken into a meal) takes its actions with it, whatever
    # the change's own line removes: they are actions on an object, not on none.
    used_up = AbstractState(after.location, after.visible, tuple(i for i in after.inventory if "pear" not in i), ())
    assert any("pear" in action for action in after.actions)
    assert not [action for action in with_learnt_actions(after, used_up, "", learnt).actions if "pear" in action]
    # Adapted, a move keeps the exits its example's change lists.
    names = Placeholders({"pear": "obj1"})
    shown = names.forward.abstract(before)
    change = "location: corridor\nvisible =\nactions = go east; go north"
    adapted = names.backward.abstract(applied(shown, adapted_change(shown, change, names, learnt)))
    assert {"go east", "go north"} <= set(adapted.actions) and "go west" not in adapted.actions


def test_an_examples_object_lends_its_change_not_its_states(tmp_path):
    learnt = Affordances.learn(TRAINING, KEPT)
    # The example put down a plain apple; here the pear is sliced. Copied as written, the change
    # would lay down a plain pear: the pear keeps its own states and takes the example's new place.
    there_before, there_after = kitchen("apple", True), kitchen("apple", False, on="table")
    here_before, here_after = kitchen("pear", True, cut=True), kitchen("pear", False, cut=True, on="table")
    names, example = Placeholders({"pear": "obj1"}), Placeholders({"apple": "obj1"}).forward
    change = state_delta(example.abstract(there_before), example.abstract(there_after))
    shown, made_in = names.forward.abstract(here_before), example.abstract(there_before)
    assert "obj1 (sliced, on table)" not in applied(shown, adapted_change(shown, change, names, learnt)).visible
    adapted = adapted_change(shown, change, names, learnt, made_in)
    assert names.backward.abstract(applied(shown, adapted)) == here_after
    # A state the example's object gained is added to the query's own, in the order the training
    # states write descriptors in (learnt, and saved with the rest): cut before cooked.
    learnt = Affordances.learn([*TRAINING, AbstractState("kitchen", ("stove",), ("carrot (sliced, fried)",), ())], KEPT)
    learnt.save(tmp_path / "affordances.json")
    learnt = Affordances.load(tmp_path / "affordances.json")
    sliced = "inventory: -obj1; +obj1 (sliced)"
    plain, fried = AbstractState("kitchen", (), ("obj1",), ()), AbstractState("kitchen", (), ("obj1 (fried)",), ())
    assert with_own_states(sliced, plain, fried, learnt) == "inventory: -obj1; +obj1 (sliced, fried)"
    assert with_own_states("inventory: -obj1; +obj1 (sliced, fried)", fried, plain, learnt) == (
        "inventory: -obj1; +obj1 (sliced)"  # what the example's object had before stays its own
    )


def test_a_door_is_no_container_whatever_the_carried_food_and_older_files_are_refused(tmp_path):
    def room(food: str, door: bool) -> AbstractState:
        furniture = ["cupboard (open)", "fridge (open)"] + (["plain door (open)"] if door else [])
        inside = [f"insert {item_name(food)} into {name}" for name in ("cupboard", "fridge")]
        return AbstractState("kitchen", tuple(furniture), (food,), tuple(sorted(inside)))

    # Cut and cooked food was only ever carried where there was no door; the door only beside plain food.
    training = [room(f"{food} (chopped, roasted)", door=False) for food in ("apple", "carrot", "potato")]
    training += [room(food, door=True) for food in ("apple", "carrot", "potato")]
    learnt = Affordances.learn(training, frozenset({"cupboard", "fridge", "plain door"}))
    before, here = room("pear", door=True), room("pear (chopped, roasted)", door=True)
    blank = AbstractState(here.location, here.visible, here.inventory, ())
    assert learnt.predict(blank, before) == {"insert pear into cupboard", "insert pear into fridge"}
    # Saved and loaded, the votes keep their levels; a file saved before the levels were is refused.
    learnt.save(tmp_path / "affordances.json")
    assert Affordances.load(tmp_path / "affordances.json").votes == learnt.votes
    saved = json.loads((tmp_path / "affordances.json").read_text())
    del saved["levels"]
    (tmp_path / "older.json").write_text(json.dumps(saved))
    with pytest.raises(DreamgymError, match="saved before 2026-11-29, without its levels: train the experience"):
        Affordances.load(tmp_path / "older.json")


def test_furniture_the_data_never_described_keeps_the_uses_it_had_a_step_before():
    # Training: a kitchen whose stove cooks and, like the table and the counter, holds things.
    def stove_kitchen(food: str, cooked: bool) -> AbstractState:
        item = f"{food} (fried)" if cooked else food
        supporters = ("counter", "stove", "table")
        actions = (f"cook {food} with stove", f"eat {food}", *(f"put {food} on {s}" for s in supporters))
        return AbstractState("kitchen", supporters, (item,), actions)

    def lying(food: str, on: str) -> AbstractState:
        return AbstractState(
            "kitchen", ("counter", "stove", "table", f"{food} (on {on})"), (), (f"take {food} from {on}",)
        )

    learnt = Affordances.learn(
        [stove_kitchen(food, cooked) for food in ("apple", "carrot") for cooked in (False, True)]
        + [lying(food, on) for food in ("apple", "carrot") for on in ("counter", "stove", "table")],
        KEPT | {"stove"},
    )
    # A grill no training state shows: the step before offered cooking with it, and nothing put on it.
    before = AbstractState("backyard", ("grill",), ("pear",), ("cook pear with grill", "eat pear"))
    grilled = AbstractState("backyard", ("grill",), ("pear (grilled)",), ())
    predicted = learnt.predict(grilled, before)
    # Furniture in general holds things and does not cook: the grill keeps its own uses instead.
    assert "cook pear with grill" in predicted and "put pear on grill" not in predicted
    # Where nothing like it was there a step before (nothing lay on the grill), the votes decide.
    on_it = AbstractState("backyard", ("grill", "pear (grilled, on grill)"), (), ())
    assert "take pear from grill" in learnt.predict(on_it, grilled)


def meal_world(recipe: tuple[str, ...], carried: tuple[str, ...], place: str) -> AbstractState:
    """tw-cooking's rule for `prepare meal`: offered in the kitchen while the recipe's first
    ingredient is carried, whatever else is."""
    actions = ["go east", "look"] + [f"drop {food}" for food in carried]
    if place == "kitchen" and recipe[0] in carried:
        actions.append("prepare meal")
    return AbstractState(place, ("table",), carried, tuple(sorted(actions)))


def test_an_action_that_follows_the_task_is_learnt_from_it_and_offered_where_it_says(tmp_path):
    foods = ("apple", "carrot", "potato", "leek", "onion", "pepper")
    recipes = [(first, second) for first in foods for second in foods if first != second]
    rows = []
    for recipe in recipes:
        instruction = f"Recipe: ingredients: {', '.join(recipe)}. directions: prepare meal."
        for place in ("kitchen", "garden"):
            for carried in ((), recipe[:1], recipe[1:], recipe):
                state = format_state(meal_world(recipe, carried, place))
                rows.append({"instruction": instruction, "state": state, "next_state": state, "action": "look"})
    cooking = named_domain("textworld-cooking")
    # The first ingredient, not either, not the second; in the kitchen only. `go east` follows nothing.
    assert learnt_task_actions(rows, cooking) == {"prepare meal": (0, ("kitchen",))}
    assert learnt_task_actions(rows, NO_RULES) == {}  # no task objects: nothing to learn
    assert learnt_task_actions(rows[:8], cooking) == {}  # too few states to tell
    # One state against the rule (the meal offered with the second ingredient alone), and it is none.
    odd = meal_world(recipes[0], recipes[0][1:], "kitchen")
    odd = format_state(AbstractState(odd.location, odd.visible, odd.inventory, (*odd.actions, "prepare meal")))
    assert learnt_task_actions([*rows, rows[0] | {"state": odd}], cooking) == {}

    learnt = learnt_from_rows(rows, None, cooking)
    assert learnt.task_actions == {"prepare meal": (0, ("kitchen",))}
    # A query of a three-ingredient recipe of foods the data never showed, whose example (taking its
    # own first ingredient) offered the meal: taking the query's second ingredient does not.
    task = ("kale", "fig", "lime")
    before = meal_world(task, ("fig",), "kitchen")
    taken = AbstractState("kitchen", ("table",), ("fig", "lime"), ())
    example_line = "actions: +drop lime; +prepare meal"
    assert "prepare meal" not in with_learnt_actions(before, taken, example_line, learnt, task).actions
    taken_first = AbstractState("kitchen", ("table",), ("fig", "kale"), ())
    assert "prepare meal" in with_learnt_actions(before, taken_first, "actions: +drop kale", learnt, task).actions
    elsewhere = AbstractState("garden", ("table",), ("fig", "kale"), ())
    assert "prepare meal" not in with_learnt_actions(before, elsewhere, example_line, learnt, task).actions
    # Without the task's objects the example's line decides, as before.
    assert "prepare meal" in with_learnt_actions(before, taken, example_line, learnt).actions
    # In the prompt's names: the task's objects are placeholders, led back to the real ones.
    names = Placeholders({"kale": "obj1", "fig": "obj2", "lime": "obj3"})
    shown = names.forward.abstract(before)
    change = "inventory: +obj3\nactions: +drop obj3; +prepare meal"
    adapted = applied(shown, adapted_change(shown, change, names, learnt, task_objects=("obj1", "obj2", "obj3")))
    assert "prepare meal" not in adapted.actions and "drop obj3" in adapted.actions
    # Saved and loaded, the rule holds; a file saved before it was learnt loads with none.
    path = tmp_path / "affordances.json"
    learnt.save(path)
    assert Affordances.load(path).task_actions == learnt.task_actions
    data = json.loads(path.read_text())
    del data["task_actions"]
    path.write_text(json.dumps(data))
    assert Affordances.load(path).task_actions == {}
