"""Re-ranking of retrieved neighbours by how much of the query's situation they share.

The buffer's vector search finds transitions whose text reads alike (`transition_text`), but a
step's outcome hangs on a few words of it: the move, and facts such as whether the fridge is open.
The model copies its worked examples (with k = 1, whenever it can), so an example in another
situation is copied wrong. So retrieval fetches a pool by embedding and keeps the k candidates
closest by the `RANKING_KEYS`, in order (ties: the embedding's order):
- `action`: the same action, each side in its own placeholders (dreamgym/placeholders.py);
- `action_form`: else the same move on other items (`open {0}`), shown on the query's items
  (`examples.on_the_query_items`);
- `change_fits`: the candidate's change applies to the query's state (removes only what is there);
- `task_relation`: the move stands alike to its task (its reward and end are copied with it);
- `acted_items`: the items the action names are alike (`obj1 (roasted)`): a removal names the
  item alone (format.py), so only this key puts a roasted example first;
- `open_closed`: the things the change's actions name are open or closed alike (the same test
  on every named item did worse);
- `kind`: the items acted on are of the same kind (from the real names the model does not see);
- `progress`: the game's score before the step is the same (within a point): what a move pays can
  hang on how far the task has come, which the state does not show (ScienceWorld pays its first
  move to another room 8.33 and the next ones nothing, and the model copied the reward of a later
  move; measured: results log, 2026-12-07 (12:40));
- `shared_items`: the largest share of state items (location, visible, carried, actions: Jaccard).
Each key earns its place, and a pool (`experience.retrieval_pool`) of hundreds finds far more exact
examples than the nearest few, at a ranking cost small beside generation (measured: results log,
2026-11-23, 2026-11-24, 2026-11-25 and 2026-11-29).

`task_relation`, `open_closed` and `kind` know the environment and are a `Domain`'s
(dreamgym/domain.py; TextWorld cooking's are envs/textworld/cooking.py); the rest hold in any text
environment. `experience.ranking_off` switches any key off.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from dreamgym.domain import NO_RULES, Domain
from dreamgym.experience.affordances import template_of
from dreamgym.experience.format import LIST_FIELDS, fits, state_delta
from dreamgym.placeholders import Placeholders
from dreamgym.state import AbstractState, item_name, parse_state, whole_word

# Bumped whenever the ranking changes which examples are shown, or their adaptation
# (examples.adapted_examples) how: built examples keyed on it are then built again instead of reused.
RANKING_VERSION = 11
# The ranking's keys, most decisive first (`closeness`); experience.ranking_off switches keys off.
RANKING_KEYS = (
    "action",
    "action_form",
    "change_fits",
    "task_relation",
    "acted_items",
    "open_closed",
    "kind",
    "progress",
    "shared_items",
)


@dataclass(frozen=True)
class Situation:
    """What a step's outcome depends on: the action and the state's items, in placeholders when
    the model uses them."""

    action: str
    items: frozenset[str]
    acted: frozenset[str] = frozenset()  # the visible or carried items the action names
    state: AbstractState | None = None  # the state itself, which a candidate's change must fit
    relation: Hashable | None = None  # to the task (the domain's `task_relation`)
    kinds: frozenset[str] = frozenset()  # what the items the action names are (the domain's `kinds`)
    domain: Domain = NO_RULES  # whose rules made it, and compare open or closed things
    form: str | None = None  # the action with the items it names as slots (`open {0}`); None: as the action
    score: float | None = None  # the game's score before the step (None: unknown)


def situation(
    state: AbstractState,
    action: str,
    kept: frozenset[str] | None,
    instruction: str | None,
    domain: Domain,
    score: float | None = None,
) -> Situation:
    """The situation of taking `action` in `state` for the task `instruction` (None: unknown) by
    the rules of `domain`, at the game's `score` (None: unknown); `kept`: the model's kept names
    (None: no placeholders)."""
    relation = domain.task_relation(instruction, state, action)
    kinds = domain.kinds(state, action)
    if kept is not None:
        names = Placeholders.of(kept, action, [state])
        state, action = names.forward.abstract(state), names.forward.text(action)
    items = {f"location: {state.location}"}
    for name in LIST_FIELDS:
        items.update(f"{name}: {item}" for item in getattr(state, name))
    acted = {
        f"{name}: {item}"
        for name in ("visible", "inventory")
        for item in getattr(state, name)
        if whole_word(item_name(item)).search(action)
    }
    form = template_of(action, {item_name(item.split(": ", 1)[1]) for item in acted})[0]
    return Situation(action, frozenset(items), frozenset(acted), state, relation, kinds, domain, form, score)


@lru_cache(maxsize=8192)  # ~5 kB each: a default buffer's real rows, within ~40 MB
def stored_situation(
    state_text: str,
    action: str,
    kept: frozenset[str] | None,
    instruction: str | None,
    domain: Domain,
    score: float | None = None,
) -> Situation:
    """The situation of a buffer row: the same few thousand rows come back for query after query."""
    return situation(parse_state(state_text), action, kept, instruction, domain, score)


@lru_cache(maxsize=8192)
def stored_change(state_text: str, next_state_text: str, action: str, kept: frozenset[str] | None) -> str:
    """A buffer row's change, in its own placeholders: what its worked example shows."""
    row = {"state": state_text, "next_state": next_state_text, "action": action}
    if kept is not None:
        row = Placeholders.own(kept, row)
    return state_delta(parse_state(row["state"]), parse_state(row["next_state"]))


def _change_fits(query: Situation, change: str | None) -> bool:
    return change is not None and query.state is not None and fits(query.state, change)


# Each ranking key: larger is closer. Named as in RANKING_KEYS, in its order.
_KEYS = {
    "action": lambda query, candidate, change: query.action == candidate.action,
    "action_form": lambda query, candidate, change: _form(query) == _form(candidate),
    "change_fits": lambda query, candidate, change: query.action == candidate.action and _change_fits(query, change),
    "task_relation": lambda query, candidate, change: query.relation == candidate.relation,
    "acted_items": lambda query, candidate, change: query.acted == candidate.acted,
    "open_closed": lambda query, candidate, change: _opened_alike(query, candidate, change),
    "kind": lambda query, candidate, change: query.kinds == candidate.kinds,
    "progress": lambda query, candidate, change: _same_progress(query, candidate),
    "shared_items": lambda query, candidate, change: _shared(query, candidate),
}
assert tuple(_KEYS) == RANKING_KEYS


def closeness(
    query: Situation, candidate: Situation, change: str | None = None, off: frozenset[str] = frozenset()
) -> tuple[bool, bool, bool, bool, bool, bool, bool, bool, float]:
    """Larger is closer, by the `RANKING_KEYS` in order: the same action, then the same move on
    other items (`open {0}`: `examples.adapted_examples` shows it on the query's), then whether the
    candidate's `change` can be applied to the query's state, then the same relation to the task,
    then the same items named by the action, then whether what the change's actions name is open
    or closed alike on both sides, then the same kinds of items acted on, then the same score
    before the step, then the share of state items in common. A key in `off` counts the same for
    every candidate."""
    return tuple(  # type: ignore[return-value] - one value per key, in that order
        (0.0 if name == "shared_items" else False) if name in off else key(query, candidate, change)
        for name, key in _KEYS.items()
    )


def _closest_one(query: Situation, candidates: Sequence[Situation], changes: Sequence[str | None], scored, off) -> int:
    """The first of `scored` whose `closeness` is the largest, computed key by key on the candidates
    still tied: a later key (the open or closed things, the share of items) only for the few
    alike so far, and whether a change fits once per distinct change."""
    fitting: dict[str | None, bool] = {}

    def value(name: str, i: int):
        if name == "change_fits":  # many candidates share a change: `fits` once for each
            if changes[i] not in fitting:
                fitting[changes[i]] = _change_fits(query, changes[i])
            return query.action == candidates[i].action and fitting[changes[i]]
        return _KEYS[name](query, candidates[i], changes[i])

    tied = list(scored)
    for name in RANKING_KEYS:
        if len(tied) == 1:
            break
        if name in off:
            continue
        values = [value(name, i) for i in tied]
        best = max(values)
        tied = [i for i, v in zip(tied, values) if v == best]
    return tied[0]


def _form(situation: Situation) -> str:
    return situation.action if situation.form is None else situation.form


def _opened_alike(query: Situation, candidate: Situation, change: str | None) -> bool:
    return (
        change is None
        or query.state is None
        or candidate.state is None
        or query.domain.statuses(query.state, change) == query.domain.statuses(candidate.state, change)
    )


def _same_progress(query: Situation, candidate: Situation) -> bool:
    """The same score before the step, within a point (an unknown score is alike any)."""
    return query.score is None or candidate.score is None or abs(query.score - candidate.score) < 1


def _shared(query: Situation, candidate: Situation) -> float:
    """The Jaccard index of the two situations' state items."""
    union = len(query.items | candidate.items)
    return len(query.items & candidate.items) / union if union else 1.0


def closest(
    query: Situation,
    candidates: Sequence[Situation],
    k: int,
    changes: Sequence[str] | None = None,
    off: frozenset[str] = frozenset(),
) -> list[int]:
    """The indices of the k candidates closest to `query` (`changes`: the candidates' changes;
    `off`: ranking keys switched off); ties keep the candidates' order."""
    changes = changes if changes is not None else [None] * len(candidates)
    same_action = [i for i, candidate in enumerate(candidates) if candidate.action == query.action]
    # The same action comes first: when k candidates have it, the others need not be scored.
    scored = same_action if len(same_action) >= k and "action" not in off else range(len(candidates))
    if k == 1 and scored:
        return [_closest_one(query, candidates, changes, scored, off)]
    ranked = sorted(
        scored, key=lambda i: closeness(query, candidates[i], changes[i], off), reverse=True
    )  # a stable sort, reversed or not
    return ranked[:k]
