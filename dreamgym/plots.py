"""PNG figures without a display or pyplot's global state (safe in worker threads and tasks)."""

from __future__ import annotations

from pathlib import Path


def new_figure(width: float = 7, height: float = 4, columns: int = 1):
    """A figure and its one axis (with `columns` > 1: that many axes side by side), drawn by the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # slow import
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    if columns > 1:
        return figure, [figure.add_subplot(1, columns, column + 1) for column in range(columns)]
    return figure, figure.add_subplot()


def save_figure(figure, path: str | Path, dpi: int = 120) -> Path:
    path = Path(path)
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    return path
