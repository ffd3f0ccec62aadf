"""Does a policy read its task, or recall its games? Along the expert's path through each game, at
every step that carries out a clause of the task (slicing the carrot because the recipe says
`slice the carrot`), the policy chooses greedily under the task as it is and under each
counterfactual task of the domain (`dice the carrot`: `Domain.task_variants`, dreamgym/domain.py).
A policy that reads follows the changed clause; one that recalls its training games does what the
game's own recipe asked. Where the domain changes another ingredient's clause instead (`another's
changed`), the step's action stays the same: a policy that reads which clause is whose keeps it.

    .venv/bin/python benchmarks/recipe_reading.py outputs/policy/bc-*/bc/model data/games/train \
        --json benchmarks/results/recipe-reading-DATE.json

Figures per kind of step (the first word of the expert's action: slice, chop, dice, cook), on the
task as it is and on the changed tasks whose action is available in that state (the BBQ of
`grill` is often not). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from dreamgym.data.games import list_games
from dreamgym.domain import named_domain
from dreamgym.envs.textworld_env import TextWorldEnv, load_task
from dreamgym.policy.model import Observation, Policy, load_policy
from dreamgym.state import parse_state


def read_along_the_expert(policy: Policy, game: Path, domain_name: str, max_steps: int) -> Counter:
    """(kind, 'as asked' | 'changed', followed?) counts of one game's expert path."""
    domain = named_domain(domain_name)
    task = load_task(game)
    env = TextWorldEnv(max_steps=max_steps)
    counts: Counter = Counter()
    try:
        state, info = env.reset(task)
        taken: list[str] = []
        left: list[str] = []
        for _ in range(max_steps):
            expert = info["expert_action"]
            if not expert:
                break
            variants = domain.task_variants(task.instruction, expert)
            if variants:  # the step carries out a clause of the task
                available = set(parse_state(state).actions)
                changed = [
                    (text, action, "changed" if action != expert else "another's changed")
                    for text, action in variants
                    if action in available
                ]
                asks = [(task.instruction, expert, "as asked"), *changed]
                observations = [Observation(text, tuple(taken), state, tuple(left)) for text, _, _ in asks]
                for (_, wanted, how), decision in zip(asks, policy.act(observations, greedy=True), strict=True):
                    counts[(expert.split()[0], how, decision.action == wanted)] += 1
            taken.append(expert)
            left.append(state)
            state, _, terminated, truncated, info = env.step(expert)
            if terminated or truncated:
                break
    finally:
        env.close()
    return counts


def summary(counts: Counter) -> dict:
    kinds = sorted({kind for kind, _, _ in counts})
    return {
        kind: {
            how: {
                "steps": counts[(kind, how, True)] + counts[(kind, how, False)],
                "followed": counts[(kind, how, True)],
            }
            for how in ("as asked", "changed")
        }
        for kind in kinds
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policy")
    parser.add_argument("games")
    parser.add_argument("--count", type=int, default=40, help="the first N games of the folder")
    parser.add_argument("--domain", default="textworld-cooking")
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    policy = load_policy(args.policy)
    counts: Counter = Counter()
    for game in list_games(args.games)[: args.count]:
        counts += read_along_the_expert(policy, game, args.domain, args.max_steps)
    payload = {"policy": args.policy, "games": args.games, "count": args.count, "by_kind": summary(counts)}
    print(json.dumps(payload["by_kind"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
