"""`dreamgym` command line. Each command is a thin shell over the library (or a flow).

Options left out take their value from `params.yaml` (`--params`). Bad input ends with one line
`error: ...` naming the problem and the fix, and exit code 2; a validation over its threshold
exits 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer._click.exceptions import UsageError  # typer 0.29 vendors click and does not re-export it

from dreamgym.commands import data
from dreamgym.commands.buffer import buffer_app
from dreamgym.commands.common import ParamsOption, console
from dreamgym.commands.common import load as _config
from dreamgym.commands.stack import stack_app
from dreamgym.config import MAX_SEED
from dreamgym.errors import DreamgymError

# Help texts are plain text: with rich markup on, their "[default: key]" notes were eaten as tags.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="DreamGym: RL for LLM agents in a learned experience model.",
)


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
    from dreamgym.ops.preflight import check_servers
    from dreamgym.ops.tracking import configure_services, ui_addresses

    services = configure_services(params.resolve().parent / config.paths.run_dir)
    check_servers()  # a shared server that is down: one error now, not a traceback minutes in
    result = _start_flow(PIPELINE, str(params), refresh=refresh, until=until)
    table = Table(title="dreamgym run", show_header=False)
    for label, value in result.rows():
        table.add_row(label, value)
    out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)  # a log file gets whole rows
    out.print(table)
    out.print(ui_addresses(services))


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
    from dreamgym.ops.lineage import as_json as chain_json
    from dreamgym.ops.lineage import as_tree
    from dreamgym.ops.lineage import lineage as walk
    from dreamgym.ops.tracking import configure_services

    config = _config(params)
    configure_services(params.resolve().parent / config.paths.run_dir)
    links = walk(model)
    if as_json:
        print(chain_json(links))
        return
    Console(soft_wrap=True).print(as_tree(links))


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
        typer.Option(
            min=1,
            help="N: real transitions of real-env RL (also 10N; S2R gets N/10) [default: rl.real_budget].",
        ),
    ] = None,
    synthetic_budget: Annotated[
        int | None,
        typer.Option(min=1, help="Synthetic transitions of each dream row's RL [default: 10N, real RL's ceiling]."),
    ] = None,
    rows: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated rows to run [default: all: bc, real-grpo, real-grpo-10n, "
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
    """The paper's regimes and ablations on the same data and held-out games (dreamgym/ops/benchmark.py)."""
    from dreamgym.ops.benchmark import bench_plan, check_targets, markdown
    from dreamgym.ops.tracking import configure_services

    config = _config(params)
    try:
        seed_list = [int(seed) for seed in seeds.split(",")] if seeds else None
    except ValueError:
        raise DreamgymError(f"--seeds {seeds!r}: give whole numbers separated by commas, e.g. 0,1,2") from None
    row_names = [name.strip() for name in rows.split(",")] if rows else None
    bench_plan(real_budget or config.rl.real_budget, row_names, synthetic_budget)  # bad input: before services start
    from dreamgym.ops.preflight import check_servers

    configure_services(params.resolve().parent / config.paths.run_dir)
    check_servers()
    results = _start_flow(
        BENCH,
        str(params),
        str(games),
        str(json_out),
        seed_list,
        real_budget,
        row_names,
        held_out=held_out,
        synthetic_budget=synthetic_budget,
    )
    Console(soft_wrap=True).print(markdown(results, check_targets(results, config.bench)), markup=False)


@app.command("bench-merge")
def bench_merge(
    files: Annotated[list[Path], typer.Argument(help="Bench JSON files, each of other seeds of the same bench.")],
    json_out: Annotated[
        Path, typer.Option("--json", help="Where to write the pooled rows (the Markdown table and PNG go beside it).")
    ],
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """One bench from the seeds of several (run apart, on the same held-out games and budgets):
    its rows, table, targets (the params' bench section) and figure, as `dreamgym bench` writes them."""
    import json

    from dreamgym.ops.benchmark import merge_benches, plot, write_bench

    benches = {}
    for file in files:
        try:
            benches[str(file)] = json.loads(file.read_text())
        except (OSError, ValueError) as error:
            raise DreamgymError(
                f"{file}: not a bench file ({error}); give the JSON `dreamgym bench --json` wrote"
            ) from None
    rows = merge_benches(benches)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    _, table = write_bench(rows, json_out, _config(params).bench)
    plot(rows, json_out.with_suffix(".png"))
    Console(soft_wrap=True).print(table, markup=False)


@app.command()
def results(
    readme: Annotated[Path, typer.Option(help="The README whose generated results table to refresh.")] = Path(
        "README.md"
    ),
    check: Annotated[bool, typer.Option(help="Write nothing; exit 1 if the table is out of date.")] = False,
) -> None:
    """Regenerate the README's results table from the bench files it names (dreamgym/ops/results.py)."""
    from dreamgym.ops.results import refresh_readme

    changed = refresh_readme(readme, check=check)
    state = ("out of date" if check else "regenerated") if changed else "up to date"
    console.print(f"{readme}: results table {state}", markup=False)
    if check and changed:
        raise typer.Exit(1)


app.command()(data.games)
app.command()(data.collect)
app.command()(data.validate)
app.command("check-env")(data.check_env_command)
app.add_typer(buffer_app, name="buffer")

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
    from dreamgym.evaluation import evaluate_experience_model

    config = _config(params, {"experience.eval_games": eval_games})
    result = evaluate_experience_model(model, games, json_out, config, params.resolve().parent, no_model)
    console.print(result.describe())


@experience_app.command("ablate")
def experience_ablate(
    games: Annotated[
        list[Path] | None,
        typer.Option(
            help="Another folder of held-out games to measure every row on too (e.g. games of shifted "
            "settings); repeat for more.",
        ),
    ] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """What the LM adds and what each rule layer adds: the experience model with and without its
    LM and its rule layers, each layer removed, and without retrieval, history or reasoning (same
    data, seed and budget), on the run's held-out games and on each --games folder; writes
    outputs/experience/ablation.{md,json,png} and logs them to MLflow."""
    config = _config(params)
    for folder in games or []:
        if not folder.is_dir():
            raise typer.BadParameter(f"{folder} is not a folder of games: make one with dreamgym games --out {folder}")
    from dreamgym.ops.tracking import configure_services

    configure_services(params.resolve().parent / config.paths.run_dir)
    result = _start_flow(ABLATION, str(params), [str(folder) for folder in games or []])
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
    from dreamgym.evaluation import evaluate_reference

    config = _config(
        params,
        {
            "evaluation.episodes_per_game": episodes_per_game,
            "seed": seed,
            "evaluation.max_steps": max_steps,
            "evaluation.greedy": None if sample is None else not sample,
        },
    )
    result = evaluate_reference(policy, games, json_out, config, params.resolve().parent)
    console.print(result.describe(), markup=False)


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
    from dreamgym.ops.promotion import describe, promote_version
    from dreamgym.ops.tracking import configure_services

    config = _config(params)
    project = params.resolve().parent
    configure_services(project / config.paths.run_dir)
    decision = promote_version(config, project, version, dry_run)
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
    from dreamgym.ops.schedule import serve_deployment
    from dreamgym.ops.tracking import configure_services

    config = _config(params)
    project = params.resolve().parent
    services = configure_services(project / config.paths.run_dir)
    serve_deployment(project, params, name, port, services["PREFECT_HOME"], console.print)


@app.command()
def deploy(
    name: Annotated[str, typer.Option("--name", help="Deployment of prefect.yaml to register.")] = "nightly",
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Register a deployment of prefect.yaml on the Prefect server PREFECT_API_URL names (what
    `prefect deploy --name NAME` does; that command fails in Prefect 3.8.8 here). The work pool's
    worker then runs it on its schedule, or now with `prefect deployment run`."""
    from dreamgym.ops.schedule import deploy as register

    console.print(register(params.resolve().parent, name), markup=False)


app.add_typer(stack_app, name="stack")


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
