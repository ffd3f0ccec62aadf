"""Re-ranking of retrieved neighbours by how much of the query's situation they share.

The buffer's vector search finds transitions whose text reads alike (`transition_text`): the same
kind of room, task and objects. What decides a step's outcome is a few words of that long text:
the move itself, and facts such as whether the fridge is open or the knife carried. Among the
three nearest by embedding, only 30% of held-out queries had a worked example whose change was
exactly the answer (68% of training queries), and the model, which learns to copy its examples,
copied the wrong ones on new games: `+insert obj1 into fridge` from a neighbour whose fridge was
open, into a state whose fridge is closed.

So retrieval fetches a pool of candidates by embedding and keeps the k whose situation is
closest: the same action first, then the largest share of state items (location, visible and
carried items, available actions: their Jaccard index), then the embedding's order. With
placeholders, both sides are compared in their own placeholders (dreamgym/placeholders.py), so that
"take tomato from counter" on a held-out game matches "take carrot from counter" in training.
Held-out queries (215, default data) with an example showing the exact answer among three, by
pool size: 30% (the nearest 3), 50% (30), 58% (100), 70% (300), 73% (1000); then, a pool of 300
cost ~0.4 s per batch of 32 queries against ~13 s of generation.

With one worked example (k = 1) the model copies it whenever it can (`same as example 1`), so
which candidate comes first matters most. Among candidates with the same action, two facts are
checked before the share of items: whether the candidate's change can be applied to the query's
state at all (it removes only what is there and adds only what is not), and whether the items the
action names (`obj1 (roasted)`, `knife (on table)`) are the same on both sides: a removal names
the item alone (format.py), so `-obj1; +obj1 (chopped, fried)` applies to a roasted obj1 too,
and it is this second check that puts a roasted example first. Held-out queries (215) whose one
example shows the exact answer: 61.4% by the share of items alone (pool 300), 65.6% with both
checks first (pool 300), 69.3% (600, the default; also 1000).
Training queries (300 drawn): 69.3% → 72.0% (1000). Per batch of 32 queries, retrieval and ranking
took 0.31 s before, 0.46 s now (pool 300), 0.79 s (600), against ~13 s of generation.

The reward and the end are decided by how the move stands to the task: taking an ingredient scores,
taking anything else does not; slicing what the recipe says to chop loses the game. A candidate
showing the same move on the same items can stand otherwise to its own task, and the model copied
its +1 into a lost game. So, among candidates whose change fits, those in the same relation to
their task (the domain's `task_relation`) come first.

Since changes are edits that mean the same in another state (removals by name, lists replaced only
on a move: format.py), the first example's change, applied to the query's state, gives the real
next state for 74.9% of held-out queries (71.6% before; some candidate of the pool: 80.0% → 81.9%).

A change's available actions also hang on the things they name: `+insert knife into fridge` comes
with taking the knife only where the fridge is open. So, among candidates alike so far, those
whose change names open and closed things that are open and closed alike in the query come first:
the first example gives the real next state for 75.8% of held-out queries (74.9% before), 75.0% of
300 training queries (74.0%); the reward and done it shows are as right as before. The same rule
for every item a change names did worse (71.2%).

Then the kind of the items acted on (the domain's `kinds`, from the real names, which retrieval sees
and the model does not): `+eat obj1` comes with taking a tomato, not a potato. The first example's
change is the answer for 75.8% → 77.2% of held-out queries (its reward 98.1% → 97.7%, its end 99.1%
→ 98.6%: one step each), 75.0% → 75.0% of training queries (whose candidates come from other
episodes of the same game and so are mostly of the same kind already), and 65.8% → 68.4% of
the 269 of held-out games 21–40 (reward 94.8% → 96.3%, end 96.7% → 98.5%; a slice looked at
before this rule was kept).

Where no candidate takes the query's action, the same move on other items comes next (the
`action_form` key: `open {0}` for `open screen door`), and the worked example is shown on the
query's items (`examples.on_the_query_items`). Before, such a query's example was whichever move
shared the most state items, mostly another move in the same room: in a dream, every first
`examine ...` of a game whose data began with `open fridge` got the fridge opened. The model of
6f469fa's `make run`, this at prediction only (dev slices, spent): 77.8% → 78.4% exact on 495
transitions of training settings, 47.4% → 51.7% on 772 of shifted ones (opening 10% → 32%,
putting down 36% → 76%, no verb worse).

The three rules that know the environment (relation to the task, kinds, open or closed things)
are a `Domain`'s (dreamgym/domain.py; TextWorld cooking's are experience/cooking.py); the rest
hold in any text environment. `RANKING_KEYS` names every key; `experience.ranking_off` switches
any of them off.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from dreamgym.domain import NO_RULES, Domain
from dreamgym.experience.affordances import template_of
from dreamgym.experience.format import LIST_FIELDS, fits, state_delta, whole_word
from dreamgym.placeholders import Placeholders
from dreamgym.state import AbstractState, item_name, parse_state

# Bumped whenever the ranking changes which examples are shown, or their adaptation
# (examples.adapted_examples) how: built examples keyed on it are then built again instead of reused.
RANKING_VERSION = 10
# The ranking's keys, most decisive first (`closeness`); experience.ranking_off switches keys off.
RANKING_KEYS = (
    "action",
    "action_form",
    "change_fits",
    "task_relation",
    "acted_items",
    "open_closed",
    "kind",
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


def situation(
    state: AbstractState, action: str, kept: frozenset[str] | None, instruction: str | None, domain: Domain
) -> Situation:
    """The situation of taking `action` in `state` for the task `instruction` (None: unknown) by
    the rules of `domain`; `kept`: the model's kept names (None: no placeholders)."""
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
    return Situation(action, frozenset(items), frozenset(acted), state, relation, kinds, domain, form)


@lru_cache(maxsize=8192)  # ~5 kB each: a default buffer's real rows, within ~40 MB
def stored_situation(
    state_text: str, action: str, kept: frozenset[str] | None, instruction: str | None, domain: Domain
) -> Situation:
    """The situation of a buffer row: the same few thousand rows come back for query after query."""
    return situation(parse_state(state_text), action, kept, instruction, domain)


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
    "shared_items": lambda query, candidate, change: _shared(query, candidate),
}
assert tuple(_KEYS) == RANKING_KEYS


def closeness(
    query: Situation, candidate: Situation, change: str | None = None, off: frozenset[str] = frozenset()
) -> tuple[bool, bool, bool, bool, bool, bool, bool, float]:
    """Larger is closer, by the `RANKING_KEYS` in order: the same action, then the same move on
    other items (`open {0}`: `examples.adapted_examples` shows it on the query's), then whether the
    candidate's `change` can be applied to the query's state, then the same relation to the task,
    then the same items named by the action, then whether what the change's actions name is open
    or closed alike on both sides, then the same kinds of items acted on, then the share of state
    items in common. A key in `off` counts the same for every candidate."""
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
