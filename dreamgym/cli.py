"""`dreamgym` command line. Each command is a thin shell over the library (or a flow).

Options left out take their value from `params.yaml` (`--params`). Bad input ends with one line
`error: ...` naming the problem and the fix, and exit code 2; a validation over its threshold
exits 1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer._click.exceptions import UsageError  # typer 0.29 vendors click and does not re-export it

from dreamgym.config import PipelineConfig, load_config
from dreamgym.data.config import GAME_SEED_STRIDE, MAX_SEED
from dreamgym.errors import DreamgymError

# Help texts are plain text: with rich markup on, their "[default: key]" notes were eaten as tags.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="DreamGym: RL for LLM agents in a learned experience model.",
)
console = Console(stderr=True, soft_wrap=True)

ParamsOption = Annotated[
    Path, typer.Option("--params", help="Parameter file (the pipeline's one source of parameters).")
]


# The flows the CLI starts, named by entrypoint as a deployment names them: the library never imports
# flows/ (the flows import the library).
PIPELINE = "flows.pipeline:pipeline"
BENCH = "flows.bench:bench"
ABLATION = "flows.train_experience:ablation"


def _start_flow(entrypoint: str, *args: Any, **kwargs: Any) -> Any:
    """Run a flow of flows/ in this process. Call after `configure_services`: Prefect reads its
    settings when it is imported."""
    from prefect.flows import load_flow_from_entrypoint

    return load_flow_from_entrypoint(entrypoint, use_placeholder_flow=False)(*args, **kwargs)


def _config(params: Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    return load_config(params, {k: v for k, v in (overrides or {}).items() if v is not None})


@app.command()
def run(
    params: ParamsOption = Path("params.yaml"),
    refresh: Annotated[bool, typer.Option(help="Recompute every stage, ignoring cached results.")] = False,
    until: Annotated[
        str,
        typer.Option(
            help="Stop after this stage: ingest, experience, policy or "
            "promotion (the DVC stages run the pipeline stage by stage)."
        ),
    ] = "promotion",
) -> None:
    """The main job: the whole pipeline on the configured (by default embedded) services."""
    config = _config(params)  # a bad parameter file is reported before any service starts
    from dreamgym.preflight import check_servers
    from dreamgym.tracking import configure_services

    services = configure_services(params.resolve().parent / config.paths.run_dir)
    check_servers()  # a shared server that is down: one error now, not a traceback minutes in
    result = _start_flow(PIPELINE, str(params), refresh=refresh, until=until)
    table = Table(title="dreamgym run", show_header=False)
    for label, value in result.rows():
        table.add_row(label, value)
    out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)  # a log file gets whole rows
    out.print(table)
    # A shared server shows its UI at its own address; the embedded stores need a UI started.
    tracking, prefect_api = services["MLFLOW_TRACKING_URI"], os.environ.get("PREFECT_API_URL")
    mlflow_ui = tracking if tracking.startswith("http") else f"mlflow ui --backend-store-uri {tracking}"
    prefect_ui = prefect_api.removesuffix("/api") if prefect_api else None
    prefect_ui = prefect_ui or f"PREFECT_HOME={services['PREFECT_HOME']} prefect server start"
    out.print(f"MLflow UI:  {mlflow_ui}\nPrefect UI: {prefect_ui}")


@app.command()
def lineage(
    model: Annotated[
        str,
        typer.Argument(
            help="A registered version: models:/dreamgym-policy/N, "
            "models:/dreamgym-policy@champion, or a bare name (latest)."
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """The chain behind a model version: its run, the experience model, the data, the config."""
    from rich.tree import Tree

    from dreamgym.lineage import lineage as walk
    from dreamgym.tracking import configure_services

    config = _config(params)
    configure_services(params.resolve().parent / config.paths.run_dir)
    links = walk(model)
    if as_json:
        print(json.dumps([{"kind": link.kind, "label": link.label, **link.facts} for link in links], indent=2))
        return
    root = node = Tree(f"{links[0].kind}: {links[0].label}")
    for index, link in enumerate(links):
        if index:
            node = node.add(f"{link.kind}: {link.label}")
        for key, value in link.facts.items():
            node.add(f"{key}: {value}")
    Console(soft_wrap=True).print(root)


@app.command()
def bench(
    games: Annotated[
        Path, typer.Option("--games", help="Held-out games every row is evaluated on (e.g. data/games/test).")
    ],
    json_out: Annotated[
        Path, typer.Option("--json", help="Where to write the rows (JSON; the Markdown table and PNG go beside it).")
    ],
    seeds: Annotated[str | None, typer.Option(help="Comma-separated training seeds [default: params seed].")] = None,
    real_budget: Annotated[
        int | None,
        typer.Option(min=1, help="N: real transitions of real-env RL (S2R gets N/10) [default: rl.real_budget]."),
    ] = None,
    rows: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated rows to run [default: all: bc, real-grpo, "
            "real-ppo, dreamgym-grpo, dreamgym-ppo, dreamgym-s2r-grpo, "
            "no-retrieval, no-history, no-reasoning, no-curriculum]."
        ),
    ] = None,
    held_out: Annotated[
        int,
        typer.Option(
            help="Held-out games every row plays (the first N of --games; "
            "100 give a 95% interval of about ±10 points).",
            min=1,
        ),
    ] = 100,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """The paper's regimes and ablations on the same data and held-out games (dreamgym/benchmark.py)."""
    from dreamgym.benchmark import bench_plan, check_targets, markdown
    from dreamgym.tracking import configure_services

    config = _config(params)
    try:
        seed_list = [int(seed) for seed in seeds.split(",")] if seeds else None
    except ValueError:
        raise DreamgymError(f"--seeds {seeds!r}: give whole numbers separated by commas, e.g. 0,1,2") from None
    row_names = [name.strip() for name in rows.split(",")] if rows else None
    bench_plan(real_budget or config.rl.real_budget, row_names)  # bad rows or budget: before services start
    from dreamgym.preflight import check_servers

    configure_services(params.resolve().parent / config.paths.run_dir)
    check_servers()
    results = _start_flow(
        BENCH, str(params), str(games), str(json_out), seed_list, real_budget, row_names, held_out=held_out
    )
    Console(soft_wrap=True).print(markdown(results, check_targets(results)), markup=False)


@app.command()
def games(
    split: Annotated[str, typer.Option(help="train, valid or test (tw-cooking's food splits).")] = "train",
    count: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=GAME_SEED_STRIDE,
            help="Games to make [default: games.train_count, or games.test_count for held-out splits].",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(min=0, max=MAX_SEED, help="Base seed [default: params seed].")] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder [default: <data_dir>/games/<split>].")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Parallel tw-make processes.")] = None,
    recipe: Annotated[
        list[int] | None, typer.Option(help="Ingredients per recipe, repeatable [default: games.recipe].")
    ] = None,
    take: Annotated[
        list[int] | None, typer.Option(help="Ingredients to find, repeatable [default: games.take].")
    ] = None,
    go: Annotated[list[int] | None, typer.Option(help="Rooms (1, 6, 9 or 12), repeatable [default: games.go].")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Generate TextWorld cooking games (skips those that exist). Settings other than the training
    data's make a shifted set: `--split test --recipe 3 --go 9 --out data/games/shifted`."""
    from dreamgym.data.games import check_split, generate_games, plan_games

    check_split(split)
    settings = {"games.recipe": recipe, "games.take": take, "games.go": go}
    config = _config(params, {"games.workers": workers, "seed": seed} | {k: v for k, v in settings.items() if v})
    if count is None:  # held-out splits (valid, test) share test_count
        count = config.games.train_count if split == "train" else config.games.test_count
    seed = config.seed
    out = out or params.resolve().parent / config.paths.data_dir / "games" / split
    paths, made = generate_games(plan_games(config.games, split, count, seed), out, workers=config.games.workers)
    console.print(f"{len(paths)} {split} games in {out}: {made} made, {len(paths) - made} already there")


@app.command()
def collect(
    games: Annotated[Path, typer.Option("--games", help="Folder of .z8 games.")],
    out: Annotated[Path, typer.Option(help="Output Parquet file.")],
    episodes_per_game: Annotated[int | None, typer.Option(min=1, help="Episodes per game.")] = None,
    policy: Annotated[str | None, typer.Option(help="expert, noisy-expert or random.")] = None,
    epsilon: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="Random-action rate of noisy-expert.")] = None,
    seed: Annotated[int | None, typer.Option(min=0, max=MAX_SEED, help="Seed [default: params seed].")] = None,
    max_steps: Annotated[int | None, typer.Option(min=1, help="Step limit per episode.")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Parallel processes.")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Play episodes on every game of a folder and write transitions to Parquet."""
    from dreamgym.data.collect import CollectionSettings
    from dreamgym.data.collect import collect as collect_games
    from dreamgym.data.games import list_games

    config = _config(
        params,
        {
            "collect.episodes_per_game": episodes_per_game,
            "collect.policy": policy,
            "collect.epsilon": epsilon,
            "collect.workers": workers,
            "env.max_steps": max_steps,
            "seed": seed,
        },
    )
    settings = CollectionSettings.from_config(config)
    result = collect_games(list_games(games), out, settings, workers=config.collect.workers)
    verb = "reused" if result.reused else f"collected in {result.seconds:.1f}s:"
    console.print(
        f"{out}: {verb} {result.transitions} transitions, {result.trajectories} "
        f"trajectories, success rate {result.success_rate:.1%}"
    )


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="Transitions Parquet file.")],
    quarantine: Annotated[Path | None, typer.Option(help="Where to write quarantined rows with their reasons.")] = None,
    max_bad_fraction: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="Largest quarantined fraction that passes.")
    ] = None,
    report: Annotated[Path | None, typer.Option(help="Great Expectations result (JSON).")] = None,
    clean: Annotated[Path | None, typer.Option(help="Where to write the rows that passed.")] = None,
    metrics: Annotated[Path | None, typer.Option(help="Summary figures (JSON), e.g. for DVC.")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Check transitions with Great Expectations; quarantine bad rows (and their trajectories)."""
    from dreamgym.data.validation import validate_transitions

    config = _config(params, {"validation.max_bad_fraction": max_bad_fraction})
    result = validate_transitions(
        file, config.validation, quarantine_path=quarantine, report_path=report, clean_path=clean, metrics_path=metrics
    )
    console.print(result.summary(), markup=False)
    if not result.passed:
        raise typer.Exit(1)


@app.command("check-env")
def check_env_command(
    games: Annotated[Path, typer.Option("--games", help="Folder of .z8 games.")],
    max_steps: Annotated[int | None, typer.Option(min=1, help="Step limit per episode.")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Run the environment conformance check on the TextWorld adapter over a folder of games."""
    from dreamgym.data.games import list_games
    from dreamgym.envs.checker import check_env
    from dreamgym.envs.textworld_env import TextWorldEnv, load_task

    config = _config(params, {"env.max_steps": max_steps})
    tasks = [load_task(game) for game in list_games(games)]
    check_env(lambda: TextWorldEnv(max_steps=config.env.max_steps), tasks)
    console.print(f"check_env passed on {len(tasks)} games")


buffer_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The experience replay buffer (Postgres + pgvector; DATABASE_URL or embedded).",
)
app.add_typer(buffer_app, name="buffer")


def _open_buffer(params: Path, config: PipelineConfig):
    from dreamgym.buffer.migrations import open_migrated

    run_dir = params.resolve().parent / config.paths.run_dir
    return open_migrated(run_dir, config.buffer)


@buffer_app.command("ingest")
def buffer_ingest(
    file: Annotated[Path, typer.Argument(help="Transitions Parquet file (validated).")],
    data_version: Annotated[str | None, typer.Option(help="Dataset version to record (DVC md5).")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Upsert transitions (embedding only those not stored yet); prints {"inserted", "skipped"}."""
    from dreamgym.buffer.store import ingest_file
    from dreamgym.data.schema import read_transitions

    config = _config(params)
    read_transitions(file)  # a bad file is reported before any server starts
    with _open_buffer(params, config) as database:
        result = ingest_file(
            database,
            file,
            config.buffer,
            data_version,
            reward_range=(config.validation.reward_min, config.validation.reward_max),
        )
    print(json.dumps({"inserted": result.inserted, "skipped": result.skipped}))


@buffer_app.command("query")
def buffer_query(
    task: Annotated[str, typer.Option(help="A task id in the buffer, or a task instruction.")],
    state: Annotated[str, typer.Option(help="The abstract state text.")],
    action: Annotated[str, typer.Option(help="The action.")],
    k: Annotated[int, typer.Option("-k", "--k", min=1, max=1000, help="Neighbours to return.")] = 4,
    env: Annotated[str | None, typer.Option(help="Only this environment.")] = None,
    source: Annotated[str | None, typer.Option(help="Only real or synthetic transitions.")] = None,
    exclude_task: Annotated[bool, typer.Option(help="Leave out the query's own task.")] = False,
    ef_search: Annotated[int | None, typer.Option(min=1, help="HNSW ef_search [default: buffer.ef_search].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """The transitions most similar to (task, state, action)."""
    from sqlalchemy import text

    from dreamgym.buffer.embeddings import Encoder, transition_text
    from dreamgym.buffer.retrieval import Filters, search

    config = _config(params, {"buffer.ef_search": ef_search})
    if source not in (None, "real", "synthetic"):
        raise DreamgymError(f"--source must be real or synthetic, got {source!r}")
    with _open_buffer(params, config) as database:
        with database.engine.connect() as connection:
            instruction = connection.execute(
                text("SELECT instruction FROM tasks WHERE task_id = :t"), {"t": task}
            ).scalar()
        filters = Filters(env=env, source=source, exclude_task_id=task if exclude_task and instruction else None)
        vector = Encoder(config.buffer.encoder).encode([transition_text(instruction or task, state, action)])
        [neighbours] = search(database, vector, k, filters, config.buffer.ef_search)
    hits = [{"similarity": round(n.similarity, 6), **n.transition} for n in neighbours]
    if as_json:
        print(json.dumps(hits, indent=2))
        return
    table = Table("similarity", "task", "step", "action", "reward", "done")
    for hit in hits:
        table.add_row(
            f"{hit['similarity']:.3f}",
            hit["task_id"],
            str(hit["step"]),
            hit["action"],
            f"{hit['reward']:g}",
            str(hit["terminated"] or hit["truncated"]),
        )
    Console().print(table)


@buffer_app.command("stats")
def buffer_stats_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Counts by source and environment, index present, rows without embedding."""
    from dreamgym.buffer.stats import buffer_stats

    config = _config(params)
    with _open_buffer(params, config) as database:
        stats = buffer_stats(database)
    if as_json:
        print(json.dumps(stats, indent=2))
        return
    table = Table(title="buffer", show_header=False)
    table.add_row("database", stats["database"])
    for key in ("transitions", "trajectories", "tasks", "without_embedding", "hnsw_index"):
        table.add_row(key, str(stats[key]))
    for group in stats["by_source_env"]:
        table.add_row(f"{group['source']} / {group['env']}", str(group["transitions"]))
    Console().print(table)


experience_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="The experience model (a learned environment)."
)
app.add_typer(experience_app, name="experience")


@experience_app.command("eval")
def experience_eval(
    games: Annotated[Path, typer.Option(help="Folder of held-out games (e.g. data/games/test).")],
    json_out: Annotated[Path, typer.Option("--json", help="Where to write the fidelity report.")],
    model: Annotated[
        str,
        typer.Option(
            help="A model folder, models:/name/version, models:/name@alias, or a registered name (its latest version)."
        ),
    ] = "dreamgym-experience",
    eval_games: Annotated[
        int | None, typer.Option(min=0, help="Games to use, 0 for all [default: experience.eval_games].")
    ] = None,
    no_model: Annotated[
        bool,
        typer.Option(
            "--no-model",
            help="Measure no model instead: the top neighbour the model's prompt shows, its change applied "
            "(what the model adds is the difference).",
        ),
    ] = False,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Fidelity of an experience model against the real game, on real transitions it never saw,
    in all and per game setting."""

    from dreamgym.data.collect import collect_held_out
    from dreamgym.data.games import game_setting
    from dreamgym.data.schema import read_transitions
    from dreamgym.experience.fidelity import evaluate, setting_table
    from dreamgym.experience.generate import open_experience_model
    from dreamgym.experience.report import log_fidelity
    from dreamgym.registry import resolve_model
    from dreamgym.tracking import configure_services, stage_run

    config = _config(params, {"experience.eval_games": eval_games})
    project = params.resolve().parent
    run_dir = project / config.paths.run_dir
    if not games.is_dir():
        raise DreamgymError(f"--games {games}: no such folder; make held-out games with `dreamgym games --split test`")
    configure_services(run_dir)
    model_dir, label = resolve_model(model, run_dir / "models")
    real = collect_held_out(
        games, project / config.paths.outputs_dir / "experience" / f"eval-{games.resolve().name}.parquet", config
    )
    tags = {"dreamgym.model": label, "dreamgym.eval_games": str(games.resolve()), "dreamgym.no_model": str(no_model)}
    with stage_run("experience-eval", config, project, tags=tags):
        with open_experience_model(model_dir, run_dir, config, copy_neighbours=no_model) as experience:
            report = evaluate(
                experience,
                read_transitions(real).to_pylist(),
                config.experience.multi_step,
                progress=True,
                setting_of=game_setting,
            )
        summary = log_fidelity(report)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps({"model": label, "no_model": no_model, **summary}, indent=2))
    console.print(
        f"next-state exact match {summary['next_state_exact_match']:.1%}, reward accuracy "
        f"{summary['reward_accuracy']:.1%}, done accuracy {summary['done_accuracy']:.1%}, "
        f"parse failures {summary['parse_failure_rate']:.1%} on {summary['transitions']} "
        f"transitions → {json_out}"
    )
    foreseen = summary["foreseeable"]
    console.print(
        f"on the {foreseen['transitions']} foreseeable ones (next state names only what the "
        f"prompt shows): exact match {foreseen['next_state_exact_match']:.1%}, reward "
        f"{foreseen['reward_accuracy']:.1%}, done {foreseen['done_accuracy']:.1%}"
    )
    console.print(setting_table(summary["by_setting"]))


@experience_app.command("ablate")
def experience_ablate(params: ParamsOption = Path("params.yaml")) -> None:
    """Train and measure the experience model without retrieval, history or reasoning (same data,
    seed and budget), and measure no model (the top neighbour's change copied); writes
    outputs/experience/ablation.{md,json,png} and logs them to MLflow."""
    config = _config(params)
    from dreamgym.tracking import configure_services

    configure_services(params.resolve().parent / config.paths.run_dir)
    result = _start_flow(ABLATION, str(params))
    Console(soft_wrap=True).print(result["table"])


@app.command("eval")
def policy_eval(
    policy: Annotated[
        str,
        typer.Option(
            help="A policy folder, models:/name/version, models:/name@alias, or a registered name (its latest version)."
        ),
    ],
    games: Annotated[
        Path,
        typer.Option(
            help="Folder of held-out games (e.g. data/games/test); evaluation.games of them (0: all), evenly spread "
            "over their sorted names."
        ),
    ],
    json_out: Annotated[
        Path,
        typer.Option(
            "--json", help="Where to write the report; the per-episode table goes beside it as <name>.episodes.csv."
        ),
    ],
    episodes_per_game: Annotated[
        int | None, typer.Option(min=1, help="Episodes per game [default: evaluation.episodes_per_game].")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(min=0, max=MAX_SEED, help="Seed of the sampled actions [default: params seed].")
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option(min=1, help="Step limit per episode [default: evaluation.max_steps].")
    ] = None,
    sample: Annotated[
        bool | None,
        typer.Option(
            "--sample/--greedy", help="Sample actions (seeded) or take the most likely [default: evaluation.greedy]."
        ),
    ] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Success rate of a policy in the real game on held-out games, with its 95% interval."""

    from dreamgym.envs.textworld_env import load_task
    from dreamgym.evaluation import (
        episodes_path,
        evaluate_policy,
        held_out_games,
        log_evaluation,
        write_episodes,
        write_json,
    )
    from dreamgym.policy.model import load_policy
    from dreamgym.registry import resolve_model
    from dreamgym.tracking import configure_services, stage_run

    config = _config(
        params,
        {
            "evaluation.episodes_per_game": episodes_per_game,
            "seed": seed,
            "evaluation.max_steps": max_steps,
            "evaluation.greedy": None if sample is None else not sample,
        },
    )
    settings = config.evaluation
    project = params.resolve().parent
    run_dir = project / config.paths.run_dir
    game_files = held_out_games(config, games)
    if not policy.startswith("models:/") and "/" in policy and not Path(policy).is_dir():  # a path, not a name
        raise DreamgymError(
            f"--policy {policy}: no such folder; train a policy first (`dreamgym run`) or "
            "give a registered one, e.g. models:/dreamgym-policy@champion"
        )
    for game in game_files:  # a damaged game is reported before a run is opened, not as a FAILED run
        load_task(game)
    configure_services(run_dir)
    policy_dir, label = resolve_model(policy, run_dir / "models")
    agent = load_policy(policy_dir, config.policy)
    tags = {"dreamgym.policy": label, "dreamgym.eval_games": str(games.resolve())}
    eval_params = {
        "games": len(game_files),
        "episodes_per_game": settings.episodes_per_game,
        "seed": config.seed,
        "max_steps": settings.max_steps,
        "greedy": settings.greedy,
    }
    with stage_run("policy-eval", config, project, tags=tags, params=eval_params):
        report = evaluate_policy(
            agent,
            game_files,
            settings.episodes_per_game,
            config.seed,
            settings.max_steps,
            greedy=settings.greedy,
            progress=True,
        )
        write_json(
            {
                "policy": label,
                "games": len(game_files),
                "seed": config.seed,
                "episodes_per_game": settings.episodes_per_game,
                "max_steps": settings.max_steps,
                "greedy": settings.greedy,
                **report.summary,
            },
            json_out,
        )
        write_episodes(report.records, episodes_path(json_out))
        log_evaluation(report, json_out)
    summary = report.summary
    lo, hi = summary["ci95"]
    console.print(
        f"{label}: success {summary['success_rate']:.1%} (95% CI {lo:.1%}-{hi:.1%}) over "
        f"{summary['episodes']} episodes on {len(game_files)} games, mean return "
        f"{summary['mean_return']:.2f}, mean steps {summary['mean_steps']:.1f}, "
        f"{summary['real_transitions']} real transitions → {json_out}",
        markup=False,
    )


@app.command()
def promote(
    version: Annotated[
        str | None, typer.Option(help="Policy version to gate [default: the version aliased challenger].")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Decide and print only; change nothing in the registry.")
    ] = False,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Make a policy version champion if it beats the champion (or BC) on the held-out games by
    more than promotion.margin, significantly (promotion.alpha); record the decision on it."""
    from dreamgym.promotion import (
        CHALLENGER_ALIAS,
        POLICY_MODEL_NAME,
        alias_version,
        describe,
        gate,
        held_out_evaluator,
    )
    from dreamgym.tracking import configure_services

    config = _config(params)
    project = params.resolve().parent
    configure_services(project / config.paths.run_dir)
    version = version or alias_version(POLICY_MODEL_NAME, CHALLENGER_ALIAS)
    if version is None:
        raise DreamgymError("no challenger; run the pipeline (dreamgym run) first")
    decision = gate(
        POLICY_MODEL_NAME, version, config.promotion, evaluate=held_out_evaluator(config, project), dry_run=dry_run
    )
    console.print(describe(decision, dry_run), markup=False)


@app.command()
def serve(
    name: Annotated[str, typer.Option("--name", help="Deployment of prefect.yaml to serve.")] = "nightly",
    port: Annotated[
        int,
        typer.Option(min=1, max=65535, help="Port of the local Prefect server started when PREFECT_API_URL is unset."),
    ] = 4200,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Serve a deployment of prefect.yaml from this machine, on its schedule and with its
    parameters (no work pool or worker). Uses the Prefect server PREFECT_API_URL names, else starts
    one here (the temporary one has no scheduler) with its UI at http://127.0.0.1:PORT."""
    import contextlib

    from dreamgym.schedule import load_deployment, local_prefect_server
    from dreamgym.tracking import configure_services

    config = _config(params)
    project = params.resolve().parent
    services = configure_services(project / config.paths.run_dir)
    spec = load_deployment(project, name)
    served_params = spec.parameters.get("params")
    if served_params is not None and (project / str(served_params)).resolve() != params.resolve():
        raise DreamgymError(
            f"--params {params}: deployment {spec.name!r} runs with params="
            f"{served_params!r} (prefect.yaml); serve that file, or change the "
            "deployment's parameters in prefect.yaml"
        )
    from prefect.settings import PREFECT_API_URL, temporary_settings  # after configure_services

    from dreamgym.schedule import deployment_options, load_flow

    with contextlib.ExitStack() as stack:
        if not PREFECT_API_URL.value():
            console.print(f"starting a local Prefect server (UI http://127.0.0.1:{port}) ...")
            url = stack.enter_context(local_prefect_server(services["PREFECT_HOME"], port))
            stack.enter_context(temporary_settings({PREFECT_API_URL: url}))
        os.chdir(project)  # every run resolves the entrypoint and the relative params path here
        pipeline_flow = load_flow(spec, project)
        print(
            f"serving {pipeline_flow.name}/{spec.name} from {project / 'prefect.yaml'}: cron "
            f"'{spec.cron}' ({spec.timezone}), parameters {json.dumps(spec.parameters)}; run it now with "
            f"`prefect deployment run '{pipeline_flow.name}/{spec.name}'`; Ctrl+C stops serving",
            flush=True,
        )
        pipeline_flow.serve(**deployment_options(spec), print_starting_message=False)


@app.command()
def deploy(
    name: Annotated[str, typer.Option("--name", help="Deployment of prefect.yaml to register.")] = "nightly",
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Register a deployment of prefect.yaml on the Prefect server PREFECT_API_URL names (what
    `prefect deploy --name NAME` does; that command fails in Prefect 3.8.8 here). The work pool's
    worker then runs it on its schedule, or now with `prefect deployment run`."""
    from dreamgym.schedule import load_deployment

    if not os.environ.get("PREFECT_API_URL"):
        raise DreamgymError(
            "PREFECT_API_URL is not set: a deployment is registered on a shared Prefect server "
            "(`dreamgym stack up` starts one and writes its URL to client.env); to run on a schedule "
            "without one, use `dreamgym serve`"
        )
    project = params.resolve().parent
    spec = load_deployment(project, name)
    from dreamgym.schedule import register_deployment

    full_name = register_deployment(spec, project)
    console.print(
        f"deployment {full_name} on {os.environ['PREFECT_API_URL']}: cron '{spec.cron}' ({spec.timezone}), "
        f"work pool {spec.work_pool}; run it now with `prefect deployment run '{full_name}'`",
        markup=False,
    )


stack_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The team stack as local processes: Postgres + pgvector, MLflow server, Prefect server and worker, "
    "optionally a Ray head (infra/README.md).",
)
app.add_typer(stack_app, name="stack")

EnvFileOption = Annotated[
    Path,
    typer.Option("--env-file", help="Ports and passwords (copy infra/.env.example; never commit it)."),
]
StackDirOption = Annotated[Path, typer.Option("--dir", help="The stack's folder: data, logs, client.env, pids.")]


def _stack(env_file: Path, stack_dir: Path, project: Path = Path("."), ray: bool = False, ray_cpus: int | None = None):
    from dreamgym.stack.processes import Stack, recorded_services
    from dreamgym.stack.services import RAY
    from dreamgym.stack.settings import load_settings

    with_ray = ray or RAY in recorded_services(stack_dir)
    return Stack(stack_dir, load_settings(env_file), project, with_ray=with_ray, ray_cpus=ray_cpus)


@stack_app.command("up")
def stack_up(
    env_file: EnvFileOption = Path("infra/.env"),
    stack_dir: StackDirOption = Path(".dreamgym/stack"),
    project: Annotated[Path, typer.Option("--project", help="The checkout the worker runs deployments from.")] = Path(
        "."
    ),
    ray: Annotated[bool, typer.Option("--ray/--no-ray", help="Also start a Ray head.")] = False,
    ray_cpus: Annotated[
        int | None, typer.Option(min=1, max=4096, help="CPUs the Ray head offers [default: all].")
    ] = None,
) -> None:
    """Start the services that are not running (each waits for its health check) and write the
    pipeline's environment to DIR/client.env."""
    stack = _stack(env_file, stack_dir, project, ray, ray_cpus)
    env_file_out = stack.up(progress=lambda line: console.print(line, markup=False))
    console.print(f"the stack is up; point the pipeline at it with:  set -a; . {env_file_out}; set +a", markup=False)


@stack_app.command("down")
def stack_down(
    env_file: EnvFileOption = Path("infra/.env"), stack_dir: StackDirOption = Path(".dreamgym/stack")
) -> None:
    """Stop the stack's services (its data stays in DIR)."""
    _stack(env_file, stack_dir).down(progress=lambda line: console.print(line, markup=False))


@stack_app.command("status")
def stack_status(
    env_file: EnvFileOption = Path("infra/.env"), stack_dir: StackDirOption = Path(".dreamgym/stack")
) -> None:
    """Each service: its process, whether its health check answers, its log. Exit 1 if one is down."""
    stack = _stack(env_file, stack_dir)
    table = Table("service", "pid", "healthy", "log")
    statuses = stack.status()
    for status in statuses:
        table.add_row(
            status.name, str(status.pid or "-"), "yes" if status.healthy else "NO", str(stack.log_path(status.name))
        )
    Console(soft_wrap=True).print(table)
    if not all(status.healthy for status in statuses):
        raise typer.Exit(1)


@stack_app.command("restart")
def stack_restart(
    service: Annotated[str, typer.Argument(help="postgres, mlflow, prefect-server, prefect-worker or ray.")],
    env_file: EnvFileOption = Path("infra/.env"),
    stack_dir: StackDirOption = Path(".dreamgym/stack"),
) -> None:
    """Stop one service and start it again (a running pipeline's retries ride it out)."""
    stack = _stack(env_file, stack_dir)
    if service not in stack.services:
        raise DreamgymError(f"no service {service!r} in this stack; use one of {', '.join(stack.services)}")
    stack.restart(service)
    console.print(f"{service}: restarted", markup=False)


def main() -> None:
    try:
        sys.exit(app(standalone_mode=False))
    except DreamgymError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except UsageError as error:  # a bad option or value: one line, like every other bad input
        names, context = [], error.ctx
        while context is not None and context.parent is not None:  # the root's name is how it was started
            names.append(context.info_name)
            context = context.parent
        command = " ".join(["dreamgym", *reversed(names)])
        print(f"error: {error.format_message()} (see `{command} --help`)", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:  # Ctrl-C at a prompt
        sys.exit(130)


if __name__ == "__main__":
    main()
