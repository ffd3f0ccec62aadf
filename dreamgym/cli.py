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

from dreamgym.config import PipelineConfig, load_config
from dreamgym.errors import DreamgymError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="DreamGym: RL for LLM agents in a learned experience model.")
console = Console(stderr=True, soft_wrap=True)

ParamsOption = Annotated[Path, typer.Option("--params", help="Parameter file (the pipeline's "
                                                           "one source of parameters).")]


def _config(params: Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    return load_config(params, {k: v for k, v in (overrides or {}).items() if v is not None})


@app.command()
def run(params: ParamsOption = Path("params.yaml")) -> None:
    """The main job: the whole pipeline on the configured (by default embedded) services."""
    config = _config(params)
    project_dir = params.resolve().parent
    from dreamgym.tracking import configure_services  # noqa: PLC0415

    services = configure_services(project_dir / config.paths.run_dir)
    from flows.ingest import ingest  # noqa: PLC0415 - imports Prefect, after its settings are set

    summary = ingest(config, str(project_dir))
    _print_run_summary(summary, services)


def _print_run_summary(summary: dict, services: dict[str, str]) -> None:
    collection, validation = summary["collection"], summary["validation"]
    table = Table(title="dreamgym run", show_header=False)
    table.add_row("data version (DVC md5)",
                  f"{summary['data_md5']} ({'new' if summary['data_changed'] else 'unchanged'})")
    table.add_row("games (train / held-out test)", f"{summary['train_games']} / {summary['test_games']}")
    how = "reused" if collection["reused"] else f"collected in {collection['seconds']:.0f}s"
    table.add_row("transitions / trajectories",
                  f"{collection['transitions']} / {collection['trajectories']} ({how})")
    table.add_row("success rate in the data", f"{collection['success_rate']:.1%}")
    table.add_row("quarantined rows", f"{validation['quarantined_rows']} ({validation['bad_fraction']:.2%})")
    table.add_row("MLflow run", summary["mlflow_run_id"])
    out = Console(soft_wrap=True)
    out.print(table)
    tracking = services["MLFLOW_TRACKING_URI"]
    out.print(f"MLflow UI:  mlflow ui --backend-store-uri {tracking}\n"
                    f"Prefect UI: PREFECT_HOME={services['PREFECT_HOME']} prefect server start")


@app.command()
def games(
    split: Annotated[str, typer.Option(help="train, valid or test (tw-cooking's food splits).")] = "train",
    count: Annotated[int | None, typer.Option(help="Games to make [default: games.train_count, or "
                                                                "games.test_count for held-out splits].")] = None,
    seed: Annotated[int | None, typer.Option(help="Base seed [default: params seed].")] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder [default: <data_dir>/games/<split>].")] = None,
    workers: Annotated[int | None, typer.Option(help="Parallel tw-make processes.")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Generate TextWorld cooking games (skips those that exist)."""
    from dreamgym.data.games import check_split, generate_games, plan_games  # noqa: PLC0415

    check_split(split)
    config = _config(params, {"games.workers": workers})
    if count is None:  # held-out splits (valid, test) share test_count
        count = config.games.train_count if split == "train" else config.games.test_count
    seed = config.seed if seed is None else seed
    out = out or params.resolve().parent / config.paths.data_dir / "games" / split
    paths, made = generate_games(plan_games(config.games, split, count, seed), out,
                                 workers=config.games.workers)
    console.print(f"{len(paths)} {split} games in {out}: {made} made, {len(paths) - made} already there")


@app.command()
def collect(
    games: Annotated[Path, typer.Option("--games", help="Folder of .z8 games.")],
    out: Annotated[Path, typer.Option(help="Output Parquet file.")],
    episodes_per_game: Annotated[int | None, typer.Option(help="Episodes per game.")] = None,
    policy: Annotated[str | None, typer.Option(help="expert, noisy-expert or random.")] = None,
    epsilon: Annotated[float | None, typer.Option(help="Random-action rate of noisy-expert.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed [default: params seed].")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Step limit per episode.")] = None,
    workers: Annotated[int | None, typer.Option(help="Parallel processes.")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Play episodes on every game of a folder and write transitions to Parquet."""
    from dreamgym.data.collect import CollectionSettings, collect as collect_games  # noqa: PLC0415
    from dreamgym.data.games import list_games  # noqa: PLC0415

    config = _config(params, {"collect.episodes_per_game": episodes_per_game, "collect.policy": policy,
                              "collect.epsilon": epsilon, "collect.workers": workers,
                              "env.max_steps": max_steps, "seed": seed})
    settings = CollectionSettings(policy=config.collect.policy, epsilon=config.collect.epsilon,
                                  episodes_per_game=config.collect.episodes_per_game,
                                  seed=config.seed, max_steps=config.env.max_steps)
    result = collect_games(list_games(games), out, settings, workers=config.collect.workers)
    verb = "reused" if result.reused else f"collected in {result.seconds:.1f}s:"
    console.print(f"{out}: {verb} {result.transitions} transitions, {result.trajectories} "
                  f"trajectories, success rate {result.success_rate:.1%}")


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="Transitions Parquet file.")],
    quarantine: Annotated[Path | None, typer.Option(help="Where to write quarantined rows with "
                                                         "their reasons.")] = None,
    max_bad_fraction: Annotated[float | None, typer.Option(help="Largest quarantined fraction "
                                                               "that passes.")] = None,
    report: Annotated[Path | None, typer.Option(help="Great Expectations result (JSON).")] = None,
    clean: Annotated[Path | None, typer.Option(help="Where to write the rows that passed.")] = None,
    metrics: Annotated[Path | None, typer.Option(help="Summary figures (JSON), e.g. for DVC.")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Check transitions with Great Expectations; quarantine bad rows (and their trajectories)."""
    from dreamgym.data.validation import validate_transitions  # noqa: PLC0415

    config = _config(params, {"validation.max_bad_fraction": max_bad_fraction})
    result = validate_transitions(file, config.validation, quarantine_path=quarantine,
                                  report_path=report, clean_path=clean, metrics_path=metrics)
    console.print(result.summary(), markup=False)
    if not result.passed:
        raise typer.Exit(1)


@app.command("check-env")
def check_env_command(
    games: Annotated[Path, typer.Option("--games", help="Folder of .z8 games.")],
    max_steps: Annotated[int | None, typer.Option(help="Step limit per episode.")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Run the environment conformance check on the TextWorld adapter over a folder of games."""
    from dreamgym.data.games import list_games  # noqa: PLC0415
    from dreamgym.envs.checker import check_env  # noqa: PLC0415
    from dreamgym.envs.textworld_env import TextWorldEnv, load_task  # noqa: PLC0415

    config = _config(params, {"env.max_steps": max_steps})
    tasks = [load_task(game) for game in list_games(games)]
    check_env(lambda: TextWorldEnv(max_steps=config.env.max_steps), tasks)
    console.print(f"check_env passed on {len(tasks)} games")


def main() -> None:
    try:
        app()
    except DreamgymError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
