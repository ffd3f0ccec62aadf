"""Where the experience model's next states go wrong, by move and by field (a measurement, not a test).

    .venv/bin/python benchmarks/experience_failures.py --games <held-out games> \
        [--params params.yaml] [--model dreamgym-experience] [--json out.json] [--show 3]

Collects one episode per game as `dreamgym experience eval` does (the data's behaviour policy,
another seed), predicts every transition from its real state and history, and counts, separately
for the foreseeable transitions (the prompt names everything the next state holds: fidelity.py)
and the rest: exact next states per verb, how each prediction was written (the first worked
example's change named, another's, `no change`, or a change written out), and which fields of the
wrong ones differ from the game's. The same for "no model" (the top-ranked neighbour's change
copied), and where the two part: the transitions one got right and the other wrong. `--show N`
prints N wrong foreseeable predictions per verb beside the game's change and the example's.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from common import model_setup

from dreamgym.data.collect import collect_held_out
from dreamgym.data.schema import read_transitions
from dreamgym.experience.examples import queries_of
from dreamgym.experience.fidelity import foreseeable
from dreamgym.experience.format import example_changes, state_delta
from dreamgym.experience.generate import open_experience_model
from dreamgym.state import FIELDS, parse_state

BATCH = 32


def written_as(text: str) -> str:
    """How the completion gave its next state."""
    body = text.split("<next_state>")[-1].split("</next_state>")[0].strip() if "<next_state>" in text else ""
    if body.startswith("same as example"):
        return "example 1 named" if body == "same as example 1" else "another example named"
    return "no change" if body == "no change" else "written out"


def wrong_fields(predicted, real) -> str:
    return "+".join(f for f in FIELDS if getattr(predicted, f) != getattr(real, f)) or "none"


def records(experience, rows: list[dict]) -> list[dict]:
    queries = queries_of(rows, experience.config.history)
    found = []
    for start in range(0, len(rows), BATCH):
        batch_rows, batch = rows[start : start + BATCH], queries[start : start + BATCH]
        prompts = experience.prompts(batch)
        for row, query, prompt, prediction in zip(batch_rows, batch, prompts, experience.predict(batch)):
            real = parse_state(row["next_state"])
            predicted = prediction.completion.next_state if prediction.ok else None
            found.append(
                {
                    "action": row["action"],
                    "verb": row["action"].split()[0],
                    "foreseeable": foreseeable(query, real),
                    "exact": predicted == real,
                    "written_as": written_as(prediction.text) if prediction.ok else "failed",
                    "wrong_fields": "failed" if predicted is None else wrong_fields(predicted, real),
                    "real_change": state_delta(query.state, real),
                    "predicted_change": None if predicted is None else state_delta(query.state, predicted),
                    "example_change": (example_changes(prompt) or [None])[0],
                }
            )
    return found


def summary(found: list[dict]) -> dict:
    out = {}
    for part, chosen in (("foreseeable", True), ("unforeseeable", False)):
        rows = [r for r in found if r["foreseeable"] == chosen]
        by_verb, by_way = defaultdict(list), defaultdict(list)
        for r in rows:
            by_verb[r["verb"]].append(r["exact"])
            by_way[r["written_as"]].append(r["exact"])
        out[part] = {
            "transitions": len(rows),
            "exact": sum(r["exact"] for r in rows) / max(1, len(rows)),
            "by_verb": {
                verb: {"transitions": len(v), "exact": sum(v) / len(v)}
                for verb, v in sorted(by_verb.items(), key=lambda item: -len(item[1]))
            },
            "by_way_written": {way: {"transitions": len(v), "exact": sum(v) / len(v)} for way, v in by_way.items()},
            "wrong_fields": dict(Counter(r["wrong_fields"] for r in rows if not r["exact"]).most_common()),
        }
    return out


def against(model: list[dict], copier: list[dict]) -> dict:
    """Where the model and the copier of its top neighbour part, transition by transition: the
    foreseeable ones each got right and the other wrong, by how the model wrote its prediction."""
    parted = {"model only": Counter(), "no model only": Counter()}
    for ours, theirs in zip(model, copier):
        if ours["foreseeable"] and ours["exact"] != theirs["exact"]:
            parted["model only" if ours["exact"] else "no model only"][ours["written_as"]] += 1
    return {side: dict(ways.most_common()) for side, ways in parted.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=Path, required=True)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--model", default="dreamgym-experience")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--show", type=int, default=0)
    args = parser.parse_args()

    setup = model_setup(args.params, args.model)
    out = setup.project / setup.config.paths.outputs_dir / "experience" / f"eval-{args.games.resolve().name}.parquet"
    rows = read_transitions(collect_held_out(args.games, out, setup.config)).to_pylist()
    rows.sort(key=lambda row: (row["trajectory_id"], row["step"]))
    report = {"model": setup.model_label, "games": str(args.games), "transitions": len(rows)}
    found_by = {}
    for label, no_model in (("model", False), ("no model", True)):
        with open_experience_model(setup.model_dir, setup.run_dir, setup.config, copy_neighbours=no_model) as model:
            found = found_by[label] = records(model, rows)
        report[label] = summary(found)
        print(f"{label}: exact {sum(r['exact'] for r in found) / len(found):.1%} of {len(found)}")
        print(json.dumps(report[label]["foreseeable"], indent=1))
        if args.show and not no_model:
            shown = Counter()
            for r in found:
                if r["foreseeable"] and not r["exact"] and shown[r["verb"]] < args.show:
                    shown[r["verb"]] += 1
                    print(f"--- {r['action']}\n game:    {r['real_change']!r}\n model:   {r['predicted_change']!r}")
                    print(f" example: {r['example_change']!r}")
    report["model against no model"] = against(found_by["model"], found_by["no model"])
    print(json.dumps(report["model against no model"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
