"""Renaming objects in transitions: consistent, whole-word, simultaneous (`Renamer`), and invented
names for task variations.

Used by the placeholders (names to `obj1`, `obj2`, ... and back) of the experience model and the
policy, and by the curriculum's task variations, which give a seed task's objects invented names
(the same layout with new objects). A rename changes every occurrence at once, everywhere it
occurs (instruction, states, action, history, worked examples), and re-sorts lists as the state
format requires; invented names mix words of the real names with made-up ones ("potato zelmor",
"brask"), so that neither the first word nor the set of known words gives a name away.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence

from dreamgym.state import AbstractState, format_state, item_name, parse_state

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_RENAMED_TEXT = ("instruction", "action")
_RENAMED_STATES = ("state", "next_state")


def renamable_names(rows: Iterable[Mapping]) -> frozenset[str]:
    """Names of the objects ever carried (seen in an inventory) in `rows`' states."""
    return frozenset(
        item_name(item) for row in rows for column in _RENAMED_STATES for item in parse_state(row[column]).inventory
    )


def object_names(rows: Iterable[Mapping]) -> frozenset[str]:
    """Names of every object seen (visible or carried) in `rows`' states."""
    return frozenset(
        item_name(item)
        for row in rows
        for column in _RENAMED_STATES
        for state in [parse_state(row[column])]
        for item in state.visible + state.inventory
    )


def invented_names(
    names: Sequence[str], rng: random.Random, vocabulary: Sequence[str], avoid: Iterable[str] = ()
) -> dict[str, str]:
    """A distinct new name for each of `names`, none equal to a name being replaced or to one in
    `avoid` (the objects that keep their names: two objects must never share one)."""
    taken = set(names) | set(avoid)
    mapping = {}
    for name in names:
        new = _invent(rng, vocabulary)
        while new in taken:
            new = _invent(rng, vocabulary)
        taken.add(new)
        mapping[name] = new
    return mapping


def _invent(rng: random.Random, vocabulary: Sequence[str]) -> str:
    words = [
        rng.choice(vocabulary) if vocabulary and rng.random() < 0.5 else _made_up_word(rng)
        for _ in range(rng.randint(1, 3))
    ]
    return " ".join(words)


def _made_up_word(rng: random.Random) -> str:
    """Two or three consonant-vowel syllables, maybe a final consonant: never a short English
    word such as 'on', 'in' or 'with' that the game's commands are made of."""
    syllables = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 3)))
    return syllables + (rng.choice(_CONSONANTS) if rng.random() < 0.5 else "")


def name_vocabulary(names: Iterable[str]) -> list[str]:
    """The words real names are made of, sorted (a stable draw for a given seed)."""
    return sorted({word for name in names for word in name.split()})


class Renamer:
    """Replaces whole names in text, all at once (so that a -> b, b -> c gives b, c, not c, c)."""

    def __init__(self, mapping: Mapping[str, str]):
        self.mapping = dict(mapping)
        alternatives = "|".join(re.escape(name) for name in sorted(mapping, key=len, reverse=True))
        self._pattern = re.compile(rf"(?<![\w-])(?:{alternatives})(?![\w-])") if mapping else None

    def found(self, text: str) -> set[str]:
        """The names that occur in `text`."""
        return set(self.occurrences(text))

    def occurrences(self, text: str) -> list[str]:
        """The names in `text`, in the order they occur (repeats included)."""
        return self._pattern.findall(text) if self._pattern is not None else []

    def text(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda match: self.mapping[match[0]], text)

    def abstract(self, state: AbstractState) -> AbstractState:
        """`state` with names replaced (AbstractState sorts its lists again)."""
        return AbstractState(
            location=self.text(state.location),
            visible=tuple(self.text(item) for item in state.visible),
            inventory=tuple(self.text(item) for item in state.inventory),
            actions=tuple(self.text(item) for item in state.actions),
        )

    def state(self, text: str) -> str:
        """A state's text with names replaced, its lists sorted again."""
        return format_state(self.abstract(parse_state(text)))

    def row(self, row: Mapping) -> dict:
        """A transition row (or a retrieved one, without instruction) with its instruction,
        action and states renamed."""
        renamed = dict(row)
        for column in _RENAMED_TEXT + _RENAMED_STATES:
            if column in row:
                rename = self.state if column in _RENAMED_STATES else self.text
                renamed[column] = rename(row[column])
        return renamed


def names_in(rows: Iterable[Mapping], names: frozenset[str]) -> list[str]:
    """Which of `names` occur in the rows' text, sorted (for a deterministic draw)."""
    finder = Renamer({name: name for name in names})
    return sorted(
        set().union(
            *(finder.found(row[column]) for row in rows for column in _RENAMED_TEXT + _RENAMED_STATES if column in row)
        )
    )
