"""Throughput of the real environment and of the ingest steps built on it (a measurement, not a test).

    .venv/bin/python benchmarks/real_env.py [--games 6] [--repeats 3] [--json out.json]

Measures, on this machine:
- game generation: seconds per game with 1 and 2 tw-make processes;
- TextWorld adapter: resets/s and steps/s (random admissible actions, with facts, admissible
  commands and the expert's plan requested, as collection does);
- collection: transitions/s of the noisy expert with 1 and 2 worker processes.
Each figure is the median of `--repeats` runs; the machine is shared and noisy, so compare ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

from dreamgym.data.collect import CollectionSettings, collect
from dreamgym.envs.real import env_for, load_task
from dreamgym.envs.textworld.config import GamesConfig
from dreamgym.envs.textworld.games import generate_games, plan_games
from dreamgym.state import parse_state


def time_generation(count: int, workers: int, seed: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        specs = plan_games(GamesConfig(), "train", count, seed)
        started = time.perf_counter()
        generate_games(specs, scratch, workers=workers, progress=False)
        return (time.perf_counter() - started) / count


def time_env(games: list[Path], steps_per_game: int, seed: int) -> tuple[float, float]:
    env, rng = env_for(games, steps_per_game), random.Random(seed)
    tasks = [load_task(game) for game in games]
    reset_seconds, step_seconds, steps = 0.0, 0.0, 0
    for task in tasks:
        started = time.perf_counter()
        observation, _ = env.reset(task)
        reset_seconds += time.perf_counter() - started
        done = False
        while not done:
            action = rng.choice(parse_state(observation).actions)
            started = time.perf_counter()
            observation, _, terminated, truncated, _ = env.step(action)
            step_seconds += time.perf_counter() - started
            steps += 1
            done = terminated or truncated
    env.close()
    return len(tasks) / reset_seconds, steps / step_seconds


def time_collection(games: list[Path], workers: int, seed: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        settings = CollectionSettings("noisy-expert", 0.3, 10, seed=seed, max_steps=50)
        result = collect(games, Path(scratch) / "t.parquet", settings, workers=workers, progress=False)
        return result.transitions / result.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        games, _ = generate_games(plan_games(GamesConfig(), "train", args.games, 0), scratch, workers=2, progress=False)
        runs: dict[str, list[float]] = {}
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}", flush=True)
            runs.setdefault("generate_s_per_game_1_worker", []).append(time_generation(2, 1, 100 + repeat))
            runs.setdefault("generate_s_per_game_2_workers", []).append(time_generation(4, 2, 200 + repeat))
            resets, steps = time_env(games, 50, repeat)
            runs.setdefault("env_resets_per_s", []).append(resets)
            runs.setdefault("env_steps_per_s", []).append(steps)
            runs.setdefault("collect_transitions_per_s_1_worker", []).append(time_collection(games, 1, repeat))
            runs.setdefault("collect_transitions_per_s_2_workers", []).append(time_collection(games, 2, repeat))

    medians = {name: statistics.median(values) for name, values in runs.items()}
    report = {
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
        f"{__import__('os').cpu_count()} cores, Python {platform.python_version()}",
        "games": args.games,
        "repeats": args.repeats,
        "median": medians,
        "runs": runs,
    }
    for name, value in medians.items():
        print(f"{name:40s} {value:10.2f}")
    print(
        f"{'collect speed-up, 2 workers vs 1':40s} "
        f"{medians['collect_transitions_per_s_2_workers'] / medians['collect_transitions_per_s_1_worker']:10.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
