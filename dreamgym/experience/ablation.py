"""The ablation table: what the LM adds, what each rule layer adds, and the paper's ablations.

A reviewer asks two things of an experience model with rules around it: how much of the
prediction is the LM's, and how much each rule's. Each row here switches one thing and keeps the
rest (data, seed, size, training budget), measured by the same fidelity evaluation on the same real
transitions:

- `FULL`: the configured model, LM and rule layers.
- `RULES_ONLY`: no LM. The top-ranked worked example that the full model's prompt shows, its change
  applied (`generate.NeighbourCopy`), with the same rule layers on: the examples adapted by the
  learnt actions, retrieval ranked by the domain's rules, and the memory of places. The difference
  to `FULL` is the LM alone.
- `LM_ONLY`: the LM with retrieval and no rule layer (no domain rules, no learnt actions, no memory
  of places), trained that way; `NO_LM_NO_RULES` copies its top example: the generic path a team
  with a new environment starts from.
- each rule layer removed from `FULL` (`WITHOUT_LAYER`), and the paper's ablations (no retrieval,
  no history, no reasoning; its Table 3).

The memory of places works at generation time, so removing it needs no training: the full model
measured with it off. The others change the prompt the model learns from and are trained anew.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dreamgym.config import PipelineConfig
from dreamgym.plots import new_figure, save_figure

FULL = "LM + rule layers (full)"
RULES_ONLY = "rule layers only (no LM)"
LM_ONLY = "LM only (no rule layers)"
NO_LM_NO_RULES = "no LM, no rule layers"
NO_RULES = {"domain": "none", "learnt_actions": False, "remember_places": False}
WITHOUT_PLACES = "- memory of places"
WITHOUT_LAYER = {
    WITHOUT_PLACES: {"remember_places": False},
    # The memory of places finds a room's way back with the learnt actions: it goes with them.
    "- learnt actions (and places)": {"learnt_actions": False, "remember_places": False},
    "- domain rules": {"domain": "none"},
}
PAPER = {
    "no retrieval (k=0)": {"neighbours": 0},
    "no history (h=0)": {"history": 0},
    "no reasoning": {"reasoning": False},
}
COLUMNS = (
    ("next_state_exact_match", "next state exact"),
    ("foreseeable_exact_match", "on foreseeable"),
    ("reward_accuracy", "reward acc."),
    ("done_accuracy", "done acc."),
    ("parse_failure_rate", "parse failures"),
)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One row: its config, the row whose trained model it uses (itself when it trains its own),
    and whether the LM predicts or the top example is copied."""

    config: PipelineConfig
    model_of: str
    copied: bool = False


def variants(config: PipelineConfig) -> dict[str, Variant]:
    """Every row of the table, in its order; rows that need no training of their own name the
    trained row whose model (its settings, kept names and learnt actions) they use."""

    def changed(**changes) -> PipelineConfig:
        return dataclasses.replace(config, experience=dataclasses.replace(config.experience, **changes))

    rows = {FULL: Variant(config, FULL)}
    if config.experience.neighbours:  # without retrieval there is no example to copy
        rows[RULES_ONLY] = Variant(config, FULL, copied=True)
    rows[LM_ONLY] = Variant(changed(**NO_RULES), LM_ONLY)
    if config.experience.neighbours:
        rows[NO_LM_NO_RULES] = Variant(changed(**NO_RULES), LM_ONLY, copied=True)
    for name, changes in WITHOUT_LAYER.items():
        rows[name] = Variant(changed(**changes), FULL if name == WITHOUT_PLACES else name)
    for name, changes in PAPER.items():
        rows[name] = Variant(changed(**changes), name)
    # A row that switches off what the config has off already is the full model again.
    return {name: row for name, row in rows.items() if name == FULL or row.config != config or row.copied}


def trained(rows: dict[str, Variant]) -> dict[str, PipelineConfig]:
    """The rows that train a model of their own, with its config."""
    return {name: row.config for name, row in rows.items() if row.model_of == name}


def ablation_rows(results: dict[str, dict], slice_name: str = "held-out") -> list[dict]:
    """One row per variant: its fidelity figures, and the open-loop exact match at the last step."""
    rows = []
    for name, fidelity in results.items():
        row = {"slice": slice_name, "variant": name, **{key: fidelity.get(key) for key, _ in COLUMNS}}
        foreseen = fidelity.get("foreseeable") or {}
        row["foreseeable_exact_match"] = foreseen.get("next_state_exact_match")
        row["foreseeable_fraction"] = fidelity.get("foreseeable_fraction")
        row["transitions"] = fidelity.get("transitions")
        row |= {f"f1_{field}": value for field, value in fidelity["field_f1"].items()}
        last = fidelity["multi_step"][-1] if fidelity["multi_step"] else None
        row["open_loop_exact_at_last_step"] = last["exact_match"] if last else None
        rows.append(row)
    return rows


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def markdown(rows: list[dict]) -> str:
    """One table per slice, the slices in the order their rows come."""
    header = "| variant | " + " | ".join(label for _, label in COLUMNS) + " | open-loop exact (last step) |"
    lines: list[str] = []
    for slice_name in dict.fromkeys(row["slice"] for row in rows):
        of_slice = [row for row in rows if row["slice"] == slice_name]
        first = of_slice[0]
        count = f"{first['transitions']} transitions" if first.get("transitions") else "transitions"
        lines += ["", f"**{slice_name}** ({count}, {_percent(first.get('foreseeable_fraction'))} foreseeable)", ""]
        lines += [header, "|---" * (len(COLUMNS) + 2) + "|"]
        for row in of_slice:
            cells = [_percent(row[key]) for key, _ in COLUMNS] + [_percent(row["open_loop_exact_at_last_step"])]
            lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines).strip()


def plot(rows: list[dict], path: Path) -> Path:
    """Next-state exact match by variant (all transitions, and the foreseeable ones), a panel per slice."""
    slices = list(dict.fromkeys(row["slice"] for row in rows))
    figure, axes = new_figure(5.5 * len(slices) + 1, 0.35 * len(rows) / len(slices) + 1.5, columns=len(slices))
    for axis, slice_name in zip(axes if len(slices) > 1 else [axes], slices, strict=True):
        of_slice = [row for row in rows if row["slice"] == slice_name][::-1]
        names = [row["variant"] for row in of_slice]
        places = range(len(of_slice))
        axis.barh([p + 0.2 for p in places], [row["next_state_exact_match"] or 0 for row in of_slice], 0.4, label="all")
        axis.barh(
            [p - 0.2 for p in places],
            [row["foreseeable_exact_match"] or 0 for row in of_slice],
            0.4,
            label="foreseeable",
        )
        axis.set_yticks(list(places), names, fontsize=8)
        axis.set(xlim=(0, 1), xlabel="next state exact match", title=slice_name)
    handles, labels = (axes[0] if len(slices) > 1 else axes).get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper right", fontsize=8, title="transitions")
    return save_figure(figure, path)
