"""The abstract textual state: the compact observation every agent and model sees.

An environment's raw output (TextWorld's prose, a web page, ...) is reduced to four fields:

    location: kitchen
    visible: counter; fridge (open); knife (on table); red apple (sliced, in fridge); table
    inventory: cookbook; yellow potato (roasted)
    actions: close fridge; cook yellow potato with stove; drop cookbook; go north

Each field is one line, in this order, items sorted and joined by "; ". An item is a name
optionally followed by descriptors in parentheses (its state, then where it lies). The format is
defined here and nowhere else: `format_state` writes it and `parse_state` reads it back, strictly,
so that a model's prediction of a next state can be checked field by field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FIELDS = ("location", "visible", "inventory", "actions")
ITEM_SEPARATOR = "; "


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
