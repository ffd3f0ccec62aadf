"""ScienceWorld's texts reduced to the abstract state of `dreamgym.state`, and its actions.

ScienceWorld describes a room in prose, one thing per line (`look`), and the inventory the same
way; it offers every action its grammar can form over the things in reach, 115 at the start and
over 1,000 in a furnished kitchen (`get_valid_action_object_combinations`). The abstract state keeps:

- location: the room's name (`This room is called the kitchen.`);
- visible: one item per line of the room's description, its name first and what the line says of
  it after, as descriptors (`glass jar (containing sodium chloride)`, `door to kitchen (open)`);
  the agent and the air, which are in every room, are left out;
- inventory: the same for what the agent carries;
- actions: the valid actions whose verb a task set uses (`verbs`: a find task needs no `pour`),
  without the ones that act on the agent, the air, the inventory or a door (doors stand open in
  the "easy" simplification), and with `move X to Y` only for an X the agent carries and a Y
  that holds things and that the task names (`the red box`): a kitchen offers ~70 actions rather
  than ~1,000, and taking a thing adds one action, not one for every other thing in the room
  (which the experience model would have to write out).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from dreamgym.state import AbstractState

# The verbs (an action's words before its first object) the find and lifespan tasks are solved with.
FIND_VERBS = ("focus on", "go to", "look around", "move", "pick up")
# Every verb ScienceWorld's grammar has, longest first so that `look around` wins over `look`.
ALL_VERBS = tuple(
    sorted(
        (
            "activate",
            "close",
            "connect",
            "deactivate",
            "disconnect",
            "dunk",
            "eat",
            "flush",
            "focus on",
            "go to",
            "inventory",
            "look around",
            "look at",
            "look in",
            "mix",
            "move",
            "open",
            "pick up",
            "pour",
            "put down",
            "read",
            "reset task",
            "task",
            "teleport to",
            "use",
            "wait",
            "wait1",
        ),
        key=len,
        reverse=True,
    )
)
PRESENT_EVERYWHERE = frozenset({"agent", "air", "inventory"})
_ROOM = re.compile(r"called the (.+?)\.")
_ARTICLE = re.compile(r"\b(?:a substance called|an|a|the) ", re.IGNORECASE)


def verb_of(action: str) -> str:
    """The words of `action` before its first object: 'pick up red box' -> 'pick up'."""
    for verb in ALL_VERBS:
        if action == verb or action.startswith(verb + " "):
            return verb
    return action.split(" ", 1)[0]


def room_of(look: str) -> str:
    """The room a `look` describes."""
    match = _ROOM.search(look)
    if match is None:
        raise ValueError(f"ScienceWorld's look names no room: {look[:80]!r}")
    return match.group(1).strip()


def item_from_line(line: str) -> str | None:
    """One described thing as a state item, or None for the agent and the air.

    'a counter. On the counter is: a bowl (containing a red apple), a drawer.' ->
    'counter (on it: bowl [containing red apple], drawer)'."""
    text = _ARTICLE.sub("", " ".join(line.split())).strip().rstrip(".").strip()
    if text.lower().startswith("door to ") or " door to " in text.lower():
        text = text.replace("(that is ", "(")
    name, rest = _split_name(text)
    if not name or name in PRESENT_EVERYWHERE:
        return None
    rest = re.sub(
        rf"\b(?:on|in) {re.escape(name)} is:", lambda m: m.group(0).split()[0].lower() + " it:", rest, flags=re.I
    )
    rest = rest.replace("(", "[").replace(")", "]").replace(";", ",").replace("+", " and ")
    rest = " ".join(rest.split()).strip(" .,")
    rest = rest.replace(". ", ", ")
    return f"{name} ({rest})" if rest else name


def _split_name(text: str) -> tuple[str, str]:
    """A line's thing and what follows it: the name ends at '(', '.', or ', which'/', currently'."""
    cut = len(text)
    for mark in (" (", ". ", ", which ", ", currently "):
        at = text.find(mark)
        if at != -1:
            cut = min(cut, at)
    name = text[:cut].strip()
    rest = text[cut:].strip()
    if rest.startswith("(") and rest.endswith(")") and rest.count("(") == 1:
        rest = rest[1:-1]
    return name.replace("+", " and ").strip("-").strip(), rest.lstrip(".,").strip()


def described_items(text: str) -> list[str]:
    """The items of a `look` or `inventory` text: its tab-indented lines."""
    items = []
    for line in text.split("\n"):
        if line.startswith("\t") and line.strip() and line.strip() != "nothing":
            item = item_from_line(line)
            if item is not None:
                items.append(item)
    return items


def kept_actions(
    valid: Iterable[str], location: str, visible: Sequence[str], carried: Sequence[str], verbs: Sequence[str], task: str
) -> list[str]:
    """The valid actions the state offers: see the module docstring."""
    valid = list(valid)
    rooms = {location} | {action[len("go to ") :] for action in valid if verb_of(action) == "go to"}
    containers = {
        name for name in (item.split(" (", 1)[0] for item in visible if "(containing " in item) if name in task
    }
    kept = []
    for action in valid:
        verb = verb_of(action)
        if verb not in verbs:
            continue
        target = action[len(verb) :].strip()
        if verb == "move":
            thing, place = [*objects_of(action), "", ""][:2]
            if place in PRESENT_EVERYWHERE or place in rooms:
                continue
            if place not in containers or not any(_names(thing, name) for name in carried):
                continue
        elif target in PRESENT_EVERYWHERE or "door" in target.split():
            continue
        kept.append(as_offered(action))
    return sorted(set(kept))


def as_offered(action: str) -> str:
    """An action as the state writes it: a name's parentheses ('book (frankenstein)') become
    brackets, as a state item holds none; `as_played` turns them back."""
    return action.replace("(", "[").replace(")", "]")


def as_played(action: str) -> str:
    return action.replace("[", "(").replace("]", ")")


def _names(reference: str, carried: str) -> bool:
    """Whether an action's `reference` ('egg parrot', 'orange in inventory', 'steel table') names the
    carried item `carried` ('parrot egg', 'table'): ScienceWorld's names of one thing share their
    words, in any order, one name's words all in the other's (then with the same last word). A
    thing it calls by its kind alone ('object', 'cloth sittable') is missed: ids, not words, would
    tell (3-5% of find-non-living-thing episodes; measured: results log, 2026-12-05)."""
    if reference.endswith(" in inventory"):  # ScienceWorld's own word for it
        return True
    words, name = reference.split(), carried.split(" (", 1)[0].split()
    if not words:
        return False
    # 'steel table' is the carried 'table' (the same head noun); 'cup containing orange juice' is
    # not the carried 'orange'
    return set(words) <= set(name) or (set(name) <= set(words) and words[-1] == name[-1])


def abstract_state(look: str, inventory: str, valid: Iterable[str], verbs: Sequence[str], task: str) -> AbstractState:
    """The abstract state of one ScienceWorld moment (see the module docstring)."""
    location, visible, carried = (
        room_of(look),
        sorted(set(described_items(look))),
        sorted(set(described_items(inventory))),
    )
    return AbstractState(
        location=location,
        visible=tuple(visible),
        inventory=tuple(carried),
        actions=tuple(kept_actions(valid, location, visible, carried, verbs, task)),
    )


def resolved_action(
    gold: str,
    templates: Sequence[tuple[str, Sequence[int]]],
    referents: Mapping[int, Sequence[str]],
    parents: Callable[[], Mapping[int, int]],
) -> str | None:
    """The valid action that acts on the very things the gold action `gold` names, by ScienceWorld's
    own names for each thing (`referents`: id -> its names, 'living thing', 'frog egg', ...).

    `templates` are the valid actions with the ids of their things; `parents()` (id -> the id of
    what holds it; asked only where a name alone is ambiguous) settles 'living thing in flower pot
    6'. None where no valid action has the gold action's verb and things (a door that stands open)."""
    verb = verb_of(gold)
    wanted = [_things_named(phrase, referents, parents) for phrase in objects_of(gold)]
    for action, ids in templates:
        if verb_of(action) == verb and len(ids) == len(wanted) and all(i in w for i, w in zip(ids, wanted)):
            return action
    return None


def _things_named(
    phrase: str, referents: Mapping[int, Sequence[str]], parents: Callable[[], Mapping[int, int]]
) -> set[int]:
    """The ids of the things `phrase` names: 'blue jay egg', or 'blue jay egg in inventory' (a name
    and where the thing is, which settles which of several things of that name is meant)."""

    def named(name: str) -> set[int]:
        return {thing for thing, names in referents.items() if name in names}

    found = named(phrase)
    if found:
        return found
    words = phrase.split(" in ")
    for cut in range(len(words) - 1, 0, -1):  # the longest name first
        name, place = " in ".join(words[:cut]), " in ".join(words[cut:])
        things = named(name)
        if len(things) > 1 and place != "inventory":
            holders, held_by = named(place), parents()
            things = {thing for thing in things if held_by.get(thing) in holders} or things
        if things:
            return things
    return set()


def parent_ids(tree: Mapping) -> dict[int, int]:
    """Id -> the id of what holds it, from ScienceWorld's object tree (`getObjectTree`)."""
    held_by, todo = {}, [tree]
    while todo:
        node = todo.pop()
        for child in (node.get("contents") or {}).values():
            held_by[int(child["uuid"])] = int(node["uuid"])
            todo.append(child)
    return held_by


# The words that join an action's two objects, by verb.
_JOINERS = {"move": " to ", "connect": " to ", "use": " on ", "pour": " in", "dunk": " in "}


def objects_of(action: str) -> list[str]:
    """The things `action` names, in order: 'move orange to red box' -> ['orange', 'red box']."""
    verb = verb_of(action)
    target = action[len(verb) :].strip()
    joiner = _JOINERS.get(verb)
    if joiner is None or joiner not in target:
        return [target] if target else []
    first, _, second = target.rpartition(joiner)
    return [first.strip(), second.removeprefix("to ").strip()]  # pour's 'into' and 'in' alike
