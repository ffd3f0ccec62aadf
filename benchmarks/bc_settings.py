"""Behaviour cloning with some `policy` settings changed, on the project's validated data; then greedy
wins on folders of games. The BC sibling of real_rl_settings.py (issue 70: the policy's size).

    .venv/bin/python benchmarks/bc_settings.py --out outputs/bench/bc-4-layers \
        --games data/games/tasks-headroom --games bench/games-headroom-s161 policy.layers=4

Trains as the pipeline's BC stage does (`bc_task`: the same examples, kept names and seed) into
`--out`, whose finished run is reused, and prints one JSON line: settings, examples, steps, train
seconds, and wins and mean return per folder (every game once, greedy). The trained policy is
`--out`/model: real_rl_settings.py takes it as `--start` (with the same `policy.*` settings).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import greedy_wins, parse_settings, validated_rows

from dreamgym.config import load_config
from dreamgym.policy.bc import bc_examples, policy_kept_names, train_bc
from dreamgym.policy.model import load_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--games", type=Path, action="append", default=[], help="games to evaluate on (repeatable)")
    parser.add_argument("settings", nargs="*", help="KEY=VALUE, e.g. policy.layers=4")
    args = parser.parse_args()

    overrides = parse_settings(args.settings)
    config = load_config(args.params, overrides)
    rows = validated_rows(config, args.params.resolve().parent)
    kept = policy_kept_names(rows, config.policy)
    examples = bc_examples(rows, config.policy, kept)
    result = train_bc(examples, config.policy, args.out, config.seed, kept)
    wins, returns = greedy_wins(load_policy(result.model_dir, config.policy), args.games, config)
    print(
        json.dumps(
            {
                "settings": overrides,
                "examples": len(examples),
                "steps": result.steps,
                "train_seconds": round(result.seconds),
                "reused": result.reused,
                "wins": wins,
                "mean_return": returns,
            }
        )
    )


if __name__ == "__main__":
    main()
