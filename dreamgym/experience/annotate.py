"""Reasoning traces for transitions: real environments give none, so an annotator writes them.

The default, `describe_change`, derives a short trace from the difference between the state and
the next state only (what moved, what changed, why the score changed, whether the episode ends),
so it never states a fact the states do not show. Traces are kept to a few hundred characters:
the experience model learns to write them, token by token, on a CPU. `OpenAIAnnotator` asks an
OpenAI-compatible endpoint (e.g. a vLLM server) instead, for teams with a strong model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import httpx

from dreamgym.errors import DreamgymError
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.format import format_number
from dreamgym.state import AbstractState, format_state, item_name

Annotator = Callable[..., str]  # (state, action, next_state, reward, done, won=None, task=None) -> trace
_LISTED = 4  # items named in a list before "and N more"


class AnnotatorError(DreamgymError):
    """An annotator endpoint that cannot be reached or gives no usable answer."""


class _Thing(NamedTuple):
    """Where an item is and what state it is in, read from its text in a state."""

    held: bool
    states: tuple[str, ...]  # e.g. ("sliced", "roasted"), as the state writes them
    place: str | None  # e.g. "on counter"; None in the inventory or lying in the room


def _things(state: AbstractState) -> dict[str, _Thing]:
    things = {}
    for held, items in ((False, state.visible), (True, state.inventory)):
        for item in items:
            name = item_name(item)
            descriptors = item[len(name) + 2 : -1].split(", ") if item != name else []
            place = next((d for d in descriptors if d.startswith(("on ", "in "))), None)
            things[name] = _Thing(held, tuple(d for d in descriptors if d != place), place)
    return things


def _listing(names: list[str]) -> str:
    """'a, b and c', or 'a, b, c, d and 3 more' for a long list."""
    if len(names) > _LISTED:
        return f"{', '.join(names[:_LISTED])} and {len(names) - _LISTED} more"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _item_changes(before: dict[str, _Thing], after: dict[str, _Thing]) -> list[str]:
    """One phrase per item that moved or changed state, then what appeared and disappeared."""
    phrases, appeared, vanished = [], [], []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old is None and new.held:
            phrases.append(f"{name} appears in the inventory")
        elif old is None:
            appeared.append(name)
        elif new is None and old.held:
            phrases.append(f"{name} leaves the inventory")
        elif new is None:
            vanished.append(name)
        else:
            phrases += _thing_changes(name, old, new)
    if appeared:
        phrases.append(f"now visible: {_listing(appeared)}")
    if vanished:
        phrases.append(f"no longer visible: {_listing(vanished)}")
    return phrases


def _thing_changes(name: str, old: _Thing, new: _Thing) -> list[str]:
    phrases = []
    if new.held and not old.held:
        phrases.append(f"{name} goes into the inventory")
    elif old.held and not new.held:
        phrases.append(f"{name} is put {new.place}" if new.place else f"{name} is dropped")
    elif new.place != old.place:
        phrases.append(f"{name} is now {new.place or 'in the room'}")
    gained = [s for s in new.states if s not in old.states]
    lost = [s for s in old.states if s not in new.states]
    if gained:
        phrases.append(f"{name} is now {_listing(gained)}")
    elif lost:
        phrases.append(f"{name} is no longer {_listing(lost)}")
    return phrases


_NOTHING = "Nothing changes: the action has no effect."
_MOVES = "The player moves from the "
_ONLY_ACTIONS = "Only the available actions change."
_EFFECTS = "Effects: "


def _what_changed(state: AbstractState, next_state: AbstractState) -> str:
    if state == next_state:
        return _NOTHING
    if state.location != next_state.location:
        return f"{_MOVES}{state.location} to the {next_state.location}."
    phrases = _item_changes(_things(state), _things(next_state))
    if not phrases:
        return _ONLY_ACTIONS
    # Led by a fixed word, not by a capitalised first name: the model copies names from the
    # prompt, where they are never capitalised.
    return f"{_EFFECTS}{'; '.join(phrases)}."


def stated_change(trace: str) -> bool | None:
    """Whether a `describe_change` trace says the state changed; None when it does not say so in
    the annotator's words. Decoding holds the next state to it (`constrain.py`): the annotator
    writes that nothing changes exactly when the next state is the state."""
    if trace.startswith(_NOTHING):
        return False
    if trace.startswith((_MOVES, _ONLY_ACTIONS, _EFFECTS)):
        return True
    return None


_RISES = "The score rises by {}: the action advances the task."
_FALLS = "The score falls by {}."
_UNCHANGED = "The score does not change."
_ENDS = "the episode ends."
# What `describe_change` says of the reward and the end, read back (`stated_outcome`).
_STATED_SCORE = re.compile(
    "|".join(
        [
            re.escape(_RISES).replace(r"\{\}", r"(?P<rise>[0-9][0-9.e+-]*)"),
            re.escape(_FALLS).replace(r"\{\}", r"(?P<fall>[0-9][0-9.e+-]*)"),
            re.escape(_UNCHANGED),
        ]
    )
)


def _score_change(reward: float) -> str:
    if reward > 0:
        return _RISES.format(format_number(reward))
    if reward < 0:
        return _FALLS.format(format_number(-reward))
    return _UNCHANGED


def _ending(won: bool | None) -> str:
    if won is None:
        return _ENDS.capitalize()
    return f"The task is {'won' if won else 'lost'} and {_ENDS}"


def stated_outcome(trace: str) -> tuple[float, bool] | None:
    """(reward, done) as a `describe_change` trace states them; None when the trace does not say
    what the score did in its words (a trace of another annotator, or one the model garbled).

    The experience model writes its trace first: decoding holds the reward and done it then
    writes to what the trace said (`constrain.py`), as the annotator's traces always agree."""
    # the last match: the others are the effects' words
    found = next(iter(reversed(list(_STATED_SCORE.finditer(trace)))), None)
    if found is None:
        return None
    try:
        reward = float(found["rise"]) if found["rise"] else -float(found["fall"]) if found["fall"] else 0.0
    except ValueError:  # a number the model garbled, e.g. "1.2.3"
        return None
    return reward, _ENDS in trace[found.end() :].lower()


def describe_change(
    state: AbstractState,
    action: str,
    next_state: AbstractState,
    reward: float,
    done: bool,
    won: bool | None = None,
    task: str | None = None,
) -> str:
    """A faithful 1-3 sentence trace of a step, from the states alone.

    `action` and `task` are not used: the trace says what the states show, not what the action
    meant to do (they are part of the signature every annotator shares). `won` is read only
    when `done`.
    """
    sentences = [_what_changed(state, next_state), _score_change(reward)]
    if done:
        sentences.append(_ending(won))
    return " ".join(sentences)


_SYSTEM_PROMPT = (
    "You explain one step of a text game. Answer in 1 to 3 short sentences, stating "
    "only what follows from the task, the two states and the reward: what the action "
    "changed, why the score changed, and whether the episode ended."
)


class OpenAIAnnotator:
    """Traces from an OpenAI-compatible chat-completions endpoint (e.g. vLLM), one call a step."""

    def __init__(self, base_url: str, model: str, timeout: float = 60):
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        self.model = model
        self.timeout = timeout

    def __call__(
        self,
        state: AbstractState,
        action: str,
        next_state: AbstractState,
        reward: float,
        done: bool,
        won: bool | None = None,
        task: str | None = None,
    ) -> str:
        ending = "no" if not done else "yes" if won is None else f"yes, the task is {'won' if won else 'lost'}"
        question = (
            (f"Task: {task}\n\n" if task else "") + f"State:\n{format_state(state)}\n\nAction: {action}\n\n"
            f"Next state:\n{format_state(next_state)}\n\n"
            f"Reward: {format_number(reward)}. Episode ended: {ending}."
        )
        return self._ask(question)

    def _ask(self, question: str) -> str:
        """The model's answer on one line; `AnnotatorError` when there is none to use."""
        body = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": 200,
            "messages": [{"role": "system", "content": _SYSTEM_PROMPT}, {"role": "user", "content": question}],
        }
        try:
            response = httpx.post(self.url, json=body, timeout=self.timeout)
        except httpx.HTTPError as error:
            raise AnnotatorError(
                f"annotator {self.url}: request failed ({error}); check "
                "experience.annotator_url and that the server is up"
            ) from None
        if response.status_code != 200:
            raise AnnotatorError(f"annotator {self.url}: HTTP {response.status_code}: {response.text[:200]}")
        try:
            answer = response.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise AnnotatorError(
                f"annotator {self.url}: not a chat-completions answer: {response.text[:200]}"
            ) from None
        trace = " ".join(answer.split())
        if not trace:
            raise AnnotatorError(f"annotator {self.url}: model {self.model!r} gave an empty answer")
        return trace


def make_annotator(config: ExperienceConfig) -> Annotator:
    """The annotator `config.annotator` names."""
    if config.annotator == "openai":
        return OpenAIAnnotator(config.annotator_url, config.annotator_model)
    return describe_change
