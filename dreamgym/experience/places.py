"""Places the episode has been: a move back into one shows it as the episode left it.

A prompt carries the last few actions of its episode, not the rooms it went through, so to the
model a move back into a room the episode has seen is a move into the unknown: it writes out a
room, or copies another game's. Yet nothing in a room changes while the player is away (no
transition of the data moves an object the player does not act on), so the room is as the episode
last showed it, with what the player carries now. Two things make that a prediction:

- where a move leads: the episode's own moves (from A, `go east` led to B), and their ways back,
  learnt from the training data with the affordances (`affordances.learnt_returns`: in the
  training episodes that went from A to B with `go east` and later back, the move back was
  `go west`), never from a word list;
- the room: its last state in the episode, with the inventory now. Where the inventory changed
  since, the actions on objects are learnt as for a worked example's change (affordances.py), as
  if the step from that last state had changed only what the player carries.

Where the memory knows the next state, it replaces the model's; the reward and the end are the
model's (measured: results log, 2026-11-29, "places the episode has been"). `RememberedPlaces` is
that rule as a layer over any `Dynamics` (the LM, or the copy that stands for no LM in the
ablation), on or off with `experience.remember_places`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from dreamgym.envs.dynamics import Dynamics, Prediction, Query
from dreamgym.experience.affordances import Affordances, actions_on_no_object, items_of
from dreamgym.state import AbstractState


def destination(query: Query, returns: Mapping[str, str]) -> str | None:
    """Where `query.action` leads from `query.state`, as far as its episode (`query.earlier`) and
    the learnt ways back tell; None where they do not."""
    states = [state for state, _ in query.earlier] + [query.state]
    recorded: dict[tuple[str, str], str] = {}
    returning: dict[tuple[str, str], str] = {}
    for (state, action), after in zip(query.earlier, states[1:]):
        if after.location != state.location:
            recorded[(state.location, action)] = after.location
            if action in returns:
                returning[(after.location, returns[action])] = state.location
    key = (query.state.location, query.action)
    return recorded.get(key, returning.get(key))


def last_seen(earlier: Sequence[tuple[AbstractState, str]], location: str) -> AbstractState | None:
    """The episode's last state in `location` (the one it left from)."""
    return next((state for state, _ in reversed(earlier) if state.location == location), None)


def remembered(query: Query, affordances: Affordances) -> AbstractState | None:
    """The next state of a move back into a place the episode has been; None for any other step."""
    there = destination(query, affordances.returns)
    if there is None or there == query.state.location:
        return None
    last = last_seen(query.earlier, there)
    if last is None:
        return None
    if last.inventory == query.state.inventory:
        return last
    carrying_now = dataclasses.replace(last, inventory=query.state.inventory)
    # The room's actions on no object (its exits) are the ones it offered; those on objects follow
    # the objects it holds and the player carries now.
    plain = actions_on_no_object(last.actions, items_of(last))
    return dataclasses.replace(carrying_now, actions=tuple(plain | affordances.predict(carrying_now, last)))


class RememberedPlaces:
    """`model`, except that a move back into a place the episode has been gets the room as the
    episode left it for its next state; the reward and the end stay `model`'s, and a prediction
    that failed stays a failure."""

    def __init__(self, model: Dynamics, affordances: Affordances):
        self.model, self.affordances = model, affordances

    @property
    def history(self) -> int:
        return self.model.history

    def predict(self, queries: Sequence[Query]) -> list[Prediction]:
        predictions = self.model.predict(queries)
        for index, (query, prediction) in enumerate(zip(queries, predictions, strict=True)):
            place = remembered(query, self.affordances) if prediction.ok else None
            if place is not None:
                completion = dataclasses.replace(prediction.completion, next_state=place)
                predictions[index] = dataclasses.replace(prediction, completion=completion)
        return predictions
