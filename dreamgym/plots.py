"""PNG figures without a display or pyplot's global state (safe in worker threads and tasks)."""

from __future__ import annotations

from pathlib import Path


def new_figure(width: float = 7, height: float = 4):
    """A figure and its one axis, drawn by the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # slow import
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def save_figure(figure, path: str | Path, dpi: int = 120) -> Path:
    path = Path(path)
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    return path
