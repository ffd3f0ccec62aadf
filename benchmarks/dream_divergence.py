"""Where the dream parts from the real game, on the episodes RL played in it (a measurement, not a test).

    .venv/bin/python benchmarks/dream_divergence.py --run rl-grpo-dream-<key> [--episodes 200]
        [--games data/games/tasks-headroom ...] [--json benchmarks/results/dream-divergence-<date>.json]

Fidelity (`dreamgym experience eval`) scores single steps of the expert's episodes; RL learns from
the policy's own episodes in DreamEnv, and what it learns is worth what those are worth in the real
game. The buffer keeps every synthetic transition of a DreamEnv run (`rl.write_back`), tagged with
the run (its folder's name under outputs/policy). Each episode whose task has a real game (the
project's game folders and the run's `variation-games`, or `--games`) is replayed in that game from
its real start, action by action: the first step whose real next state, reward or end differs
from the dream's is where the dream parted, counted by the action's verb and by what differed.
Failed predictions and recalled real steps are not written back: an episode with one is counted
as `unwritten` where the dream's state before a step is not the game's.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from common import machine
from sqlalchemy import text

from dreamgym.buffer.migrations import open_migrated
from dreamgym.config import load_config
from dreamgym.envs.real import env_for, games_if_any, load_task
from dreamgym.state import AbstractState, parse_state

FIELDS = ("location", "visible", "inventory", "actions")


def differences(real: AbstractState, reward: float, done: bool, row: dict) -> list[str]:
    """What the real step gave that the dream's row did not: state fields, reward, end."""
    dream = parse_state(row["next_state"])
    found = [field for field in FIELDS if sorted(getattr(real, field)) != sorted(getattr(dream, field))]
    if round(float(reward), 2) != round(float(row["reward"]), 2):
        found.append("reward")
    if bool(done) != bool(row["terminated"]):
        found.append("done")
    return found


def replay(env, task, episode: list[dict]) -> dict:
    """One dream episode's actions in the real game: how far the dream followed it, and how it parted."""
    observation, _ = env.reset(task)
    for index, row in enumerate(episode):
        if parse_state(observation) != parse_state(row["state"]):
            return {"outcome": "unwritten", "followed": index}
        observation, reward, terminated, _, _ = env.step(row["action"])
        found = differences(parse_state(observation), reward, terminated, row)
        if found:
            return {"outcome": "parted", "followed": index, "verb": row["action"].split()[0], "differs": found}
    return {"outcome": "followed", "followed": len(episode)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--run", required=True, help="the DreamEnv RL run: its folder's name under outputs/policy")
    parser.add_argument("--games", type=Path, action="append", help="folders of the tasks' real games (repeatable)")
    parser.add_argument("--episodes", type=int, default=200, help="dream episodes to replay, the first ones")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    config = load_config(args.params)
    project = args.params.resolve().parent
    folders = args.games or [
        *sorted(path for path in (project / config.paths.data_dir / "games").iterdir() if path.is_dir()),
        project / config.paths.outputs_dir / "policy" / args.run / "variation-games",
    ]
    games = {game.stem: game for folder in folders for game in games_if_any(folder)}
    with open_migrated(project / config.paths.run_dir, config.buffer) as database, database.engine.connect() as db:
        rows = db.execute(
            text(
                "SELECT trajectory_id, task_id, step, state, action, next_state, reward, terminated "
                "FROM transitions WHERE source = 'synthetic' AND run_id = :run ORDER BY trajectory_id, step"
            ),
            {"run": args.run},
        ).mappings()
        episodes: dict[str, list[dict]] = defaultdict(list)
        for row in rows:
            episodes[row["trajectory_id"]].append(dict(row))
    playable = [episode for episode in episodes.values() if episode[0]["task_id"] in games][: args.episodes]
    replays = []
    if playable:
        env = env_for([games[episode[0]["task_id"]] for episode in playable], config.rl.max_steps + 1)
        replays = [replay(env, load_task(games[episode[0]["task_id"]]), episode) for episode in playable]
        env.close()
    else:  # a tiny model's run may write nothing back: every prediction failed
        print(f"no written-back episode of run {args.run} has its real game in {', '.join(map(str, folders))}")
    parted = [r for r in replays if r["outcome"] == "parted"]
    report = {
        "run": args.run,
        "machine": machine(),
        "episodes": len(episodes),
        "replayed": len(replays),
        "outcomes": dict(Counter(r["outcome"] for r in replays)),
        "steps_followed_median": statistics.median(r["followed"] for r in replays) if replays else None,
        "steps_written": sum(len(episode) for episode in playable),
        "parted_at_verb": dict(Counter(r["verb"] for r in parted).most_common()),
        "parted_in": dict(Counter(field for r in parted for field in r["differs"]).most_common()),
        "parted_at": dict(Counter(f"{r['verb']}: {', '.join(r['differs'])}" for r in parted).most_common(12)),
    }
    print(json.dumps(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
