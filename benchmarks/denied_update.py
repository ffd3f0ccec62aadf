"""Does a won rollout of a denied wave teach the policy the move that won, against the move it lost by?

`rl.deny_lost_moves` plays a task's rollouts in waves; a later wave is denied the move an earlier
one lost by from the same state, and may win. Its decision there was scored among the candidates
left (the denied move removed), and GRPO learns it under that same softmax, where the move that lost
is absent. This measures, on one-room cooking games that a briefly cloned policy loses greedily, the
probability of the winning and of the losing move at that state among *all* the candidates, epoch by
epoch of GRPO with the defaults (KL 0.5 to the start, learning rate 1e-4), in two ways:

- as built: the denied wave's decisions are learnt among the candidates left;
- full set: those decisions are learnt among all the candidates (the denied move put back, the
  probability it acted with recomputed there, so the clipped ratio starts at 1).

    .venv/bin/python benchmarks/denied_update.py --json out.json [--epochs 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import tempfile
from pathlib import Path

import torch

from dreamgym.data.collect import CollectionSettings, collect
from dreamgym.data.schema import read_transitions
from dreamgym.envs.textworld.config import GamesConfig
from dreamgym.envs.textworld.env import TextWorldEnv, load_task
from dreamgym.envs.textworld.games import generate_games, plan_games
from dreamgym.policy.bc import bc_examples, policy_kept_names, train_bc
from dreamgym.policy.config import PolicyConfig
from dreamgym.policy.model import Decision, Policy, load_policy
from dreamgym.rl.config import RLConfig
from dreamgym.rl.grpo import GRPO
from dreamgym.rl.loop import _update
from dreamgym.rl.rollout import Episode, play_groups

# The RL tests' one-room games and warm start (tests/test_rl.py): a policy cloned for one epoch
# from one game's noisy-expert episodes; games 3, 5 and 6 of the cooking plans it loses greedily.
ONE_ROOM = GamesConfig(recipe=(1,), take=(1,), go=(1,), open=False, cook=False, cut=False, train_count=1, test_count=0)
WARM = PolicyConfig(
    vocab_size=400, hidden_size=64, layers=2, heads=2, max_length=512, epochs=1, batch_size=8, learning_rate=1e-3
)
MAX_STEPS = 10


def warm_start(work: Path) -> Path:
    [game], _ = generate_games(plan_games(ONE_ROOM, "train", 1, seed=3), work / "one", workers=1, progress=False)
    settings = CollectionSettings("noisy-expert", 0.3, 6, seed=0, max_steps=20)
    collect([game], work / "data.parquet", settings, workers=1, progress=False)
    rows = read_transitions(work / "data.parquet").to_pylist()
    kept = policy_kept_names(rows, WARM)
    return train_bc(bc_examples(rows, WARM, kept), WARM, work / "bc", seed=0, kept=kept, progress=False).model_dir


def full_set(policy: Policy, episodes: list[Episode]) -> list[Episode]:
    """The episodes with each decision that was scored among fewer candidates than another
    decision of the same prompt (a denied move left out) put back among all of them."""
    widest: dict[str, Decision] = {}
    for decision in (d for episode in episodes for d in episode.decisions):
        wide = widest.get(decision.prompt)
        if wide is None or len(decision.candidates) > len(wide.candidates):
            widest[decision.prompt] = decision
    out = []
    for episode in episodes:
        decisions = []
        for decision in episode.decisions:
            wide = widest[decision.prompt]
            if len(wide.candidates) > len(decision.candidates):
                chosen = wide.candidates.index(decision.candidates[decision.chosen])
                with torch.no_grad():
                    [logp], _ = policy.log_probs([decision.prompt], [wide.candidates])
                decision = dataclasses.replace(
                    decision,
                    candidates=wide.candidates,
                    actions=wide.actions,
                    chosen=chosen,
                    logprob=float(logp[chosen]),
                )
            decisions.append(decision)
        out.append(dataclasses.replace(episode, decisions=decisions))
    return out


def probabilities(policy: Policy, decision: Decision, moves: tuple[str, str]) -> list[float]:
    with torch.no_grad():
        [logp], _ = policy.log_probs([decision.prompt], [decision.candidates])
    actions = decision.actions or decision.candidates
    return [round(float(logp[actions.index(move)].exp()), 4) for move in moves]


def run(start: Path, game: Path, epochs: int, put_back: bool) -> dict:
    config = RLConfig(env="real")
    policy, reference = load_policy(start), load_policy(start)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.learning_rate)
    task = load_task(game)
    generator = torch.Generator().manual_seed(0)

    def waves(greedy: bool) -> list[Episode]:
        return play_groups(
            policy,
            lambda count: [TextWorldEnv(MAX_STEPS) for _ in range(count)],
            [task],
            config.group_size,
            deny_lost_moves=True,
            greedy=greedy,
            generator=generator,
            temperature=config.temperature,
        )

    # The state the greedy policy loses from, the move it loses by and the move a later wave won by.
    first, *later = waves(greedy=True)
    lost_at = first.decisions[-1]
    won = next(episode for episode in later if episode.won)
    won_by = won.decisions[[d.prompt for d in won.decisions].index(lost_at.prompt)].action
    moves = (won_by, lost_at.action)
    curve = [probabilities(policy, lost_at, moves)]
    for epoch in range(epochs):
        episodes = waves(greedy=False)
        if put_back:
            episodes = full_set(policy, episodes)
        samples = GRPO(config).samples(episodes, policy)
        if samples:
            _update(policy, reference, GRPO(config), samples, optimizer, config, random.Random(epoch))
        curve.append(probabilities(policy, lost_at, moves))
    return {"won_by": won_by, "lost_by": lost_at.action, "p_won_by_and_lost_by": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        start = warm_start(work)
        plans = plan_games(dataclasses.replace(ONE_ROOM, cook=True, train_count=8), "train", 8, seed=3)
        games, _ = generate_games([plans[i] for i in (3, 5, 6)], work / "cook", workers=1, progress=False)
        report = {
            game.name: {way: run(start, game, args.epochs, way == "full set") for way in ("as built", "full set")}
            for game in games
        }
    args.json.write_text(json.dumps({"epochs": args.epochs, "games": report}, indent=1))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
