"""Where a fine-tuned policy loses a game its start won: both policies' probabilities at its last step.

    .venv/bin/python benchmarks/deciding_step.py --before outputs/policy/bc-*/bc/model \
        --after outputs/policy/rl-grpo-real-*/policy --games data/games/train [--top 3]

Plays `--after` greedily on every game of `--games` (and `--before` too); for each game `--before`
won and `--after` lost, prints the recipe and, at `--after`'s last decision (in a cooking game,
the step that ends it lost), the candidates both policies like most with each one's probability.
A measurement for diagnosis: it shows whether RL moved a confident choice or flipped a near-tie.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dreamgym.data.games import list_games
from dreamgym.envs.textworld_env import TextWorldEnv, load_task
from dreamgym.policy.model import load_policy
from dreamgym.rl.rollout import play


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the starting policy (e.g. BC)")
    parser.add_argument("--after", type=Path, required=True, help="the policy trained from it")
    parser.add_argument("--games", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args()

    before, after = load_policy(args.before), load_policy(args.after)
    tasks = [load_task(game) for game in list_games(args.games)]
    won_before = [
        episode.won for episode in play(before, [TextWorldEnv(args.max_steps) for _ in tasks], tasks, greedy=True)
    ]
    played_after = play(after, [TextWorldEnv(args.max_steps) for _ in tasks], tasks, greedy=True)
    parted = [(task, episode) for task, episode, won in zip(tasks, played_after, won_before) if won and not episode.won]
    won_after = sum(episode.won for episode in played_after)
    print(f"{sum(won_before)}/{len(tasks)} won before, {won_after} after; lost only after: {len(parted)}")
    for task, episode in parted:
        last = episode.decisions[-1]
        with torch.no_grad():
            [logp_before], _ = before.log_probs([last.prompt], [last.candidates])
            [logp_after], _ = after.log_probs([last.prompt], [last.candidates])
        liked = sorted(range(len(last.candidates)), key=lambda i: -float(logp_before[i].exp() + logp_after[i].exp()))
        print(f"\n{task.task_id}: {task.instruction.split('Recipe: ')[-1]}")  # the whole task if no recipe
        for i in liked[: args.top]:
            p_before, p_after = float(logp_before[i].exp()), float(logp_after[i].exp())
            print(f"  {last.candidates[i]:40s} before {p_before:.3f}  after {p_after:.3f}")


if __name__ == "__main__":
    main()
