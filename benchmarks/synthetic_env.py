"""Throughput of the synthetic environment next to the real one (a measurement, not a test).

    .venv/bin/python benchmarks/synthetic_env.py [--model dreamgym-experience] [--batches 1 8 32 64]
        [--steps 4] [--repeats 3] [--json benchmarks/results/synthetic_env-<date>.json]
        [--policy outputs/policy/bc-*/bc/model]

For each batch size B: B DreamEnvs on seed tasks, all stepped by one `step_together` call per
step, `--steps` seeded random available actions; synthetic transitions/s (medians of --repeats)
and the parse-failure rate, beside the real environment's steps/s on the training games.

With `--policy`, also GRPO's rollouts: B/4 seed tasks, groups of 4 rollouts sampled by that policy
to the end (DreamEnv's time only), then the same with recorded real steps recalled as the pipeline
does by default (rl.recall_real): all DreamEnv steps/s and the share recalled.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from common import machine, model_setup

from dreamgym.envs.dream_env import DreamEnv, step_together
from dreamgym.envs.real import env_for, environment_of, list_games, load_task
from dreamgym.envs.recall import RecallingDynamics
from dreamgym.experience.generate import open_experience_model
from dreamgym.experience.variations import seed_tasks
from dreamgym.state import parse_state


def forget_encodings(experience) -> None:
    """Each measurement starts from an empty encoder cache: only the texts its own steps repeat are
    reused, not those of the runs before it (the same tasks' initial states, the warm-up's)."""
    if experience.encoder is not None:
        experience.encoder.forget()


def synthetic_rate(experience, tasks, batch: int, steps: int, seed: int) -> dict:
    rng = random.Random(seed)
    forget_encodings(experience)
    envs = [DreamEnv(experience.dynamics(), max_steps=steps, slot=slot, record=False) for slot in range(batch)]
    observations = [env.reset(tasks[(seed + slot) % len(tasks)])[0] for slot, env in enumerate(envs)]
    started = time.perf_counter()
    for _ in range(steps):
        actions = [rng.choice(parse_state(o).actions or ("look",)) for o in observations]
        results = step_together(envs, actions)
        # An episode the model ended starts again on the same task: the batch stays full.
        observations = [
            env.reset(env.task)[0] if terminated or truncated else observation
            for env, (observation, _, terminated, truncated, _) in zip(envs, results)
        ]
    seconds = time.perf_counter() - started
    predicted = sum(env.model_steps for env in envs)
    return {
        "transitions": predicted,
        "seconds": seconds,
        "per_s": predicted / seconds,
        "failures": sum(env.failures for env in envs),
    }


def grouped_rate(experience, policy, tasks, batch: int, steps: int, seed: int, group: int = 4, dynamics=None) -> dict:
    """DreamEnv steps/s in GRPO's rollouts: batch // group tasks, `group` rollouts each. With
    `dynamics` (a RecallingDynamics around `experience`), the envs step with it: `per_s` counts the
    model's steps, `steps_per_s` all DreamEnv steps, recalled ones included."""
    import torch

    import dreamgym.rl.rollout as rollout

    timed, step = [0.0], rollout._step

    def timed_step(envs, actions):
        started = time.perf_counter()
        try:
            return step(envs, actions)
        finally:
            timed[0] += time.perf_counter() - started

    slots = [tasks[(seed * batch + n // group) % len(tasks)] for n in range(batch)]
    dynamics = dynamics or experience.dynamics()
    envs = [DreamEnv(dynamics, max_steps=steps, slot=slot, record=False) for slot in range(len(slots))]
    rollout._step = timed_step
    forget_encodings(experience)
    try:
        started = time.perf_counter()
        rollout.play(policy, envs, slots, generator=torch.Generator().manual_seed(seed), temperature=1.0)
        total = time.perf_counter() - started
    finally:
        rollout._step = step
    predicted, recalled = sum(env.model_steps for env in envs), sum(env.recalled_steps for env in envs)
    return {
        "transitions": predicted,
        "recalled": recalled,
        "env_seconds": timed[0],
        "policy_seconds": total - timed[0],
        "per_s": predicted / timed[0],
        "steps_per_s": (predicted + recalled) / timed[0],
        "failures": sum(env.failures for env in envs),
    }


def real_rate(games, steps: int, seed: int, max_steps: int) -> float:
    rng, env, done, started = random.Random(seed), env_for(games, max_steps), 0, time.perf_counter()
    try:
        for game in games:
            observation, _ = env.reset(load_task(game))
            for _ in range(steps):
                observation, _, terminated, truncated, _ = env.step(rng.choice(parse_state(observation).actions))
                done += 1
                if terminated or truncated:
                    break
    finally:
        env.close()
    return done / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dreamgym-experience")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--steps", type=int, default=4, help="steps per episode per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--real-games", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--policy", type=Path, help="a saved policy: also measure GRPO's grouped rollouts")
    args = parser.parse_args()

    setup = model_setup(args.params, args.model)
    config, project, run_dir, model_dir = setup.config, setup.project, setup.run_dir, setup.model_dir
    rows = setup.training_rows()
    tasks = seed_tasks(rows)
    report = {
        "model": setup.model_label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "synthetic": {},
    }
    with open_experience_model(model_dir, run_dir, config) as experience:
        synthetic_rate(experience, tasks, 2, 1, seed=99)  # warm-up: first generate call, encoder, pool
        for batch in args.batches:
            runs = [synthetic_rate(experience, tasks, batch, args.steps, seed) for seed in range(args.repeats)]
            report["synthetic"][batch] = {
                "transitions_per_s": statistics.median(run["per_s"] for run in runs),
                "failure_rate": sum(r["failures"] for r in runs) / max(1, sum(r["transitions"] for r in runs)),
                "runs": runs,
            }
            print(
                f"batch {batch:3d}: {report['synthetic'][batch]['transitions_per_s']:.2f} synthetic "
                f"transitions/s, failures {report['synthetic'][batch]['failure_rate']:.1%}",
                flush=True,
            )
        if args.policy:
            from dreamgym.policy.model import load_policy

            policy = load_policy(args.policy, config.policy)
            # GRPO's rollouts, then as the pipeline steps DreamEnv by default (rl.recall_real):
            # recorded real steps replayed, the model predicts the rest.
            recalling = RecallingDynamics(experience.dynamics(), rows)  # its lookup table, built once
            for name, dynamics in (("grouped", None), ("grouped_recalling", recalling)):
                report[name] = {}
                for batch in (b for b in args.batches if b >= 4):
                    runs = [
                        grouped_rate(experience, policy, tasks, batch, config.rl.max_steps, seed, dynamics=dynamics)
                        for seed in range(args.repeats)
                    ]
                    steps = sum(r["recalled"] + r["transitions"] for r in runs)
                    report[name][batch] = {
                        "transitions_per_s": statistics.median(run["per_s"] for run in runs),
                        "steps_per_s": statistics.median(run["steps_per_s"] for run in runs),
                        "recalled_share": sum(r["recalled"] for r in runs) / max(1, steps),
                        "runs": runs,
                    }
                    print(f"batch {batch:3d}, GRPO groups of 4, {name}: {report[name][batch]}", flush=True)
    games = list_games(project / config.paths.data_dir / "games" / "train")[: args.real_games]
    real_rate(games[:1], 2, 0, config.env.max_steps)  # warm-up: TextWorld's import, ScienceWorld's JVM
    real = [real_rate(games, args.steps * 4, seed, config.env.max_steps) for seed in range(args.repeats)]
    report["real_steps_per_s"] = statistics.median(real)
    report["real_runs"] = real
    rates = {b: report["synthetic"][b]["transitions_per_s"] for b in args.batches}
    if 1 in rates:
        report["speedup_over_batch_1"] = {b: rate / rates[1] for b, rate in rates.items()}
    print(f"real {environment_of(games[0])}: {report['real_steps_per_s']:.1f} steps/s")
    print(json.dumps({k: v for k, v in report.items() if k in ("model", "machine", "speedup_over_batch_1")}))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
