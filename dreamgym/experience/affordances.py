"""Actions learnt from objects: which actions a next state offers, learnt from the buffer's states.

The experience model mostly copies a worked example's change (`same as example 1`). Where that
copy is wrong, it is most often wrong only in the `actions` line: taking an object adds the
actions this world allows on it (cut it with the knife carried here, put it on this room's
furniture), which another game's example lists for its own world. Those actions follow from the
objects a state shows, the same way in every game, so they are learnt from the data instead:

- an action that names objects of its state is a template with slots (`put {0} on {1}`); each
  slot is described by its object at decreasing detail (`LEVELS`): its name; its name if every
  game has it (the placeholders' kept names) else "object"; a piece of furniture's head noun
  (`door` of `sliding patio door`); the furniture's uses among the previous state's actions (what
  a new cooker is for); before "furniture", the name, head noun and uses again with any states of
  the portable objects (a door is no container whatever the food carried, where the food's
  states made the description unseen); "furniture"; then the same with states training never
  showed dropped (`grilled`). With each: the object's field, its states (`sliced`, `open`) and
  where it lies relative to the other slots.
- over the training states, each binding of objects to a template's slots counts as an available
  action or not under each of its descriptions; a binding takes the vote of its most detailed
  description seen at least `MIN_VOTES` times.
- an action on objects the step leaves as they were is kept from the previous state; actions on
  no object (`go west`, `prepare meal`) are the previous state's, changed as the example's change
  changes them (on a move, its new list's: the exits of the room it enters).
- an action on no object that the training states offered exactly where one of the task's objects
  (by its place in the task, the domain's `task_objects`) was carried, in the places they offered
  it, follows that rule (`learnt_task_actions`): `prepare meal` in the kitchen while the recipe's
  first ingredient is carried, whatever the example's own task and items made of it.

Nothing here names a verb or an object: templates and states come from the data (a portable
object is one a state shows carried or takeable: `placeholders.carried_names`).

With `experience.learnt_actions`, a worked example's change is shown to the model as the change
it makes here (`adapted_change`): without its `actions` line and with the actions learnt for the
state it gives, and with each object it moves or changes keeping the query's object's own states
(`with_own_states`: the example's sliced-and-fried pepper taken from the stove does not make the
query's roasted one fried). A reference to it then means that, in training and in prediction alike
(measured: results log, 2026-11-28 and 2026-11-29).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from dreamgym.domain import NO_RULES, Domain
from dreamgym.errors import DreamgymError
from dreamgym.experience.format import NO_CHANGE, applied, state_delta
from dreamgym.placeholders import Placeholders, carried_names
from dreamgym.state import ITEM_SEPARATOR, AbstractState, format_item, item_name, parse_state

MIN_VOTES = 2
# A move's way back is learnt from at least this many returns, and only where every one agrees.
MIN_RETURNS = 2
ACTIONS_LINE = "actions: "  # a delta's actions line: entries added and removed
ACTIONS_REPLACED = "actions ="  # ... or the whole new list
AFFORDANCES_FILE = "affordances.json"
# Per level of description: how much of an object's name it keeps (0: the name ... 4: "furniture"),
# whether states the training data never showed are dropped, and whether a portable object's states
# are any (`ANY_STATES`; only where the binding names furniture too).
LEVELS = (
    (0, False, False),
    (1, False, False),
    (2, False, False),
    (3, False, False),
    (1, False, True),
    (2, False, True),
    (3, False, True),
    (4, False, False),
    (3, True, False),
    (4, True, False),
)
ANY_STATES = "*"
# A task's action (`learnt_task_actions`) is learnt from at least this many distinct training
# states that offer it and as many, in its places, that withhold it, where no state disagrees.
MIN_TASK_STATES = 10


@dataclasses.dataclass(frozen=True)
class Item:
    name: str
    field: str  # inventory or visible
    states: tuple[str, ...]  # sliced, open, ...
    place: tuple[str, str] | None  # ("on", "counter")


def descriptors_of(item: str) -> list[str]:
    """An item's descriptors as written: 'carrot (sliced, on table)' -> ['sliced', 'on table']."""
    name = item_name(item)
    return item[len(name) + 2 : -1].split(", ") if item != name else []


def _is_place(descriptor: str) -> bool:
    return descriptor.startswith(("on ", "in "))


def _place_of(descriptors: Iterable[str]) -> str | None:
    """The descriptor saying where the object lies ('on table'), if any."""
    return next((d for d in descriptors if _is_place(d)), None)


def _order_key(descriptor: str) -> str:
    """What a descriptor's place in the order is learnt by: a place by its relation alone ('on')."""
    return descriptor[:2] if _is_place(descriptor) else descriptor


def items_of(state: AbstractState) -> dict[str, Item]:
    """The objects a state shows, by name."""
    items = {}
    for field in ("inventory", "visible"):
        for text in getattr(state, field):
            descriptors = descriptors_of(text)
            states = tuple(sorted(d for d in descriptors if not _is_place(d)))
            place = _place_of(descriptors)
            where = (place[:2], place[3:]) if place else None
            items[item_name(text)] = Item(item_name(text), field, states, where)
    return items


def template_of(action: str, names: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    """(`put {0} on {1}`, ("carrot", "table")): the objects `action` names (whole names, the
    longest first, not overlapping) replaced by numbered slots; no slots for an action on none."""
    found: list[tuple[int, int, str]] = []
    for name in sorted(names, key=len, reverse=True):
        for match in re.finditer(rf"(?<![\w-]){re.escape(name)}(?![\w-])", action):
            if all(match.end() <= start or match.start() >= end for start, end, _ in found):
                found.append((match.start(), match.end(), name))
    parts, last, slots = [], 0, []
    for start, end, name in sorted(found):
        parts += [_escaped(action[last:start]), f"{{{len(slots)}}}"]
        slots.append(name)
        last = end
    parts.append(_escaped(action[last:]))
    return "".join(parts), tuple(slots)


def _escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def roles_of(state: AbstractState, items: dict[str, Item]) -> dict[str, tuple]:
    """Each object's uses, (template, slot), among the state's actions (`items`: its objects)."""
    roles: dict[str, set] = defaultdict(set)
    for action in state.actions:
        template, slots = template_of(action, items)
        for slot, name in enumerate(slots):
            roles[name].add((template, slot))
    return {name: tuple(sorted(found)) for name, found in roles.items()}


class Affordances:
    """Which object actions a state offers, voted by described bindings of the training states."""

    def __init__(
        self,
        kept: frozenset[str] | None,
        votes: dict[tuple, list[int]] | None = None,
        slot_kinds: dict[tuple[str, int], set] | None = None,
        known_states: set[str] | None = None,
        returns: dict[str, str] | None = None,
        precedes: set[tuple[str, str]] | None = None,
        task_actions: dict[str, tuple[int, tuple[str, ...]]] | None = None,
    ):
        self.kept = kept or frozenset()
        # Learnt with them from the same rows: each move's way back (learnt_returns), which
        # places.py follows.
        self.returns: dict[str, str] = dict(returns or {})
        # (a, b) where an item of the states wrote descriptor a before b (`_order_key`s): the order
        # `with_own_states` writes an object's descriptors in.
        self.precedes: set[tuple[str, str]] = set(precedes or ())
        # action -> (the position in the task of the object it needs carried, the places it is offered
        # in): learnt_task_actions.
        self.task_actions: dict[str, tuple[int, tuple[str, ...]]] = dict(task_actions or {})
        self.votes: dict[tuple, list[int]] = defaultdict(lambda: [0, 0], votes or {})
        self.slot_kinds: dict[tuple[str, int], set] = defaultdict(set, slot_kinds or {})
        self.known_states = set(known_states or ())

    @classmethod
    def learn(cls, states: Iterable[AbstractState], kept: frozenset[str] | None) -> Affordances:
        learnt = cls(kept)
        seen = []
        for state in dict.fromkeys(states):
            items = items_of(state)
            portable, roles = carried_names(state), roles_of(state, items)
            present = set()
            for action in state.actions:
                template, slots = template_of(action, items)
                if slots:
                    for slot, name in enumerate(slots):
                        learnt.slot_kinds[(template, slot)].add(learnt._kind(name, 4, portable, roles))
                    present.add((template, slots))
            learnt.known_states.update(s for item in items.values() for s in item.states)
            for text in (*state.visible, *state.inventory):
                keys = [_order_key(d) for d in descriptors_of(text)]
                learnt.precedes.update(itertools.combinations(keys, 2))
            seen.append((items, portable, roles, present))
        for items, portable, roles, present in seen:
            for template, binding in learnt._bindings(items, portable, roles):
                for description in learnt._descriptions(template, binding, items, portable, roles):
                    learnt.votes[description][0 if (template, binding) in present else 1] += 1
        return learnt

    def predict(self, state: AbstractState, previous: AbstractState) -> set[str]:
        """The object actions of `state` (its own actions ignored), one step after `previous`."""
        items, before = items_of(state), items_of(previous)
        # Portable: carried or takeable in the previous state, carried now, or new and lying on or
        # in something (a new piece of furniture lies nowhere).
        carried_before = carried_names(previous)
        portable = carried_before | {
            name
            for name, item in items.items()
            if item.field == "inventory" or (name not in before and name not in self.kept and item.place)
        }
        roles = roles_of(previous, before)
        moved = state.location != previous.location
        unchanged = {name for name, item in items.items() if not moved and before.get(name) == item}
        offered = set() if moved else set(previous.actions)
        seen_before: dict[tuple, set[bool]] | None = None  # the previous state's uses of its furniture
        out = set()
        for template, binding in self._bindings(items, portable, roles):
            action = template.format(*binding)
            if all(name in unchanged for name in binding):
                if action in offered:
                    out.add(action)
                continue
            for description in self._descriptions(template, binding, items, portable, roles):
                present, absent = self.votes.get(description, (0, 0))
                if present + absent >= MIN_VOTES:
                    kept_use = None
                    if LEVELS[description[0]][0] == 4 and not moved:
                        if seen_before is None:
                            seen_before = self._uses(previous, before, carried_before, roles)
                        kept_use = self._kept_use(description, template, binding, items, unchanged, seen_before)
                    if kept_use if kept_use is not None else present > absent:
                        out.add(action)
                    break
        return out

    def _use_key(self, template: str, binding: tuple[str, ...], slot: int, items: dict[str, Item]) -> tuple:
        """A use of the furniture in `slot` of `binding`: the template, that slot, and each other
        object as the kind it is to the votes (its name if kept, else "object"), where it is (carried
        or seen) and whether it lies on or in that furniture."""
        furniture = binding[slot]
        others = tuple(
            (
                position,
                name if name in self.kept else "object",
                items[name].field,
                items[name].place[0] if items[name].place and items[name].place[1] == furniture else None,
            )
            for position, name in enumerate(binding)
            if position != slot
        )
        return template, slot, furniture, others

    def _uses(self, previous: AbstractState, before: dict[str, Item], portable: set[str], roles: dict):
        """For each use (`_use_key`) of the previous state's furniture, whether it was offered."""
        offered, seen = set(previous.actions), defaultdict(set)
        for template, binding in self._bindings(before, portable, roles):
            for slot, name in enumerate(binding):
                if name not in portable:
                    seen[self._use_key(template, binding, slot, before)].add(template.format(*binding) in offered)
        return seen

    def _kept_use(
        self,
        description: tuple,
        template: str,
        binding: tuple[str, ...],
        items: dict[str, Item],
        unchanged: set[str],
        seen_before: dict[tuple, set[bool]],
    ) -> bool | None:
        """Where the votes know a piece of furniture of `binding` only as "furniture" (none of its
        more detailed descriptions was seen) and it is as it was a step before: whether the
        previous state offered the same use of it (`_use_key`: the same template and slot, with
        objects of the same kinds, carried or seen, on it or not), where it always did or never did;
        else None, and the votes decide. Furniture in general is put on, not cooked with, so
        furniture no training game shows (a BBQ) lost its cooking after each use, though the step
        before had offered it (measured: results log, 2026-11-29)."""
        found = set()
        for slot, name in enumerate(binding):
            if name in unchanged and description[2 + slot][0] == "furniture":
                found |= seen_before.get(self._use_key(template, binding, slot, items), {True, False})
        return next(iter(found)) if len(found) == 1 else None

    def _kind(self, name: str, detail: int, portable: set[str], roles: dict) -> object:
        if detail == 0:
            return name
        if name in portable or detail == 1:
            return name if name in self.kept else "object"
        if detail == 2:
            return "furniture:" + name.split()[-1]
        if detail == 3:
            return ("furniture", roles.get(name, ()))
        return "furniture"

    def _descriptions(self, template: str, binding: tuple[str, ...], items, portable, roles) -> list[tuple]:
        out = []
        for level, (detail, known_only, any_portable_states) in enumerate(LEVELS):
            if any_portable_states and all(name in portable for name in binding):
                continue
            slots = []
            for name in binding:
                item = items[name]
                states = tuple(s for s in item.states if s in self.known_states) if known_only else item.states
                if any_portable_states and name in portable:
                    states = ANY_STATES
                where = None
                if item.place:
                    other = item.place[1]
                    where = (
                        item.place[0],
                        binding.index(other) if other in binding else self._kind(other, detail, portable, roles),
                    )
                slots.append((self._kind(name, detail, portable, roles), item.field, states, where))
            out.append((level, template, *slots))
        return out

    def _bindings(self, items, portable, roles):
        """(template, objects) for every template and every objects of the kinds seen in its slots."""
        by_template: dict[str, int] = defaultdict(int)
        for template, slot in self.slot_kinds:
            by_template[template] = max(by_template[template], slot + 1)
        for template, slot_count in sorted(by_template.items()):
            pools = [
                [name for name in items if self._kind(name, 4, portable, roles) in self.slot_kinds[(template, slot)]]
                for slot in range(slot_count)
            ]
            for binding in itertools.product(*pools):
                if len(set(binding)) == slot_count:
                    yield template, binding

    def save(self, path: str | Path) -> None:
        data = {
            "kept": sorted(self.kept),
            "votes": [[description, counts] for description, counts in self.votes.items()],
            "slot_kinds": [
                [template, slot, sorted(kinds, key=str)] for (template, slot), kinds in self.slot_kinds.items()
            ],
            "known_states": sorted(self.known_states),
            "returns": self.returns,
            "precedes": sorted(self.precedes),
            "task_actions": self.task_actions,
            "levels": LEVELS,
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")  # whole or not at all
        partial.write_text(json.dumps(data))
        partial.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> Affordances:
        data = json.loads(Path(path).read_text())
        if "levels" not in data:
            raise DreamgymError(
                f"{path} was saved before 2026-11-29, without its levels: train the experience model again "
                "with dreamgym run"
            )
        # A vote's description starts with its level's index: into the levels it was saved with.
        now = {tuple(level): index for index, level in enumerate(LEVELS)}
        index_now = [now.get(tuple(level)) for level in data["levels"]]
        votes = {}
        for description, counts in data["votes"]:
            if index_now[description[0]] is not None:
                votes[(index_now[description[0]], *_tupled(description[1:]))] = counts
        return cls(
            frozenset(data["kept"]),
            votes,
            {(template, slot): {_tupled(kind) for kind in kinds} for template, slot, kinds in data["slot_kinds"]},
            set(data["known_states"]),
            data["returns"],
            {tuple(pair) for pair in data["precedes"]},
            {  # saved before the tasks' actions were learnt: none
                action: (position, tuple(places)) for action, (position, places) in data.get("task_actions", {}).items()
            },
        )

    def ordered(self, descriptors: Iterable[str], added: str) -> list[str]:
        """`descriptors` with `added` written before the first one the states always wrote after
        it; at the end where none is."""
        out = list(descriptors)
        key = _order_key(added)
        for position, descriptor in enumerate(out):
            pair = (key, _order_key(descriptor))
            if pair in self.precedes and pair[::-1] not in self.precedes:
                out.insert(position, added)
                return out
        return [*out, added]


def learnt_returns(rows: Iterable[Mapping]) -> dict[str, str]:
    """For each move of the transition rows (a step into another location), the move that led back,
    where the training episodes made that return at least `MIN_RETURNS` times, always the same way."""
    moves_by_episode: dict[str, list[tuple[int, str, str, str]]] = defaultdict(list)
    for row in rows:
        here, there = parse_state(row["state"]).location, parse_state(row["next_state"]).location
        if here != there:
            moves_by_episode[row["trajectory_id"]].append((row["step"], here, row["action"], there))
    votes: dict[str, Counter] = defaultdict(Counter)
    for moves in moves_by_episode.values():
        made: dict[tuple[str, str], str] = {}  # (from, to) -> the action that went there
        for _, here, action, there in sorted(moves):
            went = made.get((there, here))
            if went is not None:
                votes[went][action] += 1
                votes[action][went] += 1
            made[(here, there)] = action
    return {
        action: next(iter(back))
        for action, back in votes.items()
        if len(back) == 1 and back.total() >= MIN_RETURNS  # one way back, seen often enough
    }


def learnt_task_actions(rows: Iterable[Mapping], domain: Domain) -> dict[str, tuple[int, tuple[str, ...]]]:
    """The actions on no object whose offer follows the task: for each, the position in the task
    (`domain.task_objects` of the row's instruction) of the object it needs carried, and the places
    it is offered in, where the training states offered it exactly there: in one of those places
    with that object carried, never elsewhere or without it (at least `MIN_TASK_STATES` distinct
    states each way, none against). tw-cooking offers `prepare meal` in the kitchen while the
    recipe's first ingredient is carried; copied from an example whose taken item was its own
    recipe's first, it was offered and withheld wrongly (measured: results log, 2026-11-29)."""
    seen: Counter = Counter()  # (place, which task objects are carried, actions on no object)
    for instruction, text in dict.fromkeys(
        (row.get("instruction") or "", row[column]) for row in rows for column in ("state", "next_state")
    ):
        task = domain.task_objects(instruction) if instruction else ()
        if not task:
            continue
        state = parse_state(text)
        items = items_of(state)
        plain = frozenset(actions_on_no_object(state.actions, items))
        carried = tuple(name in items and items[name].field == "inventory" for name in task)
        seen[(state.location, carried, plain)] += 1
    places: dict[str, set[str]] = defaultdict(set)
    for place, _, plain in seen:
        for action in plain:
            places[action].add(place)
    longest = max((len(carried) for _, carried, _ in seen), default=0)
    # The states whose task has an object at each position.
    told_at = [
        [(place, carried, plain, count) for (place, carried, plain), count in seen.items() if len(carried) > position]
        for position in range(longest)
    ]
    learnt = {}
    for action, offered_in in sorted(places.items()):
        for position, told in enumerate(told_at):
            if any(
                (action in plain) != (carried[position] and place in offered_in) for place, carried, plain, _ in told
            ):
                continue
            offers = sum(count for _, _, plain, count in told if action in plain)
            withholds = sum(count for place, _, plain, count in told if place in offered_in and action not in plain)
            if offers >= MIN_TASK_STATES and withholds >= MIN_TASK_STATES:
                learnt[action] = (position, tuple(sorted(offered_in)))
                break
    return learnt


def learnt_from_rows(rows: Iterable[dict], kept: frozenset[str] | None, domain: Domain = NO_RULES) -> Affordances:
    """Affordances learnt from the states of transition rows (`dreamgym.data.schema`), with the
    ways back of their moves (`learnt_returns`) and, by `domain`'s rules, the actions that follow
    the task (`learnt_task_actions`)."""
    rows = list(rows)
    learnt = Affordances.learn((parse_state(row[column]) for row in rows for column in ("state", "next_state")), kept)
    learnt.returns = learnt_returns(rows)
    learnt.task_actions = learnt_task_actions(rows, domain)
    return learnt


def saved_beside(examples_path: str | Path) -> Path:
    """Where the affordances the examples in `examples_path` were built with are saved."""
    return Path(examples_path).with_suffix(".affordances.json")


def _tupled(value):
    """JSON's lists back to the tuples the votes are keyed with."""
    return tuple(_tupled(each) for each in value) if isinstance(value, list) else value


def actions_on_no_object(actions: Iterable[str], names: Iterable[str]) -> set[str]:
    """Those of `actions` that name none of the objects `names` (`go west`, `prepare meal`)."""
    return {action for action in actions if not template_of(action, names)[1]}


def with_learnt_actions(
    previous: AbstractState,
    state: AbstractState,
    actions_line: str,
    affordances: Affordances,
    task_objects: tuple[str, ...] = (),
) -> AbstractState:
    """`state` with the object actions learnt for it, and the previous state's actions on no object
    changed as `actions_line` (a delta's `actions` line, or "" where it has none) changes them: its
    entries added and removed, or, where it replaces the list (`actions = ...`, written on a move),
    that list's actions on no object (the exits of the new room). An action on an object the step
    used up (`drop carrot` once `prepare meal` took the carrot) is an action on an object, gone with
    it: kept as one on no object, it stayed wherever the example's own change did not remove it
    (measured: results log, 2026-11-29). With the task's objects (`task_objects`, in its order), an action that follows
    the task (`Affordances.task_actions`) is offered where its rule says, and nowhere else."""
    items = items_of(state)
    if actions_line.startswith(ACTIONS_REPLACED):
        listed = actions_line[len(ACTIONS_REPLACED) :].strip()
        plain = actions_on_no_object(listed.split(ITEM_SEPARATOR) if listed else (), items)
    else:
        named = items_of(previous) | items
        plain = actions_on_no_object(previous.actions, named)
        entries = actions_line[len(ACTIONS_LINE) :].split(ITEM_SEPARATOR) if actions_line else []
        for entry in entries:
            if len(entry) > 1 and not template_of(entry[1:], named)[1]:
                (plain.add if entry[0] == "+" else plain.discard)(entry[1:])
    carried = {name for name, item in items.items() if item.field == "inventory"}
    for action, (position, places) in affordances.task_actions.items():
        if position < len(task_objects):
            offered = task_objects[position] in carried and state.location in places
            (plain.add if offered else plain.discard)(action)
    return dataclasses.replace(state, actions=tuple(sorted(plain | affordances.predict(state, previous))))


def _by_name(state: AbstractState) -> dict[str, list[str]]:
    """The descriptors of each object of `state` whose name only one item has."""
    items = [*state.visible, *state.inventory]
    names = Counter(item_name(item) for item in items)
    return {item_name(item): descriptors_of(item) for item in items if names[item_name(item)] == 1}


def with_own_states(change: str, made_in: AbstractState, shown: AbstractState, affordances: Affordances) -> str:
    """`change`, which a worked example made in its own state `made_in`, with each object it writes
    anew (`+item` in `visible` or `inventory`) described as the query's object of that name
    (in `shown`) becomes: the example's object's states it lost are dropped, those it gained are
    added, the rest are the query's own; its place is the example's new one where the example
    moved it, else the query's. Copied as written, an example's object put on the stove gives the
    query's diced, roasted tomato as `tomato (on stove)`, the states of the example's plain one."""
    theirs, ours = _by_name(made_in), _by_name(shown)
    lines = []
    for line in change.split("\n"):
        field, _, entries = line.partition(": ")
        if field in ("visible", "inventory") and entries:
            line = f"{field}: " + ITEM_SEPARATOR.join(
                _own_states(entry, theirs, ours, affordances) for entry in entries.split(ITEM_SEPARATOR)
            )
        lines.append(line)
    return "\n".join(lines)


def _own_states(entry: str, theirs: dict[str, list[str]], ours: dict[str, list[str]], affordances) -> str:
    name = item_name(entry[1:])
    if not entry.startswith("+") or name not in theirs or name not in ours or theirs[name] == ours[name]:
        return entry
    before, after = theirs[name], descriptors_of(entry[1:])
    place = _place_of(after)
    if place == _place_of(before):  # the example did not move it
        place = _place_of(ours[name])
    lost = {d for d in before if d not in after}
    states = [d for d in ours[name] if not _is_place(d) and d not in lost]
    for gained in (d for d in after if not _is_place(d) and d not in before and d not in states):
        states = affordances.ordered(states, gained)
    return "+" + format_item(name, affordances.ordered(states, place) if place else states)


def adapted_change(
    shown: AbstractState,
    change: str,
    names: Placeholders,
    affordances: Affordances,
    made_in: AbstractState | None = None,
    task_objects: tuple[str, ...] = (),
) -> str:
    """The change a worked example makes in the query's state `shown` (in the prompt's names, as are
    the query's `task_objects`, which decide the actions that follow the task): its
    objects' states carried over (`with_own_states`, given the example's own state `made_in`);
    where it applies without its `actions` line, that with the learnt actions; else `change` as it
    is (one that does not fit, which no reference may name). The actions are learnt even where the whole
    change applies: additions apply anywhere, so an example's actions from another world fit and
    mislead (learning them always beat learning them only where the change does not apply:
    results log, 2026-11-28)."""
    lines = (change if made_in is None else with_own_states(change, made_in, shown, affordances)).split("\n")
    actions_line = next((line for line in lines if line.startswith((ACTIONS_LINE, ACTIONS_REPLACED))), "")
    loose = applied(
        dataclasses.replace(shown, actions=()),
        "\n".join(line for line in lines if line != actions_line) or NO_CHANGE,
    )
    if loose is None:
        return change
    real = with_learnt_actions(
        names.backward.abstract(shown),
        names.backward.abstract(loose),
        names.backward.text(actions_line),
        affordances,
        tuple(names.backward.text(name) for name in task_objects),
    )
    return state_delta(shown, names.forward.abstract(real))
