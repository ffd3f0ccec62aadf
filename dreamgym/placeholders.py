"""Placeholder names for game-specific objects, so that the experience model and the policy never
have to copy one.

A small model trained on a few dozen games learns their ingredients' names by heart. On a held-out
game (new foods) it answers "take tomato from counter" with `inventory: +yellow potato`, a name it
saw in training: most of its wrong next states were wrong that way. What happens to a carried
object does not depend on its name, so the model is shown none: in each prompt, every
game-specific carried object is called `obj1`, `obj2`, ... (the action's objects first, then the
carried ones, then the visible ones), and the names are put back into what the model predicts.

Which names are game-specific is learnt from the training data (`kept_names`): a name keeps its
text if it is never carried nor takeable (rooms, furniture, doors: a fridge is not a stove)
or if it is in most training tasks (knife, cookbook, meal: each has its own role). Every other
object that a state shows carried or takeable is replaced, ones the training data never showed
included, so a held-out game's new foods become the same few placeholders the model was trained
on; an object that cannot be taken keeps its name even when new (a piece of furniture).

Each worked example in a prompt is numbered on its own, as a query would be: its action's object
is `obj1` too, so the example reads as the same move on another object.

A placeholder the model writes that stands for no name of the prompt is an object it imagines:
what a container it opens or a room it enters holds. Nothing in the prompt says what that is, and
left as written (`obj3 (in fridge)`) it is a thing no task asks for: in DreamEnv the policy never
finds the recipe's ingredients, and a dreamt episode the game would call won is lost (replaying
BC's won games, the dream lost most of them where it held `obj3` in place of the ingredient;
measured: results log, 2026-11-25). So such placeholders take, lowest number first, the
names of the objects the task asks for that the episode has not shown yet (`imagined`); any
more are left as written.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from dreamgym.renaming import Renamer
from dreamgym.state import AbstractState, item_name, parse_state

PLACEHOLDER = "obj{}"
_PLACEHOLDER = re.compile(r"obj([0-9]+)")
# A carried object in at least this share of the training tasks keeps its name: every game has it.
COMMON_TASK_SHARE = 0.75


def shown_names(state: AbstractState) -> list[str]:
    """The names of the objects a state shows: carried ones first (what most actions change),
    then visible ones, each in the state's order."""
    return [item_name(item) for item in state.inventory + state.visible]


def carried_names(state: AbstractState) -> set[str]:
    """Objects the state shows carried or that can be taken."""
    names = {item_name(item) for item in state.inventory}
    return names | {
        name
        for name in shown_names(state)
        for action in state.actions
        if action == f"take {name}" or action.startswith(f"take {name} from ")
    }


def kept_names(rows: Iterable[Mapping]) -> frozenset[str]:
    """The object names that keep their text (see the module docstring), from transition rows."""
    tasks: dict[str, set[str]] = defaultdict(set)
    carried: set[str] = set()
    task_ids: set[str] = set()
    for row in rows:
        task_ids.add(row["task_id"])
        for column in ("state", "next_state"):
            state = parse_state(row[column])
            for name in shown_names(state):
                tasks[name].add(row["task_id"])
            carried |= carried_names(state)
    return frozenset(
        name for name, seen in tasks.items() if name not in carried or len(seen) >= COMMON_TASK_SHARE * len(task_ids)
    )


class Placeholders:
    """The placeholders of one prompt (or worked example): names to `obj<n>` and back."""

    def __init__(self, mapping: Mapping[str, str], imagined: Sequence[str] = ()):
        self.mapping = dict(mapping)
        self.imagined = tuple(imagined)  # names for objects the model imagines (module docstring)
        self.forward = Renamer(self.mapping)
        self.backward = Renamer({placeholder: name for name, placeholder in self.mapping.items()})

    def restorer(self, predicted: AbstractState) -> Renamer:
        """Placeholders back to real names in what the model predicted: the prompt's own, and
        those `predicted` shows for no name of the prompt, lowest number first, to `imagined`."""
        unknown = {
            name
            for name in shown_names(predicted)
            if _PLACEHOLDER.fullmatch(name) and name not in self.backward.mapping
        }
        if not unknown or not self.imagined:
            return self.backward
        ordered = sorted(unknown, key=lambda name: int(_PLACEHOLDER.fullmatch(name)[1]))
        return Renamer({**self.backward.mapping, **dict(zip(ordered, self.imagined))})

    @classmethod
    def of(
        cls, kept: frozenset[str], action: str, states: Sequence[AbstractState], imagined: Sequence[str] = ()
    ) -> Placeholders:
        """Placeholders for the carried or takeable objects of `states` not in `kept`: the ones
        `action` names first, in its order, then the others in the order of `shown_names`,
        state by state; `imagined` as in `restorer`."""
        names: list[str] = []
        for state in states:
            carried = carried_names(state)
            names += [name for name in shown_names(state) if name in carried and name not in kept]
        in_action = Renamer({name: name for name in names}).occurrences(action)
        ordered = dict.fromkeys([*in_action, *names])
        return cls({name: PLACEHOLDER.format(number) for number, name in enumerate(ordered, 1)}, imagined)

    @classmethod
    def of_row(cls, kept: frozenset[str], row: Mapping) -> Placeholders:
        """The placeholders of a transition row (or a retrieved one): its action and both states."""
        return cls.of(kept, row["action"], [parse_state(row["state"]), parse_state(row["next_state"])])

    @classmethod
    def own(cls, kept: frozenset[str], row: Mapping) -> dict:
        """A retrieved row in its own placeholders, as a worked example shows it."""
        return cls.of_row(kept, row).row(row)

    def row(self, row: Mapping) -> dict:
        return self.forward.row(row)
