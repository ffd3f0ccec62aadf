"""`dreamgym stack ...`: the team stack as local processes (dreamgym/ops/stack/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dreamgym.commands.common import console
from dreamgym.errors import DreamgymError

stack_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The team stack as local processes: Postgres + pgvector, MLflow server, Prefect server and worker, "
    "optionally a Ray head (infra/README.md).",
)

EnvFileOption = Annotated[
    Path,
    typer.Option("--env-file", help="Ports and passwords (copy infra/.env.example; never commit it)."),
]
StackDirOption = Annotated[Path, typer.Option("--dir", help="The stack's folder: data, logs, client.env, pids.")]


def _stack(env_file: Path, stack_dir: Path, project: Path = Path("."), ray: bool = False, ray_cpus: int | None = None):
    from dreamgym.ops.stack.processes import Stack, recorded_services
    from dreamgym.ops.stack.services import RAY
    from dreamgym.ops.stack.settings import load_settings

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
