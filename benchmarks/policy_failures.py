"""Where a policy goes wrong in the games it loses: the first step at which it left the expert's
path, by the expert's verb there, and how many lost games ran to the step limit (a loop, or a
search that never found what the recipe needs).

    .venv/bin/python benchmarks/policy_failures.py outputs/policy/bc-*/bc/model data/games/test \
        --json benchmarks/results/policy-failures-DATE.json

The policy acts greedily with its own acting rule (the one `dreamgym eval` uses: its saved prompt
settings, `avoid_repeats` included); the expert is the game's walkthrough from the current state
(`expert_action` of the environment). The first difference is where to look, not always the
mistake: the expert's order is one of several that win. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import torch

from dreamgym.data.games import list_games
from dreamgym.envs.textworld_env import TextWorldEnv, load_task
from dreamgym.policy.model import Observation, Policy, load_policy


def play_beside_the_expert(policy: Policy, game: Path, max_steps: int) -> dict:
    """One greedy episode; the first step whose action is not the expert's, if any."""
    task = load_task(game)
    env = TextWorldEnv(max_steps=max_steps)
    try:
        state, info = env.reset(task)
        taken: list[str] = []
        left: list[str] = []
        first = None
        for step in range(max_steps):
            [decision] = policy.act([Observation(task.instruction, tuple(taken), state, tuple(left))], greedy=True)
            expert = info["expert_action"]
            if first is None and expert and decision.action != expert:
                first = {"step": step, "action": decision.action, "expert": expert}
            taken.append(decision.action)
            left.append(state)
            state, _, terminated, truncated, info = env.step(decision.action)
            if terminated or truncated:
                break
        return {"game": game.name, "won": bool(info["won"]), "steps": len(taken), "first_difference": first}
    finally:
        env.close()


def summary(episodes: list[dict], max_steps: int) -> dict:
    lost = [episode for episode in episodes if not episode["won"]]
    by_verb: dict[str, list] = defaultdict(list)
    for episode in lost:
        first = episode["first_difference"]
        verb = first["expert"].split()[0] if first else "(none)"
        by_verb[verb].append(episode)
    return {
        "games": len(episodes),
        "won": len(episodes) - len(lost),
        "lost_at_step_limit": sum(episode["steps"] >= max_steps for episode in lost),
        "lost_by_expert_verb": dict(Counter({verb: len(found) for verb, found in by_verb.items()}).most_common()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policy", help="a saved policy folder")
    parser.add_argument("games", help="a folder of games")
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    policy = load_policy(args.policy)
    episodes = [play_beside_the_expert(policy, game, args.max_steps) for game in list_games(args.games)]
    result = summary(episodes, args.max_steps)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "policy": args.policy, "episodes": episodes}, indent=2) + "\n")


if __name__ == "__main__":
    main()
