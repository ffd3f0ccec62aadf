"""A picture of an offline dataset: how often each game was solved and how long episodes ran.

Saved as PNG next to the validation outputs and logged to MLflow by the ingest flow, so that a
dataset that is too easy, too hard or dominated by truncated episodes shows at a glance.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc


def plot_dataset(table: pa.Table, path: str | Path, title: str = "offline dataset") -> Path:
    import matplotlib  # only when a picture is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = table.filter(pc.or_(table["terminated"], table["truncated"])).to_pandas()
    last["length"] = last["step"] + 1
    last["outcome"] = last["won"].map({True: "won", False: "failed"})
    last.loc[last["truncated"], "outcome"] = "truncated"
    by_game = last.groupby("task_id")["won"].mean().sort_values()

    figure, (games_axis, length_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    games_axis.bar(range(len(by_game)), by_game.to_numpy(), color="tab:blue")
    games_axis.axhline(last["won"].mean(), color="black", linestyle="--", label=f"overall {last['won'].mean():.0%}")
    games_axis.set(
        xlabel=f"game ({len(by_game)}, sorted)", ylabel="success rate", ylim=(0, 1.05), title="success rate per game"
    )
    games_axis.set_xticks([])
    games_axis.legend(loc="upper left")
    bins = range(1, int(last["length"].max()) + 2)
    for outcome, color in (("won", "tab:green"), ("failed", "tab:red"), ("truncated", "tab:gray")):
        lengths = last.loc[last["outcome"] == outcome, "length"]
        if len(lengths):
            length_axis.hist(lengths, bins=bins, alpha=0.7, color=color, label=f"{outcome} ({len(lengths)})")
    length_axis.set(xlabel="episode length (steps)", ylabel="episodes", title="episode lengths")
    length_axis.legend()
    figure.suptitle(f"{title}: {table.num_rows} transitions, {len(last)} episodes")
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
