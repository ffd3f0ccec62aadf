"""What the command groups of `dreamgym` (dreamgym/cli.py, dreamgym/commands/) share: the
`--params` option, the console their messages go to, and the parameters it resolves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from dreamgym.config import PipelineConfig, load_config

console = Console(stderr=True, soft_wrap=True)

ParamsOption = Annotated[
    Path, typer.Option("--params", help="Parameter file (the pipeline's one source of parameters).")
]


def load(params: Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """The parameter file `params` with the options the user gave (those not None) over it."""
    return load_config(params, {k: v for k, v in (overrides or {}).items() if v is not None})
