"""Actions learnt from objects: how far a copier of the top worked example gets when the available
actions of its next state are computed from the state's objects instead of copied (a measurement
and a prototype for the experience model, not a test).

    .venv/bin/python benchmarks/affordances.py --games <held-out games> [<more games> ...] \
        [--params params.yaml] [--model dreamgym-experience] [--k 1] [--json out.json]

Most wrong copies differ from the game's next state only in its `actions` line: taking an object
adds the actions this world allows on it (cut it with the knife carried here, put it on this
room's furniture), which another game's example lists for its own world. Those actions follow from
the objects a state shows, the same way in every game, so they can be learnt from the buffer:

- an action that names objects of its state is a template with slots (`put {0} on {1}`); each slot
  is described by its object at decreasing detail: its name, the name if every game has it (the
  placeholders' kept names) else "object", the furniture's head noun (`door` of `sliding patio
  door`), the furniture's roles in the current state's actions (what a new stove-like object is
  used for), "furniture"; with its field, its states (`sliced`, `open`) and where it lies relative
  to the other slots. States the training data never showed are dropped at the last level.
- counting, over the training states, how often each description is an available action and how
  often not gives a vote; a binding takes the vote of its most detailed description seen at least
  twice.
- an action on objects the step leaves as they were is kept from the current state (its roles are
  known there); actions on no object (`go west`, `prepare meal`) are the current state's with the
  example's change to them.

For each set this prints (1) how often the learnt actions of the game's own next state are exactly
its object actions (from the other fields and the current state), and (2) the exact next states of
"no model" (the top-ranked example's change applied, as `dreamgym experience ablate` does) beside
the same copier that applies the example's change without its `actions` line where the whole
change does not apply or gives another state, and takes the actions from (1); with `--k 5`, also
the share a perfect chooser among the 5 ranked examples would reach, with and without learnt actions.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from common import machine, model_setup

from dreamgym.buffer.embeddings import Encoder
from dreamgym.buffer.migrations import open_migrated
from dreamgym.data.collect import collect_held_out
from dreamgym.data.schema import read_transitions
from dreamgym.experience.examples import build_examples, queries_of
from dreamgym.experience.fidelity import foreseeable
from dreamgym.experience.format import NO_CHANGE, applied, example_changes
from dreamgym.experience.generate import trained_kept_names
from dreamgym.placeholders import Placeholders, carried_names
from dreamgym.state import AbstractState, item_name, parse_state

MIN_VOTES = 2
ACTIONS_LINE = "actions: "


@dataclasses.dataclass(frozen=True)
class Item:
    name: str
    field: str  # "inventory" or "visible"
    states: tuple[str, ...]  # sliced, open, ...
    place: tuple[str, str] | None  # ("on", "counter")


def items_of(state: AbstractState) -> dict[str, Item]:
    items = {}
    for field in ("inventory", "visible"):
        for text in getattr(state, field):
            name = item_name(text)
            descriptors = text[len(name) + 2 : -1].split(", ") if text != name else []
            states = tuple(sorted(d for d in descriptors if not d.startswith(("on ", "in "))))
            place = next(((d[:2], d[3:]) for d in descriptors if d.startswith(("on ", "in "))), None)
            items[name] = Item(name, field, states, place)
    return items


def template_of(action: str, names) -> tuple[str, tuple[str, ...]]:
    """`put {0} on {1}`, ("carrot", "table"): the objects an action names (whole names, longest
    first, not overlapping) replaced by numbered slots."""
    found: list[tuple[int, int, str]] = []
    for name in sorted(names, key=len, reverse=True):
        for match in re.finditer(rf"(?<![\w-]){re.escape(name)}(?![\w-])", action):
            if all(match.end() <= start or match.start() >= end for start, end, _ in found):
                found.append((match.start(), match.end(), name))
    parts, last, slots = [], 0, []
    for start, end, name in sorted(found):
        parts += [action[last:start].replace("{", "{{").replace("}", "}}"), f"{{{len(slots)}}}"]
        slots.append(name)
        last = end
    parts.append(action[last:].replace("{", "{{").replace("}", "}}"))
    return "".join(parts), tuple(slots)


def roles_of(state: AbstractState) -> dict[str, frozenset]:
    """Each object's (template, slot) uses among the state's actions."""
    roles = defaultdict(set)
    for action in state.actions:
        template, slots = template_of(action, items_of(state))
        for slot, name in enumerate(slots):
            roles[name].add((template, slot))
    return {name: frozenset(found) for name, found in roles.items()}


class Affordances:
    """Which object actions a state allows, voted by descriptions of the training states' bindings."""

    # Per level: how much of an object's name a description keeps (0: all ... 4: "furniture"),
    # and whether states the training data never showed are dropped.
    LEVELS = ((0, False), (1, False), (2, False), (3, False), (4, False), (3, True), (4, True))

    def __init__(self, kept: frozenset[str]):
        self.kept = kept
        self.votes: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        self.slot_kinds: dict[tuple[str, int], set] = defaultdict(set)
        self.known_states: set[str] = set()
        self._templates: set[tuple[str, int]] = set()  # (template, slot count)

    def _kind(self, name: str, level: int, portable: set[str], roles: dict) -> object:
        if level == 0:
            return name
        if name in portable or level == 1:
            return name if name in self.kept else "object"
        if level == 2:
            return "furniture:" + name.split()[-1]
        if level == 3:
            return ("furniture", roles.get(name, frozenset()))
        return "furniture"

    def _descriptions(self, template, binding, items, portable, roles) -> list[tuple]:
        out = []
        for level, (detail, known_only) in enumerate(self.LEVELS):
            slots = []
            for name in binding:
                item = items[name]
                states = tuple(s for s in item.states if s in self.known_states) if known_only else item.states
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
        for template, slot_count in sorted(self._templates):
            pools = [
                [name for name in items if self._kind(name, 4, portable, roles) in self.slot_kinds[(template, slot)]]
                for slot in range(slot_count)
            ]
            for binding in itertools.product(*pools):
                if len(set(binding)) == slot_count:
                    yield template, binding

    def learn(self, states: list[AbstractState]) -> Affordances:
        seen = []
        for state in states:
            items, portable, roles = items_of(state), carried_names(state), roles_of(state)
            present = set()
            for action in state.actions:
                template, slots = template_of(action, items)
                if slots:
                    self._templates.add((template, len(slots)))
                    for slot, name in enumerate(slots):
                        self.slot_kinds[(template, slot)].add(self._kind(name, 4, portable, roles))
                    present.add((template, slots))
            self.known_states.update(s for item in items.values() for s in item.states)
            seen.append((items, portable, roles, present))
        for items, portable, roles, present in seen:
            for template, binding in self._bindings(items, portable, roles):
                for description in self._descriptions(template, binding, items, portable, roles):
                    self.votes[description][0 if (template, binding) in present else 1] += 1
        return self

    def predict(self, state: AbstractState, previous: AbstractState) -> set[str]:
        """The object actions of `state` (its actions ignored), a step after `previous`."""
        items = items_of(state)
        before = items_of(previous)
        # Portable: what the previous state shows carried or takeable, what is carried now, and a
        # new object lying on or in something.
        portable = carried_names(previous) | set(
            name
            for name, item in items.items()
            if item.field == "inventory" or (name not in before and name not in self.kept and item.place)
        )
        roles = roles_of(previous)
        moved = state.location != previous.location
        unchanged = {name for name, item in items.items() if not moved and before.get(name) == item}
        kept_actions = {action for action in previous.actions if not moved}
        out = set()
        for template, binding in self._bindings(items, portable, roles):
            action = template.format(*binding)
            if all(name in unchanged for name in binding):
                if action in kept_actions:
                    out.add(action)
                continue
            for description in self._descriptions(template, binding, items, portable, roles):
                present, absent = self.votes.get(description, (0, 0))
                if present + absent >= MIN_VOTES:
                    if present > absent:
                        out.add(action)
                    break
        return out


def with_actions(previous: AbstractState, state: AbstractState, change_to_plain: str, affordances) -> AbstractState:
    """`state` with the learnt object actions and the previous state's actions on no object,
    changed as `change_to_plain` (an `actions:` line's entries) changes them."""
    items = items_of(state)
    plain = {
        a for a in (previous.actions if state.location == previous.location else ()) if not template_of(a, items)[1]
    }
    for entry in change_to_plain.split("; ") if change_to_plain else []:
        if template_of(entry[1:], items)[1]:
            continue
        (plain.add if entry[0] == "+" else plain.discard)(entry[1:])
    return dataclasses.replace(state, actions=tuple(sorted(plain | affordances.predict(state, previous))))


def without_actions(change: str) -> str:
    return "\n".join(line for line in change.split("\n") if not line.startswith(ACTIONS_LINE)) or NO_CHANGE


def measure(rows, examples, queries, kept, affordances) -> dict:
    counts = {"all": Counter(), "foreseeable": Counter()}
    for row, example, query in zip(rows, examples, queries):
        state, real_next = parse_state(row["state"]), parse_state(row["next_state"])
        object_actions = {a for a in real_next.actions if template_of(a, items_of(real_next))[1]}
        learnt = affordances.predict(dataclasses.replace(real_next, actions=()), state)
        # The example's change is in the prompt's placeholders: applied there, named back.
        names = Placeholders.of(kept, row["action"], [state])
        shown = names.forward.abstract(state)
        changes = example_changes(example.prompt)
        top = applied(shown, changes[0]) if changes else None
        copied = names.backward.abstract(top) if top is not None else None
        relaxed = [copied]  # what each of the k examples gives, actions learnt where needed
        for number, change in enumerate(changes):
            whole = applied(shown, change)
            whole = names.backward.abstract(whole) if whole is not None else None
            if number:
                relaxed.append(whole)
            if whole != real_next:
                loose = applied(dataclasses.replace(shown, actions=()), without_actions(change))
                if loose is not None:
                    line = next((x for x in change.split("\n") if x.startswith(ACTIONS_LINE)), ACTIONS_LINE)
                    plain_change = names.backward.text(line[len(ACTIONS_LINE) :])
                    relaxed[number] = with_actions(state, names.backward.abstract(loose), plain_change, affordances)
        for part in ("all", "foreseeable") if foreseeable(query, real_next) else ("all",):
            found = counts[part]
            found["transitions"] += 1
            found["object actions learnt exactly"] += learnt == object_actions
            found["no model: top example's change"] += copied == real_next
            found["top example's change, actions learnt"] += relaxed[0] == real_next
            found[f"any of the top {len(changes)}, actions learnt"] += real_next in relaxed or state == real_next
            found[f"any of the top {len(changes)} as they are, or no change"] += state == real_next or any(
                applied(shown, change) is not None and names.backward.abstract(applied(shown, change)) == real_next
                for change in changes
            )
    return {
        part: {
            "transitions": c["transitions"],
            **{k: round(v / c["transitions"], 4) for k, v in c.items() if k != "transitions"},
        }
        for part, c in counts.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=Path, nargs="+", required=True)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--model", default="dreamgym-experience")
    parser.add_argument("--k", type=int, default=1, help="worked examples ranked per transition (a chooser's ceiling)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    setup = model_setup(args.params, args.model)
    config = setup.config
    kept = trained_kept_names(setup.model_dir)
    training = read_transitions(setup.project / config.paths.data_dir / "trajectories" / "offline.parquet").to_pylist()
    states = list(dict.fromkeys(parse_state(text) for row in training for text in (row["state"], row["next_state"])))
    affordances = Affordances(kept).learn(states)
    report = {"model": setup.model_label, "training states": len(states), "machine": machine(), "sets": {}}
    for games in args.games:
        out = setup.project / config.paths.outputs_dir / "experience" / f"eval-{games.resolve().name}.parquet"
        rows = read_transitions(collect_held_out(games, out, config)).to_pylist()
        rows.sort(key=lambda row: (row["trajectory_id"], row["step"]))
        with open_migrated(setup.run_dir, config.buffer) as database:
            examples = build_examples(
                database,
                Encoder(config.buffer.encoder),
                rows,
                dataclasses.replace(config.experience, neighbours=args.k),
                config.buffer.ef_search,
                kept=kept,
            )
        report["sets"][str(games)] = measure(
            rows, examples, queries_of(rows, config.experience.history), kept, affordances
        )
        print(games, json.dumps(report["sets"][str(games)], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
