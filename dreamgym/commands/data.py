"""`dreamgym games`, `collect`, `validate` and `check-env`: the data commands (registered in
dreamgym/cli.py, in that order)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dreamgym.commands.common import ParamsOption, console, load
from dreamgym.envs.textworld.config import GAME_SEED_STRIDE, MAX_SEED
from dreamgym.errors import DreamgymError


def games(
    split: Annotated[str, typer.Option(help="train, valid or test (tw-cooking's food splits).")] = "train",
    count: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=GAME_SEED_STRIDE,
            help="Games to make [default: games.train_count, or games.test_count for held-out splits]; "
            "ScienceWorld: variations per task type.",
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
    first: Annotated[
        int,
        typer.Option(
            min=0,
            help="ScienceWorld: skip each type's first N variations of the seed's order "
            "(a fresh held-out slice beside a spent one: --split test --first 10).",
        ),
    ] = 0,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Generate TextWorld cooking games (skips those that exist). Settings other than the training
    data's make a shifted set: `--split test --recipe 3 --go 9 --out data/games/shifted`. With
    `env.name: scienceworld`: ScienceWorld task files, `--count` variations per task type."""
    from dreamgym.envs.textworld.games import check_split, generate_games, plan_games

    check_split(split)
    settings = {"games.recipe": recipe, "games.take": take, "games.go": go}
    config = load(params, {"games.workers": workers, "seed": seed} | {k: v for k, v in settings.items() if v})
    out = out or params.resolve().parent / config.paths.data_dir / "games" / split
    if config.env.name == "scienceworld":
        from dreamgym.envs.scienceworld.tasks import write_tasks

        sw = config.scienceworld
        per_type = count if count is not None else sw.train_variations if split == "train" else sw.test_variations
        paths = write_tasks(sw.tasks, {"valid": "dev"}.get(split, split), per_type, config.seed, out, first)
        console.print(f"{len(paths)} ScienceWorld {split} tasks in {out} ({per_type} per task type)")
        return
    if first:
        raise DreamgymError(f"--first {first}: TextWorld games are drawn by seed; choose another --seed instead")
    if count is None:  # held-out splits (valid, test) share test_count
        count = config.games.train_count if split == "train" else config.games.test_count
    paths, made = generate_games(plan_games(config.games, split, count, config.seed), out, workers=config.games.workers)
    console.print(f"{len(paths)} {split} games in {out}: {made} made, {len(paths) - made} already there")


def collect(
    games: Annotated[Path, typer.Option("--games", help="Folder of games (.z8) or ScienceWorld tasks (.swtask).")],
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
    from dreamgym.envs.real import list_games

    config = load(
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

    config = load(params, {"validation.max_bad_fraction": max_bad_fraction})
    result = validate_transitions(
        file, config.validation, quarantine_path=quarantine, report_path=report, clean_path=clean, metrics_path=metrics
    )
    console.print(result.summary(), markup=False)
    if not result.passed:
        raise typer.Exit(1)


def check_env_command(
    games: Annotated[Path, typer.Option("--games", help="Folder of games (.z8) or ScienceWorld tasks (.swtask).")],
    max_steps: Annotated[int | None, typer.Option(min=1, help="Step limit per episode.")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Run the environment conformance check on the adapter of a folder's games (TextWorld or ScienceWorld)."""
    from dreamgym.envs.checker import check_env
    from dreamgym.envs.real import env_for, list_games, load_task

    config = load(params, {"env.max_steps": max_steps})
    files = list_games(games)
    tasks = [load_task(game) for game in files]
    check_env(lambda: env_for(files, config.env.max_steps), tasks)
    console.print(f"check_env passed on {len(tasks)} games")
