"""How fast the policy scores its candidate actions: behaviour cloning's training steps and acting.

Every decision of the policy (mode choice) scores each available action, ~30 per state in the
cooking games, so BC, RL updates and acting all pay for prompt + candidates. This times, on a
project's collected data and with its `policy` settings (a fresh, untrained model of that size):

- a BC optimiser step (forward, backward, AdamW) on `--batch` examples;
- a greedy decision for `--act-batch` observations at once (no gradient), as evaluation acts.

    .venv/bin/python benchmarks/policy_scoring.py --data data/trajectories/offline.parquet \
        --repeats 5 --json benchmarks/results/policy-scoring-DATE.json

Medians of `--repeats` timings, each over `--steps` steps after one warm-up step. To compare
checkouts, run it in each (its own .venv, that checkout as the working directory).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from dreamgym.config import load_config
from dreamgym.data.schema import read_transitions
from dreamgym.ops.benchmark import machine
from dreamgym.policy.bc import bc_examples, choice_loss, initial_policy, policy_kept_names
from dreamgym.policy.config import PolicyConfig
from dreamgym.policy.model import Observation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--batch", type=int, default=None, help="BC examples per step (default: policy.batch_size)")
    parser.add_argument("--act-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    config: PolicyConfig = load_config(args.params).policy
    batch = args.batch or config.batch_size
    rows = read_transitions(args.data).to_pylist()
    kept = policy_kept_names(rows, config)
    examples = bc_examples(rows, config, kept)
    policy = initial_policy(examples, config, seed=0, kept=kept).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.learning_rate)
    rng = random.Random(0)

    def bc_step() -> None:
        chosen = rng.sample(examples, batch)
        distributions, _ = policy.log_probs([e["prompt"] for e in chosen], [e["candidates"] for e in chosen])
        loss = choice_loss(distributions, [e["label"] for e in chosen])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    real = [row for row in rows if row["source"] == "real"]

    def act_step() -> None:
        chosen = rng.sample(real, args.act_batch)
        policy.act([Observation(row["instruction"], (), row["state"], ()) for row in chosen], greedy=True)

    def timed(step) -> float:
        step()  # warm-up
        started = time.perf_counter()
        for _ in range(args.steps):
            step()
        return (time.perf_counter() - started) / args.steps

    bc_seconds = [timed(bc_step) for _ in range(args.repeats)]
    policy.eval()
    act_seconds = [timed(act_step) for _ in range(args.repeats)]
    candidates = statistics.mean(len(e["candidates"]) for e in examples)
    result = {
        "machine": machine(),
        "policy": {"hidden_size": config.hidden_size, "layers": config.layers, "max_length": config.max_length},
        "examples": len(examples),
        "mean_candidates": round(candidates, 1),
        "bc_batch": batch,
        "bc_step_seconds": statistics.median(bc_seconds),
        "bc_examples_per_second": batch / statistics.median(bc_seconds),
        "act_batch": args.act_batch,
        "act_decisions_per_second": args.act_batch / statistics.median(act_seconds),
        "bc_step_seconds_all": bc_seconds,
        "act_seconds_all": act_seconds,
    }
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_all")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
