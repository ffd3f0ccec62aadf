"""How sure a policy is of the move it loses by, and whether RL changed that move (issue 70, a probe).

    .venv/bin/python benchmarks/confident_losses.py --start <bc>/model --trained <rl run>/policy \
        --games data/games/tasks-headroom [--json benchmarks/results/confident-losses-<date>.json]

The start policy plays every game of `--games` once, greedily, up to `evaluation.max_steps` of
`--params` (TextWorld cooking games). For each game it loses, the last decision (the move that
lost it) is scored again by both policies on the same prompt and candidates. Per way of losing
(failure_modes.py's `ending`): how many games, the start's median probability of its losing move
and how many it chose at p > 0.9, the trained policy's median probability of that same move, and
how many it no longer ranks first. A move RL no longer ranks first is not a won game; a move it
still ranks first is a game still lost.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import torch
from common import machine
from failure_modes import ending

from dreamgym.config import load_config
from dreamgym.envs.real import env_for, list_games, load_task
from dreamgym.policy.model import Decision, Policy, load_policy
from dreamgym.rl.rollout import play

SURE = 0.9


def probabilities(policy: Policy, decision: Decision) -> list[float]:
    with torch.no_grad():
        [logp], _ = policy.log_probs([decision.prompt], [decision.candidates])
    return logp.exp().tolist()


def losing_moves(start: Policy, trained: Policy, games: list[Path], max_steps: int) -> list[dict]:
    """One row per game the start policy loses greedily: how, and both policies' p of its last move
    (the start's as it acted: `Decision.logprob`)."""
    rows = []
    env = env_for(games, max_steps)
    try:
        for game in games:
            task = load_task(game)
            [episode] = play(start, [env], [task], greedy=True)
            if episode.won:
                continue
            last = episode.decisions[-1]
            trained_p = probabilities(trained, last)
            rows.append(
                {
                    "game": game.name,
                    "ending": ending([d.action for d in episode.decisions], False, episode.truncated, task.instruction),
                    "move": last.action,
                    "candidates": len(last.candidates),
                    "start_p": round(math.exp(last.logprob), 4),
                    "trained_p": round(trained_p[last.chosen], 4),
                    "trained_still_first": max(range(len(trained_p)), key=trained_p.__getitem__) == last.chosen,
                }
            )
    finally:
        env.close()
    return rows


def summary(rows: list[dict]) -> dict[str, dict]:
    by_ending: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_ending[row["ending"]].append(row)
    return {
        how: {
            "lost": len(group),
            "start_p_median": round(statistics.median(r["start_p"] for r in group), 3),
            "start_sure": sum(r["start_p"] > SURE for r in group),
            "trained_p_median": round(statistics.median(r["trained_p"] for r in group), 3),
            "trained_changed": sum(not r["trained_still_first"] for r in group),
        }
        for how, group in sorted(by_ending.items(), key=lambda item: -len(item[1]))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=Path, required=True, help="the policy RL started from (BC)")
    parser.add_argument("--trained", type=Path, required=True, help="the policy RL trained")
    parser.add_argument("--games", type=Path, required=True)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    max_steps = load_config(args.params).evaluation.max_steps
    rows = losing_moves(load_policy(args.start), load_policy(args.trained), list_games(args.games), max_steps)
    table = summary(rows)
    print(f"{'ending':40} lost  start p (>{SURE})  trained p  changed")
    for how, row in table.items():
        print(
            f"{how:40} {row['lost']:4}  {row['start_p_median']:7.3f} ({row['start_sure']:2})"
            f"  {row['trained_p_median']:9.3f}  {row['trained_changed']:7}"
        )
    if args.json:
        report = {"machine": machine(), "start": str(args.start), "trained": str(args.trained)}
        args.json.write_text(json.dumps({**report, "games": str(args.games), "summary": table, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
