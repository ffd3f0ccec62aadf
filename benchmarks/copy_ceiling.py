"""How far copying a worked example can go: the share of transitions whose game change is one of
the top-k ranked examples' (a measurement, not a test).

    .venv/bin/python benchmarks/copy_ceiling.py --games <held-out games> [--k 5] \
        [--params params.yaml] [--model dreamgym-experience] [--json out.json]

Collects one episode per game as `dreamgym experience eval` does, retrieves and ranks each
transition's worked examples as the experience model's training examples do (the model's kept
names, the configured pool and ranking), with k examples instead of the configured number, and
counts how the training completion would give the next state: the i-th example named (the first
whose change, applied here, gives the game's next state), `no change`, or written out because no
example of the k fits. "Example 1" plus "no change" is what a copier of the top example can reach;
the other examples are what a model choosing among k could add; "written out" is what only a model
that writes changes can get right.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections import Counter
from pathlib import Path

from common import machine, model_setup

from dreamgym.buffer.embeddings import Encoder
from dreamgym.buffer.migrations import open_migrated
from dreamgym.data.collect import collect_held_out
from dreamgym.data.schema import read_transitions
from dreamgym.domain import named_domain
from dreamgym.experience.affordances import learnt_from_rows
from dreamgym.experience.examples import build_examples, queries_of
from dreamgym.experience.fidelity import foreseeable
from dreamgym.experience.format import NO_CHANGE, SAME_AS
from dreamgym.experience.generate import trained_kept_names
from dreamgym.state import parse_state


def given_as(completion: str) -> str:
    """How a training completion gives its next state: `example i`, `no change` or `written out`."""
    body = completion.split("<next_state>\n", 1)[1]
    named = re.match(SAME_AS.format(r"(\d+)"), body)
    if named:
        return f"example {named.group(1)}"
    return "no change" if body.startswith(NO_CHANGE) else "written out"


def shares(counts: Counter) -> dict:
    total = sum(counts.values())
    return {"transitions": total, **{key: counts[key] / total for key in sorted(counts)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=Path, required=True)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--model", default="dreamgym-experience")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    setup = model_setup(args.params, args.model)
    config = setup.config
    out = setup.project / config.paths.outputs_dir / "experience" / f"eval-{args.games.resolve().name}.parquet"
    rows = read_transitions(collect_held_out(args.games, out, config)).to_pylist()
    rows.sort(key=lambda row: (row["trajectory_id"], row["step"]))
    settings = dataclasses.replace(config.experience, neighbours=args.k)
    kept = trained_kept_names(setup.model_dir)
    training = setup.training_rows()
    with open_migrated(setup.run_dir, config.buffer) as database:
        examples = build_examples(
            database,
            Encoder(config.buffer.encoder),
            rows,
            settings,
            config.buffer.ef_search,
            kept=kept,
            # as the model's training examples show them: with the actions learnt from the training
            # rows (not from these evaluation rows, which build_examples would otherwise learn from)
            affordances=learnt_from_rows(training, kept, named_domain(settings.domain))
            if settings.adapts_examples
            else None,
        )
    # build_examples sorts as above, so example i is row i.
    queries = queries_of(rows, config.experience.history)
    counts = {"all": Counter(), "foreseeable": Counter()}
    for row, query, example in zip(rows, queries, examples):
        way = given_as(example.completion)
        counts["all"][way] += 1
        if foreseeable(query, parse_state(row["next_state"])):
            counts["foreseeable"][way] += 1
    report = {
        "model": setup.model_label,
        "games": str(args.games),
        "k": args.k,
        "machine": machine(),
        **{part: shares(found) for part, found in counts.items()},
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
