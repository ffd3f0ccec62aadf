"""The abstract textual state: the compact observation every agent and model sees.

An environment's raw output (TextWorld's prose, a web page, ...) is reduced to four fields:

    location: kitchen
    visible: counter; fridge (open); knife (on table); red apple (sliced, in fridge); table
    inventory: cookbook; yellow potato (roasted)
    actions: close fridge; cook yellow potato with stove; drop cookbook; go north

Each field is one line, in this order, items sorted and joined by "; ". An item is a name
optionally followed by descriptors in parentheses (its state, then where it lies): `ITEM_PATTERN`.
The format is defined here and nowhere else: `format_state` writes it and `parse_state` reads it
back, strictly, so that a model's prediction of a next state can be checked field by field.

Why the item grammar is checked: a state the experience model predicts is what the policy acts on
next, and a malformed item is never what a game shows. Unchecked, `make run`'s dream held many
items such as `examine fridge)`, `obj2 (on counter) to the inventory` or `+examine counter` (a
change mark written into a list), and most dream episodes lost or run out of steps went through
one (measured: results log, 2026-11-28).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

FIELDS = ("location", "visible", "inventory", "actions")
ITEM_SEPARATOR = "; "
# A name (no parentheses; it does not start with `-`, and has no `+`: the marks of a change in a
# delta), then optionally its descriptors in one pair of parentheses, without `+` either. No `;`,
# line break, or `<` / `>` (the tags a model's completion wraps a state in); no surrounding spaces.
# A `+` inside let a decoded change run two entries into one item (`carrot (in fridge +yellow
# potato from fridge)`, `take carrot from fridge +take onion from fridge`), which a policy played.
ITEM_PATTERN = r"[^\s;()<>+-](?:[^;\n()<>+]*[^\s;()<>+])?(?: \([^;\n()<>+]+\))?"
_ITEM = re.compile(ITEM_PATTERN)


class StateParseError(ValueError):
    """A text that does not follow the abstract state format."""


@dataclass(frozen=True)
class AbstractState:
    """Location, what is visible, what is carried and which actions are available.

    Items are kept sorted so that two equal states always have the same text.
    """

    location: str
    visible: tuple[str, ...] = field(default_factory=tuple)
    inventory: tuple[str, ...] = field(default_factory=tuple)
    actions: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("visible", "inventory", "actions"):
            items = tuple(sorted(getattr(self, name)))
            for item in items:
                _check_item(name, item)
            object.__setattr__(self, name, items)
        _check_item("location", self.location)

    def to_text(self) -> str:
        return format_state(self)


def _check_item(field_name: str, item: str) -> None:
    if not item or item != item.strip():
        raise StateParseError(f"{field_name}: empty item or item with surrounding spaces: {item!r}")
    if ";" in item or "\n" in item:
        raise StateParseError(f"{field_name}: item {item!r} contains ';' or a newline")
    if not _ITEM.fullmatch(item):
        raise StateParseError(
            f"{field_name}: item {item!r} is not 'name' or 'name (descriptors)': a name has no parentheses "
            "and does not start with '-', neither holds a '+', and nothing follows the descriptors"
        )


def format_state(state: AbstractState) -> str:
    """The one text form of a state (see the module docstring)."""
    lines = [f"location: {state.location}"]
    for name in ("visible", "inventory", "actions"):
        lines.append(f"{name}: {ITEM_SEPARATOR.join(getattr(state, name))}".rstrip())
    return "\n".join(lines)


def parse_state(text: str) -> AbstractState:
    """Read a state back from its text form; raise `StateParseError` saying what is wrong."""
    if not isinstance(text, str):
        raise StateParseError(f"state must be text, got {type(text).__name__}")
    return _parsed(text)


# A state is immutable, and the same texts are read again and again: a DreamEnv step reads each
# retrieved candidate's state and next state several times (ranking, adapting, the example), and the
# candidates of one step come back at the next (the default data holds ~1,200 distinct states).
# ~4.5 kB a state with its text: within ~20 MB.
@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> AbstractState:
    lines = text.split("\n")
    if len(lines) != len(FIELDS):
        raise StateParseError(f"expected {len(FIELDS)} lines ({', '.join(FIELDS)}), got {len(lines)}")
    values: dict[str, str] = {}
    for expected, line in zip(FIELDS, lines):
        key, sep, value = line.partition(":")
        if not sep or key != expected:
            raise StateParseError(f"expected a line starting with '{expected}:', got {line[:60]!r}")
        if value and not value.startswith(" "):
            raise StateParseError(f"missing space after '{expected}:'")
        values[expected] = value[1:] if value else ""
    if not values["location"]:
        raise StateParseError("location is empty")
    lists = {}
    for name in ("visible", "inventory", "actions"):
        items = tuple(values[name].split(ITEM_SEPARATOR)) if values[name] else ()
        for item in items:
            _check_item(name, item)
        if list(items) != sorted(items):
            raise StateParseError(f"{name} items are not sorted")
        if len(set(items)) != len(items):
            raise StateParseError(f"{name} has repeated items")
        lists[name] = items
    return AbstractState(location=values["location"], **lists)


def item_name(item: str) -> str:
    """The name of an item without its descriptors: 'red apple (sliced, in fridge)' -> 'red apple'."""
    return item.split(" (", 1)[0]


def format_item(name: str, descriptors: list[str] | tuple[str, ...] = ()) -> str:
    """An item with its descriptors, in the one canonical order (as given)."""
    return f"{name} ({', '.join(descriptors)})" if descriptors else name


def acted_object(state: AbstractState, action: str) -> str | None:
    """The item the action acts on: of the items the state shows, the one the action names first
    (the longest of those named at the same place); None for an action on no item."""
    named = []
    for name in {item_name(item) for item in state.visible + state.inventory}:
        found = whole_word(name).search(action)
        if found:
            named.append((found.start(), -len(name), name))
    return min(named)[2] if named else None


def task_mentions(instruction: str, name: str) -> list[str]:
    """The task's clauses that name `name`, each on one line whatever the task's layout (a worked
    example shows them on its `task says:` line)."""
    clauses = [" ".join(clause.split()).rstrip(".!?;") for clause in re.split(r"(?<=[.!?;])\s+", instruction.strip())]
    return [clause for clause in clauses if whole_word(name).search(clause)]


def whole_word(name: str) -> re.Pattern:
    """`name` as a whole: `obj1` is not in `take obj10`, `pepper` not in `red-pepper`."""
    return re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")
