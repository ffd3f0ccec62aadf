"""Does a won rollout of a denied wave teach the policy the move that won, against the move it lost by?

`rl.deny_lost_moves` plays a task's rollouts in waves; a later wave is denied the move an earlier
one lost by from the same state, and may win. Its decision there was scored among the candidates
left (the denied move removed), and GRPO learns it under that same softmax, where the move that lost
is absent. This measures, on one-room cooking games that a briefly cloned policy loses greedily, the
probability of the winning and of the losing move at that state among *all* the candidates, epoch by
epoch of GRPO with the defaults (KL 0.5 to the start, learning rate 1e-4), in two ways:

- as built: the denied wave's decisions are learnt among the candidates left;
- full set: those decisions are learnt among all the candidates (the moves denied at that state put
  back, the probability it acted with recomputed there, so the clipped ratio starts at 1).

    .venv/bin/python benchmarks/denied_update.py --json out.json [--epochs 10] [--temperature 1.0]

With `--start` (a trained policy folder, e.g. `make run`'s BC) and `--games` (a folder of games, e.g.
its `data/games/train-headroom`), the same on those games instead: the first `--count` of them, in
sorted order, that the start loses greedily and a later greedy wave, denied the losing move, wins.
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


def full_set(policy: Policy, episodes: list[Episode], temperature: float) -> tuple[list[Episode], int]:
    """The episodes (one task's waves, in order) with each decision that was denied a move an
    earlier wave lost by from the same state put back among all its candidates, the denied moves
    included, its probability recomputed at the `temperature` GRPO's loss reads it at; and how
    many decisions that was."""
    lost: dict[str, set[tuple[str, str]]] = {}  # state -> (candidate text, action) a wave lost by
    out, put_back = [], 0
    for episode in episodes:
        decisions = []
        for state, decision in zip(episode.states, episode.decisions):
            missing = sorted(move for move in lost.get(state, ()) if move[0] not in decision.candidates)
            if missing:
                candidates = decision.candidates + tuple(text for text, _ in missing)
                actions = (decision.actions or decision.candidates) + tuple(action for _, action in missing)
                with torch.no_grad():
                    [logp], _ = policy.log_probs([decision.prompt], [candidates], temperature)
                decision = dataclasses.replace(
                    decision, candidates=candidates, actions=actions, logprob=float(logp[decision.chosen])
                )
                put_back += 1
            decisions.append(decision)
        out.append(dataclasses.replace(episode, decisions=decisions))
        if episode.lost:
            last = episode.decisions[-1]
            lost.setdefault(episode.states[-1], set()).add((last.candidates[last.chosen], last.action))
    return out, put_back


def probabilities(policy: Policy, decision: Decision, moves: tuple[str, str]) -> list[float]:
    """The policy's probabilities of `moves` among the decision's candidates, at temperature 1."""
    with torch.no_grad():
        [logp], _ = policy.log_probs([decision.prompt], [decision.candidates])
    actions = decision.actions or decision.candidates
    return [round(float(logp[actions.index(move)].exp()), 4) for move in moves]


def waves(
    policy: Policy,
    task,
    max_steps: int,
    group_size: int,
    greedy: bool,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> list[Episode]:
    """One group of `policy` on `task`, played in waves, each denied the moves earlier ones lost by."""
    return play_groups(
        policy,
        lambda count: [TextWorldEnv(max_steps) for _ in range(count)],
        [task],
        group_size,
        deny_lost_moves=True,
        greedy=greedy,
        generator=generator,
        temperature=temperature,
    )


def probed_games(start: Path, folder: Path, count: int, max_steps: int) -> list[Path]:
    """The first `count` games of `folder` that the start loses greedily and a later denied wave wins."""
    chosen = []
    for game in sorted(folder.glob("*.z8")):
        policy, generator = load_policy(start), torch.Generator().manual_seed(0)
        first, *later = waves(policy, load_task(game), max_steps, RLConfig().group_size, True, generator)
        if first.lost and any(episode.won for episode in later):
            chosen.append(game)
            if len(chosen) == count:
                break
    return chosen


def run(start: Path, game: Path, epochs: int, put_back: bool, temperature: float, max_steps: int = MAX_STEPS) -> dict:
    config = RLConfig(env="real", temperature=temperature)
    algorithm = GRPO(config)
    policy, reference = load_policy(start), load_policy(start)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.learning_rate)
    task = load_task(game)
    generator = torch.Generator().manual_seed(0)

    def played(greedy: bool) -> list[Episode]:
        return waves(policy, task, max_steps, config.group_size, greedy, generator, config.temperature)

    # The state the greedy policy loses from, the move it loses by and the move a later wave won by.
    first, *later = played(greedy=True)
    lost_at = first.decisions[-1]
    won = next(episode for episode in later if episode.won)
    won_by = won.decisions[[d.prompt for d in won.decisions].index(lost_at.prompt)].action
    moves = (won_by, lost_at.action)
    curve, decisions_put_back, endings = [probabilities(policy, lost_at, moves)], 0, {"won": 0, "lost": 0, "other": 0}
    for epoch in range(epochs):
        episodes = played(greedy=False)
        for episode in episodes:
            endings["won" if episode.won else "lost" if episode.lost else "other"] += 1
        if put_back:
            episodes, count = full_set(policy, episodes, config.temperature)
            decisions_put_back += count
        samples = algorithm.samples(episodes, policy)
        if samples:  # the loop's own update step (rl/loop.py), as train_rl applies it each epoch
            _update(policy, reference, algorithm, samples, optimizer, config, random.Random(epoch))
        curve.append(probabilities(policy, lost_at, moves))
    return {
        "won_by": won_by,
        "lost_by": lost_at.action,
        "p_won_by_and_lost_by": curve,
        "decisions_put_back": decisions_put_back,
        "sampled_episodes": endings,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=RLConfig().temperature, help="of the sampled waves")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--start", type=Path, help="a trained policy folder (default: the RL tests' warm start)")
    parser.add_argument("--games", type=Path, help="with --start: the folder of games to probe on")
    parser.add_argument("--count", type=int, default=3, help="with --start: games to probe")
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS, help="step limit of an episode")
    args = parser.parse_args()
    if (args.start is None) != (args.games is None):
        parser.error("--start and --games go together")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        if args.start is None:
            start = warm_start(work)
            plans = plan_games(dataclasses.replace(ONE_ROOM, cook=True, train_count=8), "train", 8, seed=3)
            games, _ = generate_games([plans[i] for i in (3, 5, 6)], work / "cook", workers=1, progress=False)
        else:
            start, games = args.start, probed_games(args.start, args.games, args.count, args.max_steps)
        report = {
            game.name: {
                way: run(start, game, args.epochs, way == "full set", args.temperature, args.max_steps)
                for way in ("as built", "full set")
            }
            for game in games
        }
    setup = {"start": str(args.start or "the RL tests' warm start"), "max_steps": args.max_steps}
    args.json.write_text(
        json.dumps({"epochs": args.epochs, "temperature": args.temperature, **setup, "games": report}, indent=1)
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
