"""Real-env RL from a BC policy with some `rl` settings changed, then greedy wins on a folder of games.

    .venv/bin/python benchmarks/real_rl_settings.py --start outputs/policy/bc-*/bc/model \
        --out outputs/bench/rl-lr3e-5 --games data/games/train rl.learning_rate=3e-5 rl.epochs=10000

Runs `train_rl` in real games as the bench's real-GRPO row does (`rl.env: real`, until
`rl.real_budget`; pass `rl.epochs=10000` for "until the budget", as the bench does, or leave
`rl.epochs` to stop earlier): in the project's training games (`<data_dir>/games/train`), or in
those of `--tasks`. Then plays the start and the trained policy greedily once on every game of each
`--games` folder and prints one JSON line: settings, wins and the mean score per folder (a game
RL has not yet learnt to win can still score more of its recipe), the learning curve (rollout
success, entropy, samples per epoch). A run whose `--out` holds a finished policy is evaluated
again, not retrained.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import greedy_wins, parse_settings

from dreamgym.config import load_config
from dreamgym.curriculum import Curriculum
from dreamgym.envs.real import env_for, list_games, load_task
from dreamgym.policy.model import load_policy
from dreamgym.rl.loop import train_rl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--start", type=Path, required=True, help="the BC policy to start from")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--games", type=Path, action="append", required=True, help="games to evaluate on (repeatable)")
    parser.add_argument("--tasks", type=Path, help="folder of games RL practises [default: the training games]")
    parser.add_argument("settings", nargs="*", help="KEY=VALUE, e.g. rl.learning_rate=3e-5")
    args = parser.parse_args()

    overrides = parse_settings(args.settings)
    config = load_config(args.params, {**overrides, "rl.env": "real"})
    project = args.params.resolve().parent
    games = list_games(args.tasks or project / config.paths.data_dir / "games" / "train")
    seeds = [load_task(game) for game in games]
    started = time.perf_counter()
    policy_dir = args.out / "policy"
    if not (policy_dir / "result.json").exists():
        policy_dir = train_rl(
            args.start,
            lambda slot: env_for(games, config.rl.max_steps),
            Curriculum(seeds, config.curriculum, config.seed),
            config.rl,
            args.out,
            config.seed,
            real_budget=config.rl.real_budget,
        ).policy_dir
    seconds = time.perf_counter() - started
    history = json.loads((policy_dir / "result.json").read_text())["history"]
    wins, scores = {}, {}
    for name, path in (("start", args.start), ("trained", policy_dir)):
        folder_wins, folder_scores = greedy_wins(load_policy(path, config.policy), args.games, config)
        wins |= {f"{name} {folder}": value for folder, value in folder_wins.items()}
        scores |= {f"{name} {folder}": value for folder, value in folder_scores.items()}
    curve = {
        key: [round(row.get(key, float("nan")), 3) for row in history]
        for key in ("success_rate", "entropy", "samples", "real_transitions")
    }
    print(
        json.dumps(
            {"settings": overrides, "wins": wins, "score": scores, "curve": curve, "train_seconds": round(seconds)}
        )
    )


if __name__ == "__main__":
    main()
