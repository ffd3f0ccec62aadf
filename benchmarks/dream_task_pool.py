"""RL in DreamEnv from a BC policy, as the pipeline runs it, with settings changed (a measurement).

    .venv/bin/python benchmarks/dream_task_pool.py --start outputs/policy/bc-*/bc/model \
        --out outputs/bench/rl-domain [--task-games <training-split games> --task-count 80] \
        [curriculum.variations=domain seed=1 rl.epochs=18 ...]
    .venv/bin/dreamgym eval --policy outputs/bench/rl-domain/policy --games <fresh test-split games> --json ...

The seed tasks are those of the offline data and the starts of the task games (their recipe and
the state a reset shows: no transition is played): by default the project's own
(`<data_dir>/games/tasks`, `games.task_count`), as the pipeline's `dream_rl_task` uses them;
`--task-games` takes the first `--task-count` of another folder instead (`--task-count 0`: the
training games' tasks only). KEY=VALUE settings change the project's parameters (values read as
YAML), e.g. `curriculum.variations=domain`. As in the pipeline, steps the offline data recorded are
replayed (`rl.recall_real`), and each epoch's tasks that have a real game are also played in it
(the monitor's real check: measured, never learned from). Nothing is written back to the buffer.
Prints each epoch's metrics as JSON lines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from common import model_setup

from dreamgym.data.games import games_if_any, list_games
from dreamgym.data.harder_games import harder_game_writer
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
    parser.add_argument("--task-games", type=Path, help="a folder of training-split games [default: the project's]")
    parser.add_argument("--task-count", type=int, default=0, help="how many of --task-games")
    parser.add_argument("settings", nargs="*", help="KEY=VALUE, e.g. curriculum.variations=domain or seed=1")
    args = parser.parse_args()

    overrides = {key: yaml.safe_load(value) for key, value in (setting.split("=", 1) for setting in args.settings)}
    setup = model_setup(args.params, args.model, overrides)
    config = setup.config
    project = setup.project
    validated = project / config.paths.outputs_dir / "validation" / "validated.parquet"
    rows = read_transitions(validated).to_pylist()
    if args.task_games:
        task_games = list_games(args.task_games)[: args.task_count]
    else:
        task_games = games_if_any(project / config.paths.data_dir / "games" / "tasks")
    seeds = seed_tasks(rows) + tasks_at_start(task_games)
    train_games = list_games(project / config.paths.data_dir / "games" / "train")
    games = {game.stem: game for game in [*train_games, *task_games]}
    print(json.dumps({"seed_tasks": len(seeds), "settings": overrides}), flush=True)

    with open_experience_model(setup.model_dir, setup.run_dir, config) as experience:
        game_writer = harder_game_writer(args.out / "variation-games", config.seed, config.games.workers)
        curriculum = dream_curriculum(seeds, experience, config, game_writer)
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
