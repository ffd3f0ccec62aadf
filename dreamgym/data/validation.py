"""Validate collected transitions with Great Expectations; quarantine what fails, never drop it.

A transitions file is checked in two layers:

- Whole file: the transition record's columns and types (`schema.check_columns`). A file that
  fails here cannot be checked row by row, so it raises `SchemaError`.
- Row by row, by a Great Expectations suite run over the rows:
  required values present; state and action non-empty; texts no longer than
  `max_text_chars` (state, next_state, instruction) or `max_action_chars` (action); reward within
  [reward_min, reward_max]; source one of real/synthetic. Checks that need several rows or the
  state parser are first computed with pandas into boolean `check_*` columns, which the suite
  then expects to be all True (see `DERIVED_CHECKS`): within a trajectory, rows in file order
  have steps 0, 1, 2, ...; the last step and only it is terminated or truncated, never both;
  each step's next_state is the following step's state; state and next_state parse in the
  abstract state format; on TextWorld the action, and the expert's action where recorded, is one
  of the state's available actions (the collector only plays admissible actions and the game's
  walkthrough only admissible commands, so anything else is corruption); no content_hash
  repeats an earlier row's, and each is the hash of its row's content; the reward is a finite
  number. A repeated row is judged only as a duplicate: the trajectory checks
  run on the first copies, so that one re-ingested row does not also read as a broken chain.

Great Expectations decides which rows fail (result format COMPLETE lists their indices); each
failed check gives the row one reason. A trajectory with any failing row is quarantined whole,
since a model trained on half an episode learns wrong transitions and endings; its other rows get
the reason "trajectory has invalid rows (steps ...)". The run passes when the quarantined fraction
is at most `max_bad_fraction`. Outputs (each optional, each written atomically): the quarantined
rows with their reasons, the clean rows in the exact transition schema, and a JSON report holding
the GX validation result.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dreamgym.data.config import ValidationConfig
from dreamgym.data.contract import hash_matches
from dreamgym.data.schema import (
    CONTENT_FIELDS,
    METADATA_KEY,
    NULLABLE_SCHEMA,
    SOURCES,
    TRANSITION_SCHEMA,
    read_transitions,
    write_transitions,
)
from dreamgym.errors import DreamgymError
from dreamgym.state import StateParseError, parse_state

REQUIRED_COLUMNS = tuple(f.name for f in TRANSITION_SCHEMA if not f.nullable)

# Checks computed with pandas as boolean columns; name -> reason given to a failing row.
DERIVED_CHECKS = {
    "check_step_contiguous": "step out of sequence within its trajectory",
    "check_last_step_ends": "last step of its trajectory is neither terminated nor truncated",
    "check_only_last_step_ends": "terminated or truncated before the last step of its trajectory",
    "check_not_both_ended": "both terminated and truncated",
    "check_next_state_chain": "next_state differs from the state of the trajectory's next step",
    "check_state_parses": "state does not parse as an abstract state",
    "check_next_state_parses": "next_state does not parse as an abstract state",
    "check_action_available": "action is not among the state's available actions",
    "check_expert_action_available": "expert_action is not among the state's available actions",
    "check_unique_content_hash": "duplicate content_hash",
    "check_content_hash_matches": "content_hash is not the hash of the row's content",
    "check_reward_finite": "reward is not a finite number",
}
TRAJECTORY_REASON = "trajectory has invalid rows"


@dataclass(frozen=True)
class Check:
    """One expectation of the suite and the reason a row that fails it is quarantined."""

    name: str
    reason: str
    expectation: str  # class name in great_expectations.expectations
    kwargs: dict[str, Any] = field(default_factory=dict)


def suite_checks(config: ValidationConfig) -> list[Check]:
    """The table of checks, in the order a row's reasons are listed."""
    lengths, in_set = "ExpectColumnValueLengthsToBeBetween", "ExpectColumnValuesToBeInSet"
    checks = [
        Check(f"not_null_{c}", f"{c} is null", "ExpectColumnValuesToNotBeNull", {"column": c}) for c in REQUIRED_COLUMNS
    ]
    for column in ("state", "action"):
        checks.append(Check(f"nonempty_{column}", f"{column} is empty", lengths, {"column": column, "min_value": 1}))
    limits = {
        "state": config.max_text_chars,
        "next_state": config.max_text_chars,
        "instruction": config.max_text_chars,
        "action": config.max_action_chars,
    }
    for column, limit in limits.items():
        checks.append(
            Check(
                f"max_length_{column}",
                f"{column} is longer than {limit} characters",
                lengths,
                {"column": column, "max_value": limit},
            )
        )
    low, high = config.reward_min, config.reward_max
    checks.append(
        Check(
            "reward_range",
            f"reward outside [{low:g}, {high:g}]",
            "ExpectColumnValuesToBeBetween",
            {"column": "reward", "min_value": low, "max_value": high},
        )
    )
    checks.append(
        Check(
            "source_in_set",
            f"source is not one of {', '.join(SOURCES)}",
            in_set,
            {"column": "source", "value_set": list(SOURCES)},
        )
    )
    checks += [
        Check(name, reason, in_set, {"column": name, "value_set": [True]}) for name, reason in DERIVED_CHECKS.items()
    ]
    return checks


def _parse_error(text: Any) -> str | None:
    if pd.isna(text):
        return None  # reported as null, not also as unparseable
    try:
        parse_state(text)
    except StateParseError as error:
        return str(error)
    return None


def _action_available(state: Any, action: Any) -> bool:
    if pd.isna(state) or pd.isna(action):
        return True  # reported as null
    try:
        return action in parse_state(state).actions
    except StateParseError:
        return True  # an unparseable state is reported as such, not also as a bad action


def derive_checks(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, pd.Series]]:
    """A copy of `df` with one boolean column per derived check, and details by check for the
    rows that fail (e.g. the parse error), appended to the reason in parentheses."""
    frame = df.copy()
    hashes = frame["content_hash"]
    duplicate = hashes.notna() & hashes.duplicated(keep="first")
    first = frame[~duplicate]  # trajectory checks see one copy of each row (see module docstring)
    by_trajectory = first.groupby("trajectory_id", sort=False, dropna=False)
    position = by_trajectory.cumcount()
    is_last = by_trajectory.cumcount(ascending=False) == 0
    terminated, truncated = first["terminated"].eq(True), first["truncated"].eq(True)
    ended = terminated | truncated
    following_state = by_trajectory["state"].shift(-1)
    structural = {
        "check_step_contiguous": first["step"] == position,
        "check_last_step_ends": ~is_last | ended,
        "check_only_last_step_ends": is_last | ~ended,
        "check_not_both_ended": ~(terminated & truncated),
        "check_next_state_chain": is_last | (first["next_state"] == following_state),
    }
    for name, ok in structural.items():
        frame[name] = ok.reindex(frame.index, fill_value=True).astype(bool)

    state_errors = frame["state"].map(_parse_error)
    next_state_errors = frame["next_state"].map(_parse_error)
    frame["check_state_parses"] = state_errors.isna()
    frame["check_next_state_parses"] = next_state_errors.isna()
    textworld = frame["env"] == "textworld"
    frame["check_action_available"] = [
        not is_tw or _action_available(state, action)
        for is_tw, state, action in zip(textworld, frame["state"], frame["action"])
    ]
    frame["check_expert_action_available"] = [
        not is_tw or pd.isna(expert) or _action_available(state, expert)
        for is_tw, state, expert in zip(textworld, frame["state"], frame["expert_action"])
    ]
    frame["check_unique_content_hash"] = ~duplicate
    content = frame[[*CONTENT_FIELDS, "content_hash"]]
    frame["check_content_hash_matches"] = [
        # a null, or a reward that is not finite, is reported as such, not also as a hash mismatch
        any(pd.isna(value) for value in row.values()) or not math.isfinite(row["reward"]) or hash_matches(row)
        for row in content.to_dict("records")
    ]
    frame["check_reward_finite"] = frame["reward"].isna() | np.isfinite(frame["reward"].astype(float))

    first_row = pd.Series(first.index, index=first["content_hash"])
    first_row = first_row[~first_row.index.duplicated()]
    details = {
        "check_step_contiguous": ("expected " + position.astype(str) + ", got " + first["step"].astype(str)),
        "check_state_parses": state_errors,
        "check_next_state_parses": next_state_errors,
        "check_unique_content_hash": "same as row " + hashes[duplicate].map(first_row).astype(str),
    }
    return frame, details


def _failed_rows(frame: pd.DataFrame, checks: list[Check]) -> tuple[dict[str, list[int]], dict]:
    """Run the suite over `frame`: the failing row indices by check, and the GX result as JSON."""
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)  # no bar per validation
    batch = (
        context.data_sources.add_pandas("transitions")
        .add_dataframe_asset("transitions")
        .add_batch_definition_whole_dataframe("all_rows")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    suite = gx.ExpectationSuite(name="dreamgym_transitions")
    for check in checks:
        expectation = getattr(gxe, check.expectation)
        suite.add_expectation(expectation(**check.kwargs, meta={"dreamgym_check": check.name}))
    result = batch.validate(suite, result_format="COMPLETE")

    failed: dict[str, list[int]] = {}
    for item in result.results:  # not in suite order
        name = item.expectation_config.meta["dreamgym_check"]
        if "unexpected_index_list" not in item.result:
            # The expectation itself errored (GX catches it); no rows can be blamed, so stop.
            messages = {
                str(info.get("exception_message")) for info in item.exception_info.values() if isinstance(info, dict)
            } or {str(item.exception_info)}
            raise DreamgymError(f"validation check {name} could not run: {'; '.join(sorted(messages))}")
        failed[name] = [int(index) for index in item.result["unexpected_index_list"]]
    return failed, result.to_json_dict()


def _direct_reasons(df: pd.DataFrame, config: ValidationConfig) -> tuple[dict[int, list[str]], Counter, dict]:
    """Rows failing a check themselves, the count of rows by check reason, and the GX result."""
    frame, details = derive_checks(df.reset_index(drop=True))
    checks = suite_checks(config)
    failed, report = _failed_rows(frame, checks)
    reasons: dict[int, list[str]] = {}
    counts: Counter = Counter()
    for check in checks:
        detail = details.get(check.name)
        for row in failed.get(check.name, []):
            text = check.reason
            if detail is not None and isinstance(detail.get(row), str):
                text = f"{text} ({detail[row]})"
            reasons.setdefault(row, []).append(text)
            counts[check.reason] += 1
    return dict(sorted(reasons.items())), counts, report


def find_bad_rows(df: pd.DataFrame, config: ValidationConfig) -> dict[int, list[str]]:
    """Rows (by position) that fail a check themselves, with one reason per failed check."""
    return _direct_reasons(df, config)[0]


def quarantine_reasons(df: pd.DataFrame, bad: dict[int, list[str]]) -> dict[int, list[str]]:
    """Extend `bad` to whole trajectories: the other rows of a trajectory with a bad row are
    quarantined too, with a reason naming the bad steps."""
    df = df.reset_index(drop=True)
    reasons = {row: list(texts) for row, texts in bad.items()}
    bad_rows = df.loc[list(bad)]
    for trajectory, rows in bad_rows.groupby("trajectory_id", sort=False, dropna=False):
        steps = sorted({int(s) for s in rows["step"] if pd.notna(s)})
        label = "step" if len(steps) == 1 else "steps"
        reason = f"{TRAJECTORY_REASON} ({label} {', '.join(map(str, steps))})"
        members = (
            df.index[df["trajectory_id"].isna()] if pd.isna(trajectory) else df.index[df["trajectory_id"] == trajectory]
        )
        for row in members:
            reasons.setdefault(int(row), [reason])
    return dict(sorted(reasons.items()))


@dataclass(frozen=True)
class ValidationResult:
    rows: int
    valid_rows: int
    quarantined_rows: int
    quarantined_trajectories: int
    bad_fraction: float
    max_bad_fraction: float
    passed: bool
    reasons: dict[str, int]  # reason -> rows failing it directly (not via their trajectory)
    report_path: str | None
    quarantine_path: str | None
    clean_path: str | None

    def summary(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        trajectories = self.quarantined_trajectories
        lines = [
            f"validation {verdict}: {self.valid_rows} of {self.rows} rows valid, "
            f"{self.quarantined_rows} quarantined in {trajectories} "
            f"{'trajectory' if trajectories == 1 else 'trajectories'}",
            f"bad fraction {self.bad_fraction:.2%} (max {self.max_bad_fraction:.2%})",
        ]
        if self.rows == 0:
            lines.append("no transitions to validate")
        for reason, count in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:5]:
            lines.append(f"  {reason}: {count} {'row' if count == 1 else 'rows'}")
        return "\n".join(lines)


def _strict_json(value: Any) -> Any:
    """JSON has no NaN or infinity, yet GX reports such rewards as offending values: as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(item) for item in value]
    return value


def _write_json(payload: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(_strict_json(payload), indent=2, default=str, allow_nan=False))
    partial.replace(path)


def validate_transitions(
    path: str | Path,
    config: ValidationConfig,
    quarantine_path: str | Path | None = None,
    report_path: str | Path | None = None,
    clean_path: str | Path | None = None,
    metrics_path: str | Path | None = None,
) -> ValidationResult:
    """Validate a transitions file; write the quarantined rows, clean rows, report and summary
    metrics (a small JSON, e.g. for DVC) if asked."""
    path = Path(path)
    table = read_transitions(path, allow_nulls=True)
    metadata = (pq.read_schema(path).metadata or {}).get(METADATA_KEY)
    df = table.to_pandas()
    # pandas reads a NaN reward as missing, which the suite would call null; it is a value that is
    # not finite. Infinity stands for it in the checked copy (the files written come from `table`).
    nan_reward = pc.fill_null(pc.is_nan(table["reward"]), False).to_numpy(zero_copy_only=False)
    df.loc[nan_reward, "reward"] = math.inf
    direct, counts, gx_result = _direct_reasons(df, config)
    quarantined = quarantine_reasons(df, direct)
    rows = table.num_rows
    trajectories = df.loc[list(quarantined), "trajectory_id"].nunique(dropna=False)
    bad_fraction = len(quarantined) / rows if rows else 0.0
    result = ValidationResult(
        rows=rows,
        valid_rows=rows - len(quarantined),
        quarantined_rows=len(quarantined),
        quarantined_trajectories=int(trajectories),
        bad_fraction=bad_fraction,
        max_bad_fraction=config.max_bad_fraction,
        # An empty file is a failed collection, not a clean one.
        passed=rows > 0 and bad_fraction <= config.max_bad_fraction,
        reasons=dict(counts.most_common()),
        report_path=str(report_path) if report_path else None,
        quarantine_path=str(quarantine_path) if quarantine_path else None,
        clean_path=str(clean_path) if clean_path else None,
    )

    if quarantine_path:
        bad = table.take(pa.array(list(quarantined), pa.int64())).cast(NULLABLE_SCHEMA)
        bad = bad.append_column("quarantine_reasons", pa.array(list(quarantined.values()), pa.list_(pa.string())))
        bad = bad.append_column("row_index", pa.array(list(quarantined), pa.int64()))
        write_transitions(bad, quarantine_path)  # written even when empty: validation ran
    if clean_path:
        keep = [row for row in range(rows) if row not in quarantined]
        clean = table.take(pa.array(keep, pa.int64())).cast(TRANSITION_SCHEMA)
        if metadata is not None:
            clean = clean.replace_schema_metadata({METADATA_KEY: metadata})
        write_transitions(clean, clean_path)
    summary = {key: value for key, value in vars(result).items() if not key.endswith("_path")}
    if metrics_path:
        _write_json(summary, Path(metrics_path))
    if report_path:
        # The same input gives the same report (DVC records it): no load time, no absolute path.
        gx_result.get("meta", {}).get("batch_markers", {}).pop("ge_load_time", None)
        _write_json(
            {
                "dreamgym": {
                    "input": path.name,
                    **summary,
                    "summary": result.summary(),
                    "checks": {c.name: c.reason for c in suite_checks(config)},
                },
                "great_expectations": gx_result,
            },
            Path(report_path),
        )
    return result
