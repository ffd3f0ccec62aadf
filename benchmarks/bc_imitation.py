"""Why behaviour cloning does (not) imitate: BC variants trained on the same collected data and
played greedily in the real games, on the training games and on held-out test-split games.

    .venv/bin/python benchmarks/bc_imitation.py --data data/trajectories/offline.parquet \
        --train-games data/games/train --test-games data/games/test --held-out 100 \
        --variants before,labels,placeholders,default --json benchmarks/results/bc-DATE.json

Variants (each a change of `policy` settings or of the examples, everything else the default):
- `default`: expert labels at every step, counterfactual tasks, placeholders, the choice objective
  (dreamgym/policy/bc.py);
- `no-labels`: the old examples: the steps of won episodes, labelled with the action taken;
- `no-placeholders`: real object names in the prompt;
- `default+KEY=VALUE+...`: the default with `policy` fields changed, e.g. `default+epochs=10`.
A measurement, not a test: the machine is shared and noisy; figures are success rates.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch

from dreamgym.data.games import list_games
from dreamgym.data.schema import read_transitions
from dreamgym.evaluation import evaluate_policy
from dreamgym.policy.bc import bc_examples, policy_kept_names, train_bc
from dreamgym.policy.config import PolicyConfig
from dreamgym.policy.model import load_policy


def variant_setup(name: str, rows: list[dict]) -> tuple[PolicyConfig, list[dict], frozenset[str] | None]:
    """The policy settings, the rows BC reads and the kept names of a variant (module docstring)."""
    config = PolicyConfig()
    if name == "no-placeholders":
        config = dataclasses.replace(config, placeholders=False)
    if name == "no-labels":
        rows = [{**row, "expert_action": None} for row in rows]
    for change in name.split("+")[1:]:
        key, _, value = change.partition("=")
        kind = type(getattr(config, key))
        config = dataclasses.replace(config, **{key: value == "true" if kind is bool else kind(value)})
    return config, rows, policy_kept_names(rows, config)


def run_variant(
    name: str, rows: list[dict], train_games: list[Path], test_games: list[Path], seed: int, work: Path
) -> dict:
    config, rows, kept = variant_setup(name, rows)
    examples = bc_examples(rows, config, kept)
    started = time.perf_counter()
    result = train_bc(examples, config, work / name, seed, kept, progress=False)
    train_seconds = time.perf_counter() - started
    policy = load_policy(result.model_dir)
    figures = {
        "variant": name,
        "examples": len(examples),
        "steps": result.steps,
        "train_seconds": round(train_seconds, 1),
        "settings": {
            key: getattr(config, key) for key in ("placeholders", "history", "epochs", "hidden_size", "layers")
        },
    }
    for label, games in (("train_games", train_games), ("held_out", test_games)):
        report = evaluate_policy(policy, games, 1, seed, 50, greedy=True, progress=False)
        figures[label] = {
            key: report.summary[key]
            for key in ("episodes", "wins", "success_rate", "ci95", "mean_return", "mean_steps")
        }
    print(
        json.dumps({k: figures[k] for k in ("variant", "examples", "train_seconds")}),
        f"train games {figures['train_games']['success_rate']:.1%}",
        f"held-out {figures['held_out']['success_rate']:.1%}",
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/trajectories/offline.parquet")
    parser.add_argument("--train-games", default="data/games/train")
    parser.add_argument("--test-games", default="data/games/test")
    parser.add_argument("--held-out", type=int, default=100, help="first N test-split games")
    parser.add_argument("--variants", default="default,no-labels,no-placeholders")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="folder for the trained policies [a temporary one]")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = read_transitions(args.data).to_pylist()
    train_games = list_games(args.train_games)
    test_games = list_games(args.test_games)[: args.held_out]
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work or scratch)
        for name in args.variants.split(","):
            results.append(run_variant(name, rows, train_games, test_games, args.seed, work))
    payload = {
        "command": "benchmarks/bc_imitation.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "data": args.data,
        "transitions": len(rows),
        "train_games": len(train_games),
        "held_out_games": len(test_games),
        "results": results,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
