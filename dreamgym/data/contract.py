"""The transition contract that whoever writes the buffer must meet, checked row by row.

`dreamgym validate` checks far more (trajectory chains, parsable states, available actions) and
quarantines what fails; the buffer cannot assume its caller ran it. So the buffer itself refuses
rows that would be wrong once stored, before anything of the load is written:

- a reward that is not a finite number (NaN or infinity: every mean over the buffer turns NaN),
  or that lies outside the configured range;
- a `content_hash` that is not the hash of the row's own content: the buffer deduplicates by it,
  so such a row would be skipped as "already there" when its hash is, and silently lost;
- a negative step, an unknown source, an empty state or action.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dreamgym.data.schema import SOURCES, content_hash
from dreamgym.errors import DreamgymError

SHOWN_ROWS = 5  # rows an error names; the count says how many more


class ContractError(DreamgymError):
    """Rows that break the transition contract; nothing of their load was written."""


def hash_matches(row: Mapping[str, Any]) -> bool:
    """Whether the row's content_hash is the hash of its content fields."""
    try:
        return row["content_hash"] == content_hash(row)
    except (KeyError, TypeError, ValueError):  # a missing or null content field
        return False


def row_violations(row: Mapping[str, Any], reward_range: tuple[float, float] | None = None) -> list[str]:
    """Why `row` breaks the contract (module docstring); empty when it does not."""
    reasons = []
    reward = row.get("reward")
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        reasons.append(f"reward is {reward!r}, not a finite number")
    elif reward_range is not None and not reward_range[0] <= reward <= reward_range[1]:
        reasons.append(f"reward {reward:g} is outside [{reward_range[0]:g}, {reward_range[1]:g}]")
    step = row.get("step")
    if not isinstance(step, int) or step < 0:
        reasons.append(f"step is {step!r}, not a whole number >= 0")
    if row.get("source") not in SOURCES:
        reasons.append(f"source is {row.get('source')!r}, not one of {', '.join(SOURCES)}")
    for column in ("state", "action"):
        if not row.get(column):
            reasons.append(f"{column} is empty")
    if not hash_matches(row):
        reasons.append("content_hash is not the hash of the row's content")
    return reasons


def check_contract(rows: Sequence[Mapping[str, Any]], reward_range: tuple[float, float] | None = None) -> None:
    """Raise a `ContractError` naming the rows that break the contract and why."""
    broken = [(index, reasons) for index, row in enumerate(rows) if (reasons := row_violations(row, reward_range))]
    if not broken:
        return
    shown = "; ".join(
        f"row {index} (trajectory {rows[index].get('trajectory_id')}, step "
        f"{rows[index].get('step')}): {', '.join(reasons)}"
        for index, reasons in broken[:SHOWN_ROWS]
    )
    more = f" and {len(broken) - SHOWN_ROWS} more" if len(broken) > SHOWN_ROWS else ""
    raise ContractError(
        f"{len(broken)} of {len(rows)} rows break the transition contract, nothing was "
        f"written: {shown}{more}. Run `dreamgym validate` on the file: it quarantines "
        "such rows with their reasons and writes the clean ones to ingest"
    )
