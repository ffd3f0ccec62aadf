"""`dreamgym buffer ...`: the experience replay buffer's commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dreamgym.commands.common import ParamsOption, load
from dreamgym.config import PipelineConfig
from dreamgym.errors import DreamgymError

buffer_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The experience replay buffer (Postgres + pgvector; DATABASE_URL or embedded).",
)


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

    config = load(params)
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
    from dreamgym.buffer.retrieval import nearest_transitions

    config = load(params, {"buffer.ef_search": ef_search})
    if source not in (None, "real", "synthetic"):
        raise DreamgymError(f"--source must be real or synthetic, got {source!r}")
    with _open_buffer(params, config) as database:
        buffer = config.buffer
        hits = nearest_transitions(
            database, buffer.encoder, task, state, action, k, buffer.ef_search, env, source, exclude_task
        )
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

    config = load(params)
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
