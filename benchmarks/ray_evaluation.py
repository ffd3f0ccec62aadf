"""Real held-out evaluation in one process vs on a local Ray with 2 workers (a measurement, not a test).

    .venv/bin/python benchmarks/ray_evaluation.py --games data/games/test \\
        --policy outputs/policy/bc-<key>/bc/model [--count 40] [--workers 2] [--repeats 3] \\
        [--json benchmarks/results/ray-evaluation-<date>.json]

The evaluation the policy flow runs (flows/train_policy.py evaluate_task: greedy, one episode per
game, `--count` games spread over the folder as `evaluation.games` picks them), timed inside a
Prefect flow as the stage task spends it (the flow run's own start and end, rounded up to whole
seconds by Prefect here and the same either way, is left out):
- one process: the flow on its default task runner (`compute.task_runner: local`), torch on its
  default threads; and again on one thread, which measures the parallel part (the games' play)
  as one Ray worker does it;
- Ray: a local Ray with `--workers` CPUs started as the pipeline starts it (flows/compute.py),
  then the flow on prefect-ray's RayTaskRunner twice: cold (fresh workers import the project) and
  warm (what every later evaluation of a run costs). Every report is checked to be the one-process
  report, record for record.
Each figure is the median of `--repeats` runs (the machine is shared: compare within one run). From
them, Amdahl's law: serial s = warm Ray wall - p * (largest shard's share of the games), parallel
p = one-thread play time; N machines of `--workers` CPUs take s + p * share(N), where the share
stops falling once every shard has its CPU (shards are whole batches of 16 episodes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dreamgym.benchmark import machine
from dreamgym.config import PipelineConfig
from dreamgym.evaluation import BATCH, eval_set_id, evaluate_policy, held_out_games
from dreamgym.fanout import evaluate_in_pieces
from dreamgym.ops.config import ComputeConfig, EvaluationConfig
from dreamgym.policy.model import load_policy
from dreamgym.sharding import evaluation_shards
from dreamgym.tracking import configure_services

SEED, MAX_STEPS = 0, 50  # params.yaml's seed and evaluation.max_steps


def evaluation_flow():
    """The benchmark's flow, made after `configure_services` (Prefect reads its settings at import)."""
    from prefect import flow

    from flows.compute import fanout

    @flow(name="ray-evaluation-benchmark")
    def evaluate(policy: str, games: list[str]) -> tuple[float, tuple[dict, list[dict]]]:
        started = time.perf_counter()
        pieces = fanout()  # as evaluate_task decides: None on the default runner
        if pieces is None:
            report = evaluate_policy(load_policy(policy), games, 1, SEED, MAX_STEPS, greedy=True, progress=False)
        else:
            report = evaluate_in_pieces(policy, games, 1, SEED, MAX_STEPS, True, pieces)
        return time.perf_counter() - started, (report.summary, report.records)

    return evaluate


def timed(call, *args):
    started = time.perf_counter()
    result = call(*args)
    return time.perf_counter() - started, result


def largest_share(count: int, cpus: int) -> float:
    """The largest shard's share of `count` greedy one-episode games cut for `cpus` workers."""
    shards = evaluation_shards(list(range(count)), cpus, 1, BATCH, greedy=True)
    return max(len(shard) for shard in shards) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=Path, required=True, help="A folder of .z8 games (e.g. data/games/test).")
    parser.add_argument("--policy", type=Path, required=True, help="A saved policy folder (e.g. a BC model).")
    parser.add_argument("--count", type=int, default=40, help="Games evaluated (evaluation.games).")
    parser.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    run_dir = Path(tempfile.mkdtemp(prefix="ray-evaluation-"))
    configure_services(run_dir)  # embedded MLflow and Prefect, as `dreamgym run` has them
    from flows.caching import file_digest
    from flows.compute import on_compute, prefect_api_url, ray_cluster

    prefect_api_url()  # Prefect's temporary server started now, not inside a timing
    config = dataclasses.replace(PipelineConfig(), evaluation=EvaluationConfig(games=args.count))
    games = [str(game) for game in held_out_games(config, args.games)]
    compute = ComputeConfig(task_runner="ray", ray_address="local", ray_workers=args.workers)
    evaluate, policy = evaluation_flow(), str(args.policy.resolve())
    threads = torch.get_num_threads()

    # Untimed: the first run in a process imports TextWorld's and the policy's code and reads the
    # games from disk, once; it is the reference report.
    reference = evaluate(policy, games)[1]
    runs: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        print(f"repeat {repeat + 1}/{args.repeats}", flush=True)
        seconds, local = evaluate(policy, games)
        runs.setdefault("one_process_s", []).append(seconds)
        torch.set_num_threads(1)
        try:
            seconds, one_thread = evaluate(policy, games)
        finally:
            torch.set_num_threads(threads)
        runs.setdefault("one_process_one_thread_s", []).append(seconds)
        runs.setdefault("policy_load_s", []).append(timed(load_policy, policy)[0])
        started = time.perf_counter()
        with ray_cluster(compute):
            runs.setdefault("ray_start_s", []).append(time.perf_counter() - started)
            on_ray = on_compute(evaluate, compute)
            seconds, cold = on_ray(policy, games)
            runs.setdefault("ray_cold_s", []).append(seconds)
            seconds, warm = on_ray(policy, games)
            runs.setdefault("ray_warm_s", []).append(seconds)
        checked = {"one process": local, "one thread": one_thread, "ray cold": cold, "ray warm": warm}
        for name, result in checked.items():
            if result != reference:
                raise SystemExit(f"{name}: the report differs from the one-process report")

    median = {name: statistics.median(values) for name, values in runs.items()}
    episodes = reference[0]["episodes"]
    share = largest_share(args.count, args.workers)
    parallel = median["one_process_one_thread_s"] - median["policy_load_s"]
    serial = max(0.0, median["ray_warm_s"] - parallel * share)
    cold_extra = median["ray_start_s"] + median["ray_cold_s"] - median["ray_warm_s"]

    def on_cluster(machines: int, count: int) -> float:
        return serial + parallel * count / args.count * largest_share(count, machines * args.workers)

    cluster = {
        f"{machines}x{args.workers}cpu": {
            "evaluation_s": on_cluster(machines, args.count),
            f"evaluation_s_{args.count * 5}_games": on_cluster(machines, args.count * 5),
        }
        for machines in (1, 2, 4, 8)
    }
    # The fewest games at which a warm Ray beats one process (L + t * G); None: not below 10000.
    one_process_per_game = (median["one_process_s"] - median["policy_load_s"]) / args.count
    break_even = next(
        (
            count
            for count in range(1, 10_000)
            if serial + parallel / args.count * count * largest_share(count, args.workers)
            < median["policy_load_s"] + one_process_per_game * count
        ),
        None,
    )
    ratio = median["one_process_s"] / median["ray_warm_s"]
    sentence = (
        f"One evaluation of {args.count} games: {median['one_process_s']:.1f} s in one process, "
        f"{median['ray_warm_s']:.1f} s on a warm local Ray of {args.workers} workers (x{ratio:.2f}; the first of a "
        f"run adds {cold_extra:.1f} s to start Ray and its workers). Serial part s = {serial:.1f} s (Prefect task "
        f"runs, policy load per shard, transfers), parallel part p = {parallel:.1f} s of play on one CPU; the "
        f"{args.count} games make {math.ceil(args.count / BATCH)} shards of whole "
        f"16-episode batches, so N machines of {args.workers} CPUs take about s + p x (largest shard's share): "
        + ", ".join(f"{name} {value['evaluation_s']:.1f} s" for name, value in cluster.items())
        + f"; for {args.count * 5} games "
        + ", ".join(f"{name} {value[f'evaluation_s_{args.count * 5}_games']:.1f} s" for name, value in cluster.items())
        + (
            f". Ray pays from about {break_even:.0f} games per evaluation on this machine."
            if break_even is not None
            else ". Below 10000 games a warm Ray never beats one process on this machine."
        )
    )
    report = {
        "machine": machine(),
        "command": "benchmarks/ray_evaluation.py",
        "games_dir": str(args.games),
        "eval_set": eval_set_id([Path(game).name for game in games], {"count": args.count}, SEED),
        "policy": str(args.policy),
        "policy_digest": file_digest(args.policy)[:16],
        "count": args.count,
        "episodes": episodes,
        "real_transitions": reference[0]["real_transitions"],
        "success_rate": reference[0]["success_rate"],
        "workers": args.workers,
        "torch_threads_one_process": threads,
        "repeats": args.repeats,
        "identical_reports": True,  # checked above: every run gave the one-process records
        "median": median,
        "episodes_per_s": {
            name: episodes / median[name]
            for name in ("one_process_s", "one_process_one_thread_s", "ray_cold_s", "ray_warm_s")
        },
        "ratio_one_process_over_ray_warm": ratio,
        "ratio_one_process_over_ray_cold_with_start": median["one_process_s"]
        / (median["ray_start_s"] + median["ray_cold_s"]),
        "amdahl": {
            "serial_s": serial,
            "parallel_s": parallel,
            "largest_shard_share": share,
            "first_evaluation_extra_s": cold_extra,
            "cluster_estimate": cluster,
            "break_even_games": break_even,
        },
        "summary": sentence,
        "runs": runs,
    }
    for name, value in median.items():
        print(f"{name:30s} {value:8.2f}")
    print(sentence)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
