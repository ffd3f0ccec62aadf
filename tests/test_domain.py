"""The domain seam: a second, toy environment's rules drive the generic ranking and format code,
and the configured model uses TextWorld cooking's."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace

import pytest

from dreamgym.domain import NO_RULES, Domain, named_domain
from dreamgym.envs.textworld.cooking import TextWorldCooking
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.format import apply_delta, fits, state_delta
from dreamgym.experience.generate import ExperienceModel
from dreamgym.experience.rerank import closest, situation
from dreamgym.state import AbstractState, item_name

_LIT = re.compile(r"\((lit|unlit)\)")


@dataclass(frozen=True)
class Lamps:
    """A toy environment of lamps and bulbs: a bulb comes out only of an unlit lamp."""

    def task_relation(self, instruction: str | None, state: AbstractState, action: str) -> Hashable | None:
        return None if instruction is None else "bulb" in action and "bulb" in instruction

    def kinds(self, state: AbstractState, action: str) -> frozenset[str]:
        return frozenset(item_name(item).split()[0] for item in state.visible if item_name(item) in action)

    def statuses(self, state: AbstractState, change: str) -> Mapping[str, str]:
        named = " ".join(line for line in change.split("\n") if line.startswith("actions"))
        return {
            item_name(item): found[1]
            for item in state.visible
            if (found := _LIT.search(item)) and item_name(item) in named
        }

    def task_objects(self, instruction: str) -> tuple[str, ...]:
        return ("bulb",) if "bulb" in instruction else ()

    def task_variants(self, instruction: str, action: str) -> tuple[tuple[str, str], ...]:
        return ()

    def instruction_variants(self, instruction: str) -> tuple[str, ...]:
        return ()

    def mistakes(self, instruction: str, action: str) -> tuple[str, ...]:
        return ()


def hall(*visible: str, carried: tuple[str, ...] = ()) -> AbstractState:
    actions = ("put bulb in lamp", "switch lamp") if carried else ("switch lamp", "take bulb from shelf")
    return AbstractState("hall", visible, carried, actions)


def test_a_toy_domains_rules_decide_the_ranking_the_generic_code_does():
    action, task = "take bulb from shelf", "Put a bulb in the lamp."
    query_state = hall("lamp (unlit)", "shelf")
    # Two past steps of the same move: by a lit lamp (listed first, and sharing more items with the
    # query) and by an unlit one. Their change is the same, and names the lamp in the actions it adds.
    lit, unlit = hall("lamp (lit)", "shelf"), hall("chair", "lamp (unlit)", "rug", "shelf", "table")
    changes = [state_delta(state, hall(*state.visible, carried=("bulb",))) for state in (lit, unlit)]
    assert changes[0] == changes[1] and fits(query_state, changes[0])  # only the domain tells them apart

    def ranked(domain: Domain) -> list[int]:
        query = situation(query_state, action, None, task, domain)
        candidates = [situation(state, action, None, task, domain) for state in (lit, unlit)]
        return closest(query, candidates, 2, changes)

    assert ranked(NO_RULES) == [0, 1]  # the generic keys: the share of items in common
    assert ranked(Lamps()) == [1, 0]  # the toy rule: a lamp unlit like the query's
    # The generic format carries the chosen change to the query's state.
    assert apply_delta(query_state, changes[1]) == hall("lamp (unlit)", "shelf", carried=("bulb",))


def test_the_configured_domain_is_textworld_cooking_and_a_bad_name_is_refused():
    assert named_domain(ExperienceConfig().domain) == TextWorldCooking()
    plain = ExperienceConfig(neighbours=0, placeholders=False)
    assert ExperienceModel(None, None, plain).domain == TextWorldCooking()
    assert ExperienceModel(None, None, replace(plain, domain="none")).domain is NO_RULES
    with pytest.raises(ValueError, match="names no domain: use 'textworld-cooking' or 'none'"):
        named_domain("lamps")


def test_a_task_asks_for_its_recipes_ingredients():
    cooking = TextWorldCooking()
    task = (
        "You are hungry! Let's cook a delicious meal. Recipe: ingredients: red hot pepper, block of cheese. "
        "directions: slice the red hot pepper; fry the block of cheese; prepare meal."
    )
    assert cooking.task_objects(task) == ("red hot pepper", "block of cheese")
    assert cooking.task_objects("Recipe: ingredients: milk. directions: prepare meal.") == ("milk",)
    assert cooking.task_objects("go to the kitchen") == () and NO_RULES.task_objects(task) == ()
    # a model-written task that runs a direction into the list names no object with it
    written = "Recipe: ingredients: yellow pork; roast the carrot, carrot. directions: roast the carrot; prepare meal."
    assert cooking.task_objects(written) == ("carrot",)


def test_a_step_that_carries_out_a_direction_has_a_task_for_each_other_verb_of_its_family_and_of_the_others():
    cooking = TextWorldCooking()
    task = (
        "Recipe: ingredients: red hot pepper, block of cheese. directions: slice the red hot pepper; "
        "dice the block of cheese; fry the red hot pepper; prepare meal."
    )
    slicing = cooking.task_variants(task, "slice red hot pepper with knife")
    cut = dict((action, changed) for changed, action in slicing[:2])
    assert set(cut) == {"chop red hot pepper with knife", "dice red hot pepper with knife"}
    assert cut["dice red hot pepper with knife"] == task.replace("slice the red hot pepper", "dice the red hot pepper")
    # then the other ingredient's cutting verb changed: the same step, the same action
    assert slicing[2:] == (
        (task.replace("dice the block of cheese", "slice the block of cheese"), "slice red hot pepper with knife"),
        (task.replace("dice the block of cheese", "chop the block of cheese"), "slice red hot pepper with knife"),
    )
    cook = dict((action, changed) for changed, action in cooking.task_variants(task, "cook red hot pepper with stove"))
    assert cook == {
        "cook red hot pepper with oven": task.replace("fry the", "roast the"),
        "cook red hot pepper with BBQ": task.replace("fry the", "grill the"),
    }
    # only the item the direction names, and only an action that carries out a direction
    assert cooking.task_variants(task, "chop block of cheese with knife") == ()  # the recipe says dice
    assert cooking.task_variants(task, "cook block of cheese with oven") == ()  # no cooking direction
    assert cooking.task_variants(task, "take red hot pepper") == ()
    assert NO_RULES.task_variants(task, "slice red hot pepper with knife") == ()


def test_the_mistakes_at_a_step_are_the_other_verbs_of_its_family_the_recipe_does_not_ask():
    cooking = TextWorldCooking()
    task = (
        "Recipe: ingredients: red hot pepper, carrot. directions: slice the red hot pepper; "
        "chop the carrot; fry the red hot pepper; roast the carrot; prepare meal."
    )
    assert cooking.mistakes(task, "slice red hot pepper with knife") == (
        "chop red hot pepper with knife",
        "dice red hot pepper with knife",
    )
    assert cooking.mistakes(task, "cook carrot with oven") == ("cook carrot with stove", "cook carrot with BBQ")
    # A verb the recipe asks for on that item is no mistake; a move that prepares nothing has none.
    both = task.replace("fry the red hot pepper", "fry the red hot pepper; dice the red hot pepper")
    assert cooking.mistakes(both, "slice red hot pepper with knife") == ("chop red hot pepper with knife",)
    assert cooking.mistakes(task, "take carrot from counter") == ()
    assert NO_RULES.mistakes(task, "slice red hot pepper with knife") == ()


def test_a_recipe_poses_the_tasks_its_tools_can_still_win_from_the_same_start():
    cooking = TextWorldCooking()
    task = (
        "Recipe: ingredients: red hot pepper, block of cheese. directions: slice the red hot pepper; "
        "dice the block of cheese; fry the red hot pepper; prepare meal."
    )
    variants = cooking.instruction_variants(task)
    assert set(variants) == {
        task.replace("slice the red hot pepper", "chop the red hot pepper"),
        task.replace("slice the red hot pepper", "dice the red hot pepper"),
        task.replace("dice the block of cheese", "slice the block of cheese"),
        task.replace("dice the block of cheese", "chop the block of cheese"),
        # the two cutting verbs swapped between the ingredients
        task.replace("slice the red hot pepper", "dice the red hot pepper").replace(
            "dice the block of cheese", "slice the block of cheese"
        ),
    }
    assert len(variants) == 5  # no roast or grill: the oven and the BBQ may not be in this game
    both_cooked = task.replace("prepare meal", "roast the block of cheese; prepare meal")
    roasted = both_cooked.replace("fry the red hot pepper", "roast the red hot pepper")
    assert roasted in cooking.instruction_variants(both_cooked)  # the recipe needs the oven anyway
    assert cooking.instruction_variants("Recipe: ingredients: red apple. directions: prepare meal.") == ()
    assert NO_RULES.instruction_variants(task) == ()
