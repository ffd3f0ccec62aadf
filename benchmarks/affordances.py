"""Actions learnt from objects: how far a copier of the top worked example gets when the available
actions of its next state are computed from the state's objects instead of copied (a measurement
and a prototype for the experience model, not a test).

    .venv/bin/python benchmarks/affordances.py --games <held-out games> [<more games> ...] \
        [--params params.yaml] [--model dreamgym-experience] [--k 1] [--json out.json]

Most wrong copies differ from the game's next state only in its `actions` line: taking an object
adds the actions this world allows on it (cut it with the knife carried here, put it on this
room's furniture), which another game's example lists for its own world. Those actions follow from
the objects a state shows, the same way in every game, so they are learnt from the buffer's states
(here: the project's offline data).

The learner is `dreamgym/experience/affordances.py` (its docstring says how it works; with
`experience.learnt_actions` the model is shown each example's change as `adapted_change` makes it).

For each set this prints (1) how often the learnt actions of the game's own next state are exactly
its object actions (from its other fields and the current state), and (2) the exact next states of
"no model" (the top-ranked example's change applied, as `dreamgym experience ablate` does) beside
the same copier with learnt actions under three rules: where the whole change is not the answer
(a ceiling: it looks at the answer), where it does not apply, and always (`adapted_change`, what
the model is shown); with `--k 5`, the same for a perfect chooser among the 5 ranked examples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter
from pathlib import Path

from common import machine, model_setup

from dreamgym.buffer.embeddings import Encoder
from dreamgym.buffer.migrations import open_migrated
from dreamgym.data.collect import collect_held_out
from dreamgym.data.schema import read_transitions
from dreamgym.domain import named_domain
from dreamgym.experience.affordances import (
    adapted_change,
    items_of,
    learnt_from_rows,
    template_of,
)
from dreamgym.experience.examples import build_examples, queries_of
from dreamgym.experience.fidelity import foreseeable
from dreamgym.experience.format import applied, example_changes
from dreamgym.experience.generate import trained_kept_names
from dreamgym.placeholders import Placeholders
from dreamgym.state import parse_state


def named_back(names: Placeholders, predicted):
    return names.backward.abstract(predicted) if predicted is not None else None


def _top(found: list):
    return found[0] if found else None


def measure(rows, examples, queries, kept, affordances, domain) -> dict:
    counts = {"all": Counter(), "foreseeable": Counter()}
    for row, example, query in zip(rows, examples, queries):
        state, real_next = parse_state(row["state"]), parse_state(row["next_state"])
        object_actions = {a for a in real_next.actions if template_of(a, items_of(real_next))[1]}
        learnt = affordances.predict(dataclasses.replace(real_next, actions=()), state)
        # The examples' changes are in the prompt's placeholders: applied there, named back. The
        # names come from the current state alone (no peek at the next).
        names = Placeholders.of(kept, row["action"], [state])
        shown = names.forward.abstract(state)
        changes = example_changes(example.prompt)
        task = domain.task_objects(names.forward.text(row["instruction"]))

        copies = [named_back(names, applied(shown, change)) for change in changes]
        adapted = [
            named_back(names, applied(shown, adapted_change(shown, change, names, affordances, task_objects=task)))
            for change in changes
        ]
        # As they are where they apply (the rule `adapted_change` does not follow: measured against it).
        unfit = [copy if copy is not None else other for copy, other in zip(copies, adapted)]
        # What each example gives where its whole change is not the answer: the learnt actions.
        best = [copy if copy == real_next else other for copy, other in zip(copies, adapted)]
        for part in ("all", "foreseeable") if foreseeable(query, real_next) else ("all",):
            found = counts[part]
            found["transitions"] += 1
            found["object actions learnt exactly"] += learnt == object_actions
            found["no model: top example's change"] += _top(copies) == real_next
            found["top example: actions learnt where the change is not the answer"] += _top(best) == real_next
            found["top example: actions learnt where the change does not apply"] += _top(unfit) == real_next
            found["top example: actions always learnt (as the model is shown)"] += _top(adapted) == real_next
            found[f"any of the top {len(changes)} as they are, or no change"] += (
                state == real_next or real_next in copies
            )
            found[f"any of the top {len(changes)} as the model is shown, or no change"] += (
                state == real_next or real_next in adapted
            )
            found[f"any of the top {len(changes)}, actions learnt where needed, or no change"] += (
                state == real_next or real_next in best
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
    training = setup.training_rows()
    domain = named_domain(config.experience.domain)
    affordances = learnt_from_rows(training, kept, domain)
    report = {"model": setup.model_label, "training rows": len(training), "machine": machine(), "sets": {}}
    for games in args.games:
        out = setup.project / config.paths.outputs_dir / "experience" / f"eval-{games.resolve().name}.parquet"
        rows = read_transitions(collect_held_out(games, out, config)).to_pylist()
        rows.sort(key=lambda row: (row["trajectory_id"], row["step"]))
        with open_migrated(setup.run_dir, config.buffer) as database:
            examples = build_examples(
                database,
                Encoder(config.buffer.encoder),
                rows,
                # the examples' changes as they are: `measure` adapts them with the training's actions
                dataclasses.replace(config.experience, neighbours=args.k, learnt_actions=False),
                config.buffer.ef_search,
                kept=kept,
            )
        report["sets"][str(games)] = measure(
            rows, examples, queries_of(rows, config.experience.history), kept, affordances, domain
        )
        print(games, json.dumps(report["sets"][str(games)], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
