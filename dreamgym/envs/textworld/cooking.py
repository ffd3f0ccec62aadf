"""TextWorld cooking's rules for the experience model's retrieval (the `Domain` of
dreamgym/domain.py); why each, in CHANGELOG.md (measured: results log, 2026-11-23 to 2026-11-30).

- How an action stands to its task: whether the recipe names the item acted on, and which of the
  action's other words its clauses on that item use (`slice` where the recipe says to slice it).
  Taking an ingredient scores, taking anything else does not; slicing what the recipe says to chop
  loses the game.
- The kind of an item is the last word of its real name (`potato` for a purple potato): whether a
  food is edible raw goes with its kind, which a placeholder hides.
- Containers and doors are open or closed: `+insert knife into fridge` among the available actions
  comes with taking the knife only where the fridge is open.
- The objects a task asks for are its recipe's ingredients (`Recipe: ingredients: a, b.`, as
  `envs/textworld/env.compact_recipe` writes the task).
- A direction of the recipe asks for one action on its ingredient, and the verbs of one family can
  stand in each other's place: `slice`, `chop`, `dice` (with the knife); `fry`, `roast`, `grill`
  (cook with the stove, the oven, the BBQ). So the step that slices the carrot because the recipe
  says `slice the carrot` would dice it under `dice the carrot`: BC's counterfactual tasks.
- The same start poses another task that can be won where a direction's verb changes to one whose
  tool the recipe already needs (any cutting verb with the knife; roast only if the recipe roasts
  something, since the oven, unlike the knife, may not be in the game), or two ingredients of a
  family swap their verbs (`dice the carrot; slice the pepper`): the curriculum's variations.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dreamgym.state import AbstractState, acted_object, item_name, task_mentions, whole_word

_OPEN_OR_CLOSED = re.compile(r"\((open|closed)\b")
_INGREDIENTS = re.compile(r"\bingredients: (.*?)\. directions:")
# tw-cooking's directions: verb -> the action it asks for on its ingredient, by family.
_DIRECTION_FAMILIES = (
    {"slice": "slice {} with knife", "chop": "chop {} with knife", "dice": "dice {} with knife"},
    {"fry": "cook {} with stove", "roast": "cook {} with oven", "grill": "cook {} with BBQ"},
)


def direction_of(action: str) -> tuple[str, str, dict[str, str]] | None:
    """(verb, item, family) of the direction `action` would carry out: `dice carrot with knife` is
    `dice the carrot`; None for an action that prepares nothing."""
    for family in _DIRECTION_FAMILIES:
        for verb, template in family.items():
            before, after = template.split("{}")
            if action.startswith(before) and action.endswith(after) and len(action) > len(before) + len(after):
                return verb, action[len(before) : len(action) - len(after)], family
    return None


def _unasked(instruction: str, action: str) -> list[tuple[str, str]]:
    """(verb, action) of each other direction of the family `action` belongs to that `instruction`
    does not ask for on the same item: `chop …` and `dice …` for `slice carrot with knife` under a
    recipe that only slices the carrot."""
    carried = direction_of(action)
    if carried is None:
        return []
    verb, item, family = carried
    return [
        (other, template.format(item))
        for other, template in family.items()
        if other != verb and not _says(instruction, other, item)
    ]


def _says(text: str, verb: str, item: str) -> re.Match | None:
    """Where `text` gives the direction `verb the item` (`dice the carrot`), as a whole phrase."""
    return whole_word(f"{verb} the {item}").search(text)


def _rewrite(instruction: str, changes: dict[str, str]) -> str:
    """`instruction` with each phrase of `changes` ("verb the item") replaced, all at once."""
    pattern = re.compile("|".join(whole_word(old).pattern for old in changes))
    return pattern.sub(lambda found: changes[found[0]], instruction)


def _tool(template: str) -> str:
    """What a direction's action does its work with: ` with knife` of `slice {} with knife`."""
    return template.split("{}")[1]


@dataclass(frozen=True)
class TextWorldCooking:
    """The recipe, food kinds, and open or closed things of tw-cooking games."""

    def task_relation(
        self, instruction: str | None, state: AbstractState, action: str
    ) -> tuple[bool, frozenset[str]] | None:
        """Whether the recipe asks for the item acted on, and which of the action's other words the
        task's clauses on that item use, with the verb of the direction the action carries out where
        the task asks for it (`cook carrot with stove` under `fry the carrot`: fry; under `roast the
        carrot`, nothing: the game is lost). None for an action on no item, or no task known. The
        objective names the cookbook too ("check the cookbook"), but taking it scores nothing: a
        dream that ranked it with the ingredients paid a point for it to GRPO, which learnt to."""
        name = acted_object(state, action) if instruction else None
        if name is None:
            return None
        said = "; ".join(task_mentions(instruction, name))
        others = set(action.split()) - set(name.split())
        words = {word for word in others if whole_word(word).search(said)}
        carried = direction_of(action)
        if carried is not None and _says(said, carried[0], carried[1]):
            words.add(carried[0])
        return name in self.task_objects(instruction), frozenset(words)

    def kinds(self, state: AbstractState, action: str) -> frozenset[str]:
        """The last words of the real names of the visible or carried items `action` names:
        `potato` for a purple potato, `pepper` for an orange bell pepper."""
        return frozenset(
            item_name(item).split()[-1]
            for item in state.visible + state.inventory
            if whole_word(item_name(item)).search(action)
        )

    def statuses(self, state: AbstractState, change: str) -> Mapping[str, str]:
        """Whether each visible thing that `change`'s available actions name is open or closed."""
        actions = " ".join(line for line in change.split("\n") if line.startswith("actions"))
        return {
            item_name(item): found[1]
            for item in state.visible
            if (found := _OPEN_OR_CLOSED.search(item)) and whole_word(item_name(item)).search(actions)
        }

    def task_objects(self, instruction: str) -> tuple[str, ...]:
        """The recipe's ingredients, in its order: `Recipe: ingredients: a, b. directions: ...`.
        Only names an object can have: a task the experience model wrote (the curriculum's
        variations) may run a direction into the list (`ingredients: yellow pork; roast the carrot`),
        and no object is called that (a state's items cannot hold `;`: dreamgym/state.py)."""
        found = _INGREDIENTS.search(instruction)
        if found is None:
            return ()
        names = (part.strip() for part in found[1].split(","))
        return tuple(name for name in names if name and ";" not in name and "\n" not in name)

    def task_variants(self, instruction: str, action: str) -> tuple[tuple[str, str], ...]:
        """For an action that carries out a direction of the recipe (`dice carrot with knife` under
        `dice the carrot`), the recipe with that direction's verb replaced by each other verb of its
        family that the recipe does not already use on the item, and the action that one asks for;
        then the recipe with another ingredient's direction of that family changed the same way,
        which asks for the same action (what the recipe says of the pepper does not change how the
        carrot is cut)."""
        carried = direction_of(action)
        direction = carried and _says(instruction, carried[0], carried[1])
        if not direction:
            return ()
        _, item, family = carried
        head, tail = instruction[: direction.start()], instruction[direction.end() :]
        changed = tuple(
            (f"{head}{other} the {item}{tail}", other_action) for other, other_action in _unasked(instruction, action)
        )
        elsewhere = tuple(
            (_rewrite(instruction, {f"{verb} the {thing}": f"{other} the {thing}"}), action)
            for verb, thing, its_family in self.directions(instruction)
            if its_family is family and thing != item
            for other, _ in _unasked(instruction, family[verb].format(thing))
        )
        return changed + elsewhere

    def mistakes(self, instruction: str, action: str) -> tuple[str, ...]:
        """For an action that prepares an item (`dice carrot with knife`), the others of its family
        that the recipe does not ask for on that item (`slice …`, `chop …`): each loses the game."""
        return tuple(other_action for _, other_action in _unasked(instruction, action))

    def directions(self, instruction: str) -> list[tuple[str, str, dict[str, str]]]:
        """(verb, ingredient, its family) of each direction of the recipe on an ingredient."""
        return [
            (verb, item, family)
            for item in self.task_objects(instruction)
            for family in _DIRECTION_FAMILIES
            for verb in family
            if _says(instruction, verb, item)
        ]

    def instruction_variants(self, instruction: str) -> tuple[str, ...]:
        """The recipe with one direction's verb changed to another of its family whose tool the
        recipe already needs, and with two ingredients' verbs of one family swapped; each once,
        in the recipe's order."""
        directions = self.directions(instruction)
        tools = {_tool(family[verb]) for verb, _, family in directions}
        asked = {(verb, item) for verb, item, _ in directions}

        variants: list[str] = []
        for verb, item, family in directions:
            for other, template in family.items():
                if other != verb and _tool(template) in tools and (other, item) not in asked:
                    variants.append(_rewrite(instruction, {f"{verb} the {item}": f"{other} the {item}"}))
        for (verb, item, family), (other, other_item, other_family) in itertools.combinations(directions, 2):
            swappable = family is other_family and verb != other and item != other_item
            if swappable and (other, item) not in asked and (verb, other_item) not in asked:
                swapped = {
                    f"{verb} the {item}": f"{other} the {item}",
                    f"{other} the {other_item}": f"{verb} the {other_item}",
                }
                variants.append(_rewrite(instruction, swapped))
        return tuple(dict.fromkeys(variant for variant in variants if variant != instruction))
