"""`dreamgym bench`: the paper's three regimes and ablations, trained and evaluated alike.

One MLflow parent run; the offline data is made once (ingest) and every row runs the experience
and policy flows with its overrides (dreamgym/ops/benchmark.py), evaluated on the same held-out games.
The flows' task cache shares what rows have in common: the experience model is trained once for
every row that does not ablate it, BC once for all. Models are not registered: a benchmark does
not compete for promotion.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import mlflow
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from dreamgym.config import config_to_dict, flatten, load_config
from dreamgym.envs.real import list_games
from dreamgym.errors import DreamgymError
from dreamgym.ops.benchmark import bench_plan, dream_budget, machine, plot, row_result, write_bench
from dreamgym.ops.tracking import configure_services, stage_run
from flows.ingest import ingest
from flows.train_experience import train_experience
from flows.train_policy import train_policy

HELD_OUT_GAMES = 100


@flow(name="dreamgym-bench")
def bench(
    params: str,
    games: str,
    json_out: str,
    seeds: list[int] | None = None,
    real_budget: int | None = None,
    rows: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    held_out: int = HELD_OUT_GAMES,
    synthetic_budget: int | None = None,
) -> list[dict]:
    """Train and evaluate every row of the plan for each seed on the first `held_out` games of
    `games` (100 by default: a Wilson interval of about ±10 points, where make run's 40 give ±15);
    write JSON, Markdown and PNG beside `json_out` and log them to the parent run. Returns the rows."""
    params_path = Path(params).resolve()
    project = params_path.parent
    overrides = {**(overrides or {}), "evaluation.games": held_out}
    base = load_config(params_path, overrides)
    games_dir = Path(games).resolve()
    if not games_dir.is_dir():
        raise DreamgymError(
            f"--games {games}: no such folder; make held-out games with "
            f"`dreamgym games --split test --count {held_out}`"
        )
    found = len(list_games(games_dir))
    if found < held_out:
        raise DreamgymError(
            f"--games {games} holds {found} games, the bench evaluates {held_out}; make them "
            f"with `dreamgym games --split test --count {held_out}` (or pass --held-out {found})"
        )
    seeds = seeds or [base.seed]
    budget = real_budget or base.rl.real_budget
    plan = bench_plan(budget, rows, synthetic_budget)
    synthetic = dream_budget(budget, synthetic_budget)
    run_dir = project / base.paths.run_dir
    configure_services(run_dir)
    out = Path(json_out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    where = machine()
    params = flatten(config_to_dict(base)) | {
        "bench.seeds": ",".join(map(str, seeds)),
        "bench.real_budget": budget,
        "bench.synthetic_budget": synthetic,
        "bench.rows": ",".join(row.name for row in plan),
    }
    with stage_run("bench", base, project, params=params):
        ingested = dataclasses.replace(ingest(base, str(project)), test_games_dir=str(games_dir))
        results = []
        for seed in seeds:
            for row in plan:
                config = load_config(params_path, {**(overrides or {}), **row.overrides, "seed": seed})
                started = time.monotonic()
                experience = train_experience(
                    config,
                    ingested,
                    str(project),
                    register_model=False,
                    run_name=f"bench experience: {row.name} s{seed}",
                )
                policy = train_policy(config, ingested, experience, str(project), register_model=False)
                result = row_result(row.name, seed, dataclasses.asdict(policy), time.monotonic() - started)
                results.append(
                    result
                    | {
                        "machine": where,
                        "real_budget": budget,
                        "synthetic_budget": synthetic,
                        "experience_fidelity": experience.fidelity["next_state_exact_match"],
                    }
                )
                get_run_logger().info(
                    "%s (seed %d): success %.1f%%, %d real / %d synthetic transitions",
                    row.name,
                    seed,
                    100 * result["success_rate"],
                    result["real_transitions"],
                    result["synthetic_transitions"],
                )
                mlflow.log_metrics(
                    {
                        f"{row.name}_s{seed}_success_rate": result["success_rate"],
                        f"{row.name}_s{seed}_real_transitions": result["real_transitions"],
                    }
                )
                targets, table = write_bench(results, out, base.bench)
        figure = plot(results, out.with_suffix(".png"))
        for path in (out, out.with_suffix(".md"), figure):
            mlflow.log_artifact(str(path), artifact_path="bench")
        mlflow.log_dict(targets, "bench/targets.json")
        create_markdown_artifact(
            key="bench",
            markdown="## dreamgym bench\n\n" + table,
            description="The paper's regimes and ablations on the held-out games",
        )
        return results
