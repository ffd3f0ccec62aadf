"""The experience model's text format: prompt, completion and state delta, defined here only.

A prompt shows the task, worked examples retrieved from the buffer, the last steps of the
episode, the current state and the action, then what the task says of the object the action acts
on (`task_says`). Whether a step scores depends on those words (an ingredient of the recipe, the
cut it asks for), and a small model does not find them ~700 tokens back on its own: asked to
quote them in its reasoning it often quoted a recipe's usual words instead. So the prompt quotes
them next to the action, and each worked example shows its own (measured: results log, 2026-11-23).

A worked example also shows its reasoning trace (with the state-diff annotator, whose traces are
computed from the example's own states): the model copies its example far better than it writes on
its own, and its trace, written first, is what decides the reward and the end (constrain.py). Left
to write the trace itself, it wrote "obj1 goes into the inventory. The score rises by 1" for
`eat obj1` under an example that lost the game; shown traces raised every fidelity figure
(measured: results log, 2026-11-24). The completion the model learns to write is:

    <reasoning>The fridge is now open; ... The score does not change.</reasoning>
    <next_state>
    visible: -fridge (closed); +carrot (in fridge); +fridge (open)
    actions: -open fridge; +close fridge; +take carrot from fridge
    </next_state>
    <reward>0</reward>
    <done>false</done>

(no reasoning section when the model is trained without reasoning). The next state is written as
a *delta* from the current state, not in full: a full state is ~830 characters, most of them the
~30 available actions, while a step changes a few items, and every token costs on a CPU. A delta
has one line per changed field, in the state's field order:

    location: corridor              the new location
    visible: -a; -b; +c (open)      removals then additions, each group sorted
    visible = a; b; c               the whole new list (`visible =` when it becomes empty)

A delta is an edit that worked examples carry from one state to another (`same as example 1`,
below), so it is written in the form that means the same in another state wherever it can:
- a removal names the item without its descriptors (`-carrot`, not `-carrot (sliced, on table)`):
  taking a carrot removes it from the room whatever was done to it, and a removal written in full
  would fit only states where it was cut and placed just so. The full text is written when two
  items of the field share the name; the parser reads either.
- a list is replaced (`field =`) only when the location changes: a new place shows a new scene,
  while in the same place a replacement would also drop or bring back the items the example's state
  happened to hold (`inventory = knife; meal` after preparing a meal says nothing of what else a
  player carries). On a move the shorter of the two forms is written.
Each rule makes the first example's change give the real next state more often (measured: results
log, 2026-11-24).
`no change` is the delta of a step that changes nothing. With `experience.copy_examples`,
`same as example 2` is the delta of a step whose next state is what the prompt's second worked
example's change (its `changes:`, which `example_changes` reads back from the prompt) gives when
applied to this state: the model points at a retrieved change instead of writing it out again
token by token.

A reasoning that is exactly a worked example's trace names it the same way
(`<reasoning>same as example 1</reasoning>`, read back through `example_traces`), and then states
that example's reward and end. Written out token by token, the model's trace left its example's at
the sentence on the score: "The score does not change." for `eat meal` under an example that won
the game, though it pointed at that example's change. Most training traces are their first
example's, and naming them raised the reward and done figures (measured: results log, 2026-11-24).

`parse_completion` reads a completion back strictly: anything that is not a valid completion
raises `FormatError` saying what is wrong, so that the synthetic environment can count and retry
it instead of guessing. Order is presentation, not meaning: the parser reads
lists as the sets they are, so items and field lines in another order than the writer's, or a
line restating a field's current value, are read for what they say. Whatever changes the meaning
or makes it doubtful is refused: a repeated item or field, removing what is not there, adding what
is, an item both removed and added.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from dreamgym.envs.dynamics import Completion, Step
from dreamgym.errors import DreamgymError
from dreamgym.placeholders import Placeholders
from dreamgym.state import (
    FIELDS,
    ITEM_SEPARATOR,
    AbstractState,
    StateParseError,
    acted_object,
    format_state,
    item_name,
    task_mentions,
)

# Bumped whenever a prompt or completion changes shape: stored examples and models keyed on it are
# then built again instead of reused.
# The history of formats is in CHANGELOG.md.
FORMAT_VERSION = 6
LIST_FIELDS = FIELDS[1:]
NO_CHANGE = "no change"
SAME_AS = "same as example {}"  # the delta or trace of a worked example of the prompt, 1-based
SECTIONS = ("reasoning", "next_state", "reward", "done")

_TAG = re.compile(r"<(/?)(reasoning|next_state|reward|done)>")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_DELTA_LINE = re.compile(r"([a-z_]+)(?:: (.+)| =(?: (.+))?)")
_SAME_AS = re.compile(SAME_AS.format(r"(\d+)"))
_EXAMPLE = re.compile(
    r"<example>\nlocation: [^\n]*\naction: [^\n]*\n(?:task says: [^\n]*\n)?"
    r"(?:reasoning: ([^\n]*)\n)?changes:\n(.*?)\n"
    r"reward: ([^\n]*) done: (true|false)\n</example>",
    re.S,
)


class FormatError(DreamgymError):
    """A completion or state delta that does not follow the experience model's format."""


@dataclass(frozen=True)
class Worked:
    """A retrieved transition shown as a worked example: where, what was done, what followed."""

    location: str
    action: str
    delta: str
    reward: float
    done: bool
    task_says: str | None = None  # `task_says` of its own task
    reasoning: str | None = None  # its trace, as the model writes one for its own step


# --- numbers and flags -------------------------------------------------------------------------


def format_number(value: float) -> str:
    """Compact (`1`, `0.5`, `-1`), and exact: falls back to repr when `:g` would round."""
    if not math.isfinite(value):
        raise FormatError(f"reward {value} is not a finite number")
    compact = f"{value:g}"
    return compact if float(compact) == value else repr(float(value))


def _flag(value: bool) -> str:
    return "true" if value else "false"


# --- state delta -------------------------------------------------------------------------------


def state_delta(state: AbstractState, next_state: AbstractState) -> str:
    """The lines that turn `state` into `next_state` (see the module docstring)."""
    moved = next_state.location != state.location
    lines = [f"location: {next_state.location}"] if moved else []
    for name in LIST_FIELDS:
        before, after = getattr(state, name), getattr(next_state, name)
        if before != after:
            lines.append(_list_change(name, before, after, moved))
    return "\n".join(lines) or NO_CHANGE


def _list_change(name: str, before: tuple[str, ...], after: tuple[str, ...], moved: bool) -> str:
    """The diff; on a move, the shorter of the diff and the replacement line (the diff on a tie)."""
    removed, added = set(before) - set(after), sorted(set(after) - set(before))
    written = removal_texts(before)
    diff = f"{name}: " + ITEM_SEPARATOR.join(
        sorted(f"-{written[item]}" for item in removed) + [f"+{item}" for item in added]
    )
    if not moved:
        return diff
    replacement = f"{name} = {ITEM_SEPARATOR.join(after)}" if after else f"{name} ="
    return diff if len(diff) <= len(replacement) else replacement


def removal_texts(items: Sequence[str]) -> dict[str, str]:
    """How a removal names each of `items`: its name, or its full text when another item of the
    field has the same name."""
    names = Counter(item_name(item) for item in items)
    return {item: item_name(item) if names[item_name(item)] == 1 else item for item in items}


def _removed_item(name: str, current: Sequence[str], entry: str) -> str:
    """The item of `current` that the removal `entry` names: the item written in full, or the one
    item with that name."""
    if entry in current:
        return entry
    matches = [item for item in current if item_name(item) == entry]
    if not matches:
        raise FormatError(f"cannot remove {entry!r} from {name}: it is not there")
    if len(matches) > 1:
        raise FormatError(
            f"cannot remove {entry!r} from {name}: {len(matches)} items have that name; write the item in full"
        )
    return matches[0]


def apply_delta(state: AbstractState, delta: str) -> AbstractState:
    """The state `delta` leads to from `state`; `FormatError` if the delta is not valid for it."""
    if not delta.strip():
        raise FormatError("empty delta: write 'no change' when nothing changes")
    if delta == NO_CHANGE:
        return state
    values = {name: getattr(state, name) for name in FIELDS}
    seen = set()
    for line in delta.split("\n"):
        name, kind, text = _delta_line(line)
        if name in seen:
            raise FormatError(f"field '{name}' is repeated in the delta: one line per field")
        seen.add(name)
        if name == "location":
            values[name] = _new_location(state.location, kind, text)
        elif kind == "=":
            values[name] = _replaced(name, values[name], text)
        else:
            values[name] = _changed(name, values[name], text)
    try:
        return AbstractState(**values)
    except StateParseError as error:
        raise FormatError(f"the delta gives an invalid state: {error}") from None


def applied(state: AbstractState, delta: str) -> AbstractState | None:
    """The state `delta` leads to from `state`, or None where it cannot be applied."""
    try:
        return apply_delta(state, delta)
    except FormatError:
        return None


def fits(state: AbstractState, delta: str) -> bool:
    """Whether `delta` can be applied to `state` (it removes only what is there, and so on)."""
    return applied(state, delta) is not None


def _delta_line(line: str) -> tuple[str, str, str]:
    """(field, ':' or '=', the rest) of one delta line."""
    if line == NO_CHANGE:
        raise FormatError("'no change' must be the whole delta, not one line among changes")
    match = _DELTA_LINE.fullmatch(line)
    if not match:
        raise FormatError(f"malformed delta line {line[:80]!r}: expected 'field: changes' or 'field = items'")
    name = match[1]
    if name not in FIELDS:
        raise FormatError(f"unknown field '{name}' in the delta: fields are {', '.join(FIELDS)}")
    if match[2] is not None:
        return name, ":", match[2]
    return name, "=", match[3] or ""


def _new_location(current: str, kind: str, text: str) -> str:
    if kind != ":":
        raise FormatError("the location is written 'location: <new location>'")
    return text


def _check_unique(what: str, items: Sequence[str]) -> None:
    if len(set(items)) != len(items):
        raise FormatError(f"{what} repeat an item")


def _replaced(name: str, current: tuple[str, ...], text: str) -> tuple[str, ...]:
    items = tuple(text.split(ITEM_SEPARATOR)) if text else ()
    _check_unique(f"the items of '{name} ='", items)
    return tuple(sorted(items))


def _changed(name: str, current: tuple[str, ...], text: str) -> tuple[str, ...]:
    entries = text.split(ITEM_SEPARATOR)
    for entry in entries:
        if len(entry) < 2 or entry[0] not in "+-":
            raise FormatError(f"{name}: change {entry!r} must be '-item' or '+item'")
    removed = [_removed_item(name, current, entry[1:]) for entry in entries if entry[0] == "-"]
    added = [entry[1:] for entry in entries if entry[0] == "+"]
    _check_unique(f"{name} removals", removed)
    _check_unique(f"{name} additions", added)
    for item in removed:
        if item in added:
            raise FormatError(f"{name}: {item!r} is both removed and added")
    for item in added:
        if item in current:
            raise FormatError(f"cannot add {item!r} to {name}: it is already there")
    return tuple(sorted(set(current).difference(removed).union(added)))


def referenced_delta(state: AbstractState, next_state: AbstractState, examples: Sequence[str]) -> str:
    """The delta from `state` to `next_state`, or `same as example i` when the change of the i-th
    of the prompt's worked examples, applied to `state`, gives `next_state` (the first such
    example; never for `no change`, which is shorter). What counts is what the change does here,
    not its text: `inventory: -meal` and `inventory =` are the same step for a player carrying
    only the meal."""
    delta = state_delta(state, next_state)
    if delta != NO_CHANGE:
        for number, changes in enumerate(examples, start=1):
            if applied(state, changes) == next_state:
                return SAME_AS.format(number)
    return delta


def referenced_trace(trace: str, traces: Sequence[str | None]) -> str:
    """`trace`, or `same as example i` when it reads as the trace the i-th worked example shows
    (the first such; None: an example without one)."""
    for number, shown in enumerate(traces, start=1):
        if shown is not None and one_line(shown) == one_line(trace):
            return SAME_AS.format(number)
    return trace


def resolve_reference(text: str, shown: Sequence[str | None], what: str = "changes") -> str:
    """What `text` (a delta or a trace) stands for: itself, or the `what` of the worked example it
    names (`shown`: each example's, None for an example that shows none)."""
    match = _SAME_AS.fullmatch(text)
    if match is None:
        return text
    number = int(match[1])
    if not 1 <= number <= len(shown):
        has = f"examples 1 to {len(shown)}" if shown else "no worked examples"
        raise FormatError(f"'{text}' names an example the prompt does not have (it shows {has})")
    if shown[number - 1] is None:
        raise FormatError(f"'{text}' names example {number}, which shows no {what}")
    return shown[number - 1]


# --- completion --------------------------------------------------------------------------------


def format_completion(reasoning: str | None, delta: str, reward: float, done: bool) -> str:
    """The completion text (see the module docstring); no end marker: the EOS token ends it."""
    sections = [] if reasoning is None else [f"<reasoning>{_checked_reasoning(reasoning)}</reasoning>"]
    sections += [
        f"<next_state>\n{delta}\n</next_state>",
        f"<reward>{format_number(reward)}</reward>",
        f"<done>{_flag(done)}</done>",
    ]
    return "\n".join(sections)


def _checked_reasoning(reasoning: str) -> str:
    """Reasoning that reads back unchanged: non-empty, no surrounding space, no section tags."""
    if not reasoning or reasoning != reasoning.strip():
        raise FormatError(f"reasoning must be non-empty text without surrounding spaces: {reasoning[:80]!r}")
    if _TAG.search(reasoning):
        raise FormatError(f"reasoning must not contain section tags: {reasoning[:80]!r}")
    return reasoning


def parse_completion(
    text: str, state: AbstractState, reasoning: bool, examples: Sequence[str] = (), traces: Sequence[str | None] = ()
) -> Completion:
    """Read a completion for a step from `state`; `FormatError` says what is wrong with it.
    `examples`: the changes of the prompt's worked examples (`example_changes`), which the next
    state may name (`same as example i`); `traces`: their traces (`example_traces`), which the
    reasoning may name."""
    expected = SECTIONS if reasoning else SECTIONS[1:]
    contents = _sections(text.strip(), expected)
    trace = contents["reasoning"].strip() if reasoning else None
    if trace == "":
        raise FormatError("empty <reasoning> section")
    if trace is not None:
        trace = resolve_reference(trace, traces, "reasoning")
    delta = contents["next_state"].strip()
    changes = resolve_reference(delta, examples)
    try:
        next_state = apply_delta(state, changes)
    except FormatError as error:
        if changes == delta:
            raise
        raise FormatError(f"'{delta}' does not fit this state: {error}") from None
    return Completion(
        reasoning=trace,
        next_state=next_state,
        reward=_parse_reward(contents["reward"]),
        done=_parse_done(contents["done"]),
    )


def _sections(text: str, expected: Sequence[str]) -> dict[str, str]:
    """The contents of the expected sections, which must follow one another in order with only
    whitespace between them."""
    tags = list(_TAG.finditer(text))
    if "reasoning" not in expected and any(tag[2] == "reasoning" for tag in tags):
        raise FormatError("unexpected <reasoning> section: this model writes no reasoning")
    for name in expected:
        opened = sum(1 for tag in tags if tag[2] == name and not tag[1])
        closed = sum(1 for tag in tags if tag[2] == name and tag[1])
        if not opened and not closed:
            raise FormatError(f"missing <{name}> section")
        if opened > 1 or closed > 1:
            raise FormatError(f"duplicated <{name}> section")
        if opened != closed:
            raise FormatError(f"<{name}> is not closed" if opened else f"</{name}> without <{name}>")
    order = [tag[2] for tag in tags if not tag[1]]
    if order != list(expected):
        raise FormatError(f"sections out of order: got {', '.join(order)}; expected {', '.join(expected)}")
    if [(tag[2], tag[1]) for tag in tags] != [(name, closing) for name in expected for closing in ("", "/")]:
        raise FormatError("sections overlap: each section must be closed before the next opens")
    _check_gaps(text, tags)
    return {opening[2]: text[opening.end() : closing.start()] for opening, closing in zip(tags[::2], tags[1::2])}


def _check_gaps(text: str, tags: list[re.Match]) -> None:
    """Only whitespace before, between and after the sections."""
    if text[: tags[0].start()].strip():
        raise FormatError(f"unexpected text before <{tags[0][2]}>: {text[: tags[0].start()][:60]!r}")
    for closing, opening in zip(tags[1::2], tags[2::2]):
        gap = text[closing.end() : opening.start()]
        if gap.strip():
            raise FormatError(f"unexpected text between </{closing[2]}> and <{opening[2]}>: {gap.strip()[:60]!r}")
    trailing = text[tags[-1].end() :]
    if trailing.strip():
        raise FormatError(f"trailing text after </{tags[-1][2]}>: {trailing.strip()[:60]!r}")


def _parse_reward(text: str) -> float:
    if not _NUMBER.fullmatch(text):
        raise FormatError(f"unparsable reward {text[:40]!r}: expected a number such as 1 or 0.5")
    reward = float(text)
    if not math.isfinite(reward):
        raise FormatError(f"reward {text[:40]!r} is not a finite number")
    return reward


def _parse_done(text: str) -> bool:
    if text not in ("true", "false"):
        raise FormatError(f"done must be exactly 'true' or 'false', got {text[:40]!r}")
    return text == "true"


# --- prompt ------------------------------------------------------------------------------------


def format_prompt(
    instruction: str, history: Sequence[Step], state: AbstractState, action: str, worked: Sequence[Worked]
) -> str:
    """The prompt for one step; it ends with a newline so that the completion starts cleanly.

    Worked examples keep the order given (most similar first); the examples and history blocks
    are left out when empty, and the task's words on the action when it acts on no item.
    """
    parts = [f"<task>{instruction}</task>"]
    if worked:
        parts.append(_block("examples", [_worked_block(example) for example in worked]))
    if history:
        parts.append(
            _block("history", [f"{step.location}: {step.action} -> {format_number(step.reward)}" for step in history])
        )
    parts.append(_block("state", [format_state(state)]))
    parts.append(f"<action>{action}</action>")
    said = task_says(instruction, state, action)
    if said is not None:
        parts.append(f"<task_says>{said}</task_says>")
    return "\n".join(parts) + "\n"


def task_says(instruction: str, state: AbstractState, action: str) -> str | None:
    """What the task says of the item `action` acts on in `state`: the task's clauses that name
    it, or that none does; None when the action acts on no item."""
    name = acted_object(state, action)
    if name is None:
        return None
    mentions = task_mentions(instruction, name)
    if not mentions:
        return f"nothing of {name}"
    return f"of {name}: {'; '.join(mentions)}"


def example_changes(prompt: str) -> list[str]:
    """The changes (deltas) of a prompt's worked examples, in order: what `same as example i`
    in a completion's next state stands for."""
    return [changes for _, changes, _, _ in _EXAMPLE.findall(prompt)]


def example_traces(prompt: str) -> list[str | None]:
    """The reasoning traces of a prompt's worked examples, in order (None: one shown without):
    what `same as example i` in a completion's reasoning stands for."""
    return [trace or None for trace, _, _, _ in _EXAMPLE.findall(prompt)]


def example_outcomes(prompt: str) -> list[tuple[float, bool]]:
    """The reward and done each of a prompt's worked examples shows, in order."""
    return [(_parse_reward(reward), _parse_done(done)) for _, _, reward, done in _EXAMPLE.findall(prompt)]


def one_line(text: str) -> str:
    """`text` as a worked example shows it: on one line, single-spaced."""
    return " ".join(text.split())


def _block(tag: str, lines: Sequence[str]) -> str:
    return "\n".join([f"<{tag}>", *lines, f"</{tag}>"])


def _worked_block(example: Worked) -> str:
    outcome = f"reward: {format_number(example.reward)} done: {_flag(example.done)}"
    said = [] if example.task_says is None else [f"task says: {example.task_says}"]
    traced = [] if example.reasoning is None else [f"reasoning: {one_line(example.reasoning)}"]
    return _block(
        "example",
        [
            f"location: {example.location}",
            f"action: {example.action}",
            *said,
            *traced,
            "changes:",
            example.delta,
            outcome,
        ],
    )


def with_real_names(completion: Completion, placeholders: Placeholders) -> Completion:
    """A completion predicted on placeholders, with the real names back; `FormatError` (a failed
    attempt, generated again) when that would repeat an item."""
    restore = placeholders.restorer(completion.next_state)
    next_state = restore.abstract(completion.next_state)
    for field in LIST_FIELDS:
        items = getattr(next_state, field)
        if len(set(items)) != len(items):  # e.g. `obj1` and, memorised, the name it stands for
            raise FormatError(f"{field}: the prediction names an object both by its placeholder and by its real name")
    reasoning = None if completion.reasoning is None else restore.text(completion.reasoning)
    return Completion(reasoning=reasoning, next_state=next_state, reward=completion.reward, done=completion.done)
