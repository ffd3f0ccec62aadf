"""How many of the task variations the experience model writes can the curriculum use?

The curriculum (dreamgym/curriculum.py) gives a share of each RL epoch to new tasks that the
experience model's backbone writes from the best seed tasks, and keeps only those
`check_variation` accepts. This asks the model for variations of the seed tasks of a validated
data set, exactly as the curriculum does (`write_variations`, sampled, one batch per call), and
counts how many are accepted and why the others are not; a few are printed to read.

    .venv/bin/python benchmarks/curriculum_variations.py \
        --experience /tmp/run/outputs/experience/model-*/model \
        --validated /tmp/run/outputs/validation/validated.parquet \
        --count 20 --calls 2 --json benchmarks/results/curriculum-variations.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from dreamgym.benchmark import machine
from dreamgym.curriculum import check_variation, state_verbs
from dreamgym.data.schema import read_transitions
from dreamgym.experience.variations import seed_tasks, write_variations
from dreamgym.lm.model import load_model


def reason_kind(reason: str | None) -> str:
    """'accepted', or the reason without the seed's name ('variation of X: ' is dropped)."""
    return "accepted" if reason is None else reason.split(": ", 1)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experience", type=Path, required=True, help="the experience model's folder")
    parser.add_argument("--validated", type=Path, required=True, help="validated.parquet (the seed tasks)")
    parser.add_argument("--count", type=int, default=20, help="variations per call (one batch)")
    parser.add_argument("--calls", type=int, default=2, help="calls, each with its own sampling seed")
    parser.add_argument("--show", type=int, default=4, help="variations to print")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()

    seeds = seed_tasks(read_transitions(args.validated).to_pylist())
    known_verbs = state_verbs(task.initial_state for task in seeds)
    model, tokenizer = load_model(args.experience)
    kinds: Counter[str] = Counter()
    examples = []
    started = time.perf_counter()
    for call in range(args.calls):
        # Seeds in turn from where the last call stopped, as a curriculum's calls take its top seeds.
        chosen = [seeds[(call * args.count + i) % len(seeds)] for i in range(args.count)]
        for candidate, seed in zip(write_variations(model, tokenizer, chosen, args.count, seed=call), chosen):
            kind = reason_kind(check_variation(candidate, seed, set(), known_verbs))
            kinds[kind] += 1
            if len(examples) < args.show:
                examples.append(
                    {
                        "seed": seed.task_id,
                        "verdict": kind,
                        "instruction": candidate.instruction,
                        "initial_state": candidate.initial_state,
                    }
                )
    seconds = time.perf_counter() - started
    total = sum(kinds.values())
    report = {
        "experience_model": str(args.experience),
        "seed_tasks": len(seeds),
        "variations": total,
        "accepted": kinds["accepted"],
        "verdicts": dict(kinds.most_common()),
        "seconds": round(seconds, 1),
        "machine": machine(),
        "examples": examples,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{kinds['accepted']}/{total} variations accepted ({seconds:.0f} s)")
    for kind, count in kinds.most_common():
        print(f"{count:4d}  {kind}")
    for example in examples:
        print(
            f"--- {example['verdict']} (from {example['seed']})\n{example['instruction'][:200]}\n"
            f"{example['initial_state'][:400]}"
        )


if __name__ == "__main__":
    main()
