"""RL in DreamEnv from a BC policy with more seed tasks than the offline data has (a measurement).

    .venv/bin/python benchmarks/dream_task_pool.py --start outputs/policy/bc-*/bc/model \
        --out outputs/bench/rl-pool --task-games /work/games/train-s20 --task-count 80 \
        [--seed 1] [--temperature 2] [--algorithm ppo]
    .venv/bin/dreamgym eval --policy outputs/bench/rl-pool/policy --games <fresh test-split games> --json ...

DreamGym's curriculum starts from the tasks of the offline data. Here the seed tasks are also the
starts of `--task-count` other training-split games (their recipe and the state a reset shows: no
transition is played), so that RL in the dream meets new layouts and recipes, where the BC policy
fails as it does on held-out games: what `games.task_count` gives the pipeline, here with any games
and seed (`--task-count 0`: the training games' tasks only). As in the pipeline, steps the offline
data recorded are replayed (`rl.recall_real`). Each epoch's tasks that have a real game are also
played in it (the monitor's real check: measured, never learned from). Prints each epoch's metrics
as JSON lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from common import model_setup

from dreamgym.data.games import list_games
from dreamgym.data.schema import read_transitions
from dreamgym.envs.dream_env import DreamEnv
from dreamgym.envs.recall import RecallingDynamics
from dreamgym.envs.textworld_env import TextWorldEnv, load_task, tasks_at_start
from dreamgym.experience.generate import open_experience_model
from dreamgym.experience.variations import dream_curriculum, seed_tasks
from dreamgym.rl.loop import train_rl
from dreamgym.rl.monitor import RealCheck

EPOCH_KEYS = ("epoch", "success_rate", "dream_success_checked", "real_success_rate", "kl", "entropy", "samples")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--model", default="dreamgym-experience")
    parser.add_argument("--start", type=Path, required=True, help="the BC policy to start from")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--task-games", type=Path, help="a folder of training-split games")
    parser.add_argument("--task-count", type=int, default=0)
    parser.add_argument("--seed", type=int, help="the RL seed [default: params]")
    parser.add_argument("--temperature", type=float, help="rl.temperature [default: params]")
    parser.add_argument("--algorithm", choices=("grpo", "ppo"), help="rl.algorithm [default: params]")
    args = parser.parse_args()

    setup = model_setup(args.params, args.model)
    config = setup.config
    chosen = {"temperature": args.temperature, "algorithm": args.algorithm}
    config = dataclasses.replace(
        config,
        rl=dataclasses.replace(config.rl, **{key: value for key, value in chosen.items() if value is not None}),
        seed=config.seed if args.seed is None else args.seed,
    )
    project = args.params.resolve().parent
    validated = project / config.paths.outputs_dir / "validation" / "validated.parquet"
    rows = read_transitions(validated).to_pylist()
    task_games = list_games(args.task_games)[: args.task_count] if args.task_games else []
    seeds = seed_tasks(rows) + tasks_at_start(task_games)
    train_games = list_games(project / config.paths.data_dir / "games" / "train")
    games = {game.stem: game for game in [*train_games, *task_games]}
    print(json.dumps({"seed_tasks": len(seeds), "rl": dataclasses.asdict(config.rl)}), flush=True)

    with open_experience_model(setup.model_dir, setup.run_dir, config) as experience:
        curriculum = dream_curriculum(seeds, experience, config)
        dynamics = RecallingDynamics(experience, rows) if config.rl.recall_real else experience
        check = RealCheck(
            lambda: TextWorldEnv(config.rl.max_steps),
            lambda task: load_task(games[task.task_id]) if task.task_id in games else None,
            config.rl.group_size,
            config.rl.temperature,
            config.seed,
        )
        result = train_rl(
            args.start,
            lambda slot: DreamEnv(dynamics, config.rl.max_steps, slot=slot, record=False),
            curriculum,
            config.rl,
            args.out,
            config.seed,
            on_epoch=lambda m: print(json.dumps({k: round(m[k], 3) for k in EPOCH_KEYS if k in m}), flush=True),
            real_check=check,
            progress=False,
        )
    print(json.dumps({"policy": str(result.policy_dir), "seconds": round(result.seconds)}))


if __name__ == "__main__":
    main()
