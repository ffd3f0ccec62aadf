"""The transition record: the unit of data everywhere (collection, validation, buffer, models).

One row per environment step. `content_hash` is a SHA-256 over the fields that define the
transition (`CONTENT_FIELDS`), so that re-collecting or re-ingesting the same transition gives
the same hash and upserts stay idempotent; provenance fields (run id, timestamps) are outside it.
Parquet files carry this schema plus free-form metadata (e.g. the collection settings) under the
`dreamgym` key of the file's schema metadata.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dreamgym.errors import DreamgymError

SOURCES = ("real", "synthetic")
# The `policy` of real episodes in which the expert makes one mistake on purpose
# (collect.mistake_episodes): data for the experience model, not a behaviour to clone.
MISTAKE_POLICY = "expert+mistake"

TRANSITION_SCHEMA = pa.schema(
    [
        pa.field("env", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("instruction", pa.string(), nullable=False),
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        # The environment's expert action from `state` (None: no expert, e.g. synthetic transitions):
        # a label about the state, outside the content hash, which identifies what happened.
        pa.field("expert_action", pa.string(), nullable=True),
        pa.field("next_state", pa.string(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("terminated", pa.bool_(), nullable=False),
        pa.field("truncated", pa.bool_(), nullable=False),
        pa.field("won", pa.bool_(), nullable=False),
        pa.field("lost", pa.bool_(), nullable=False),
        pa.field("score", pa.int64(), nullable=False),
        pa.field("max_score", pa.int64(), nullable=False),
        pa.field("reasoning", pa.string(), nullable=True),
        pa.field("source", pa.string(), nullable=False),
        pa.field("policy", pa.string(), nullable=False),
        pa.field("model_version", pa.string(), nullable=True),
        pa.field("run_id", pa.string(), nullable=True),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
    ]
)
COLUMNS = tuple(TRANSITION_SCHEMA.names)
# The same columns with every field nullable: how validation holds rows that lack a required
# value, so that they can be quarantined rather than refused with the whole file.
NULLABLE_SCHEMA = pa.schema([field.with_nullable(True) for field in TRANSITION_SCHEMA])

# Columns added after the first files were written: a file without one reads as all nulls.
OPTIONAL_COLUMNS = ("expert_action",)

CONTENT_FIELDS = (
    "env",
    "task_id",
    "trajectory_id",
    "step",
    "state",
    "action",
    "next_state",
    "reward",
    "terminated",
    "truncated",
    "source",
)
METADATA_KEY = b"dreamgym"


class SchemaError(DreamgymError):
    """A transitions file that does not have the transition record's columns or types."""


def content_hash(record: Mapping[str, Any]) -> str:
    """SHA-256 of the content fields, stable across processes and platforms."""
    payload = [record[name] for name in CONTENT_FIELDS]
    payload[CONTENT_FIELDS.index("step")] = int(payload[CONTENT_FIELDS.index("step")])
    payload[CONTENT_FIELDS.index("reward")] = float(payload[CONTENT_FIELDS.index("reward")])
    for flag in ("terminated", "truncated"):
        payload[CONTENT_FIELDS.index(flag)] = bool(payload[CONTENT_FIELDS.index(flag)])
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def trajectory_id(*parts: object) -> str:
    """A deterministic trajectory id from what defines the episode (task, policy, seed, index)."""
    return hashlib.sha256("|".join(map(str, parts)).encode("utf-8")).hexdigest()[:20]


def score_before(row: Mapping[str, Any]) -> float:
    """The game's score before a transition's step: its score after the step less the step's reward.
    Within a point of the exact score where the score is kept in whole points and the reward is not
    (ScienceWorld: 17 after a reward of 8.33 that started from 8.33)."""
    return float(row["score"]) - float(row["reward"])


def episodes(rows: Iterable[Mapping]) -> list[list[Mapping]]:
    """Transitions grouped by trajectory, each in step order, trajectories sorted by id."""
    by_trajectory: dict[str, list[Mapping]] = defaultdict(list)
    for row in rows:
        by_trajectory[row["trajectory_id"]].append(row)
    return [sorted(steps, key=lambda row: row["step"]) for _, steps in sorted(by_trajectory.items())]


def to_table(records: Iterable[Mapping[str, Any]], metadata: Mapping[str, Any] | None = None) -> pa.Table:
    table = pa.Table.from_pylist(list(records), schema=TRANSITION_SCHEMA)
    if metadata is not None:
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata, sort_keys=True)})
    return table


def write_transitions(table: pa.Table, path: str | Path) -> Path:
    """Write atomically: a crash mid-write never leaves a half file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    pq.write_table(table, partial, compression="zstd")
    partial.replace(path)
    return path


# The same values in another Arrow encoding: pandas writes strings back as large_string, and a
# data tool should not refuse a clean file for how it was written. Read as the schema's types.
_EQUIVALENT_TYPES = {pa.large_string(): pa.string()}


def _same_type(found: pa.DataType, expected: pa.DataType) -> bool:
    return found.equals(expected) or _EQUIVALENT_TYPES.get(found, found).equals(expected)


def check_columns(schema: pa.Schema, path: str | Path) -> None:
    """Raise a `SchemaError` naming every missing column or wrong type."""
    missing = [name for name in COLUMNS if name not in schema.names and name not in OPTIONAL_COLUMNS]
    if missing:
        raise SchemaError(
            f"{path}: missing columns {', '.join(missing)}; a transitions file needs all of: {', '.join(COLUMNS)}"
        )
    wrong = [
        f"{field.name} is {schema.field(field.name).type} (expected {field.type})"
        for field in TRANSITION_SCHEMA
        if field.name in schema.names and not _same_type(schema.field(field.name).type, field.type)
    ]
    if wrong:
        raise SchemaError(f"{path}: wrong column types: {'; '.join(wrong)}")


def read_transitions(path: str | Path, allow_nulls: bool = False) -> pa.Table:
    """Read a transitions file, checking columns and types; extra columns are dropped.

    Nulls in required columns are refused unless `allow_nulls` (validation reads them to
    quarantine the rows); the table then has `NULLABLE_SCHEMA`.
    """
    path = Path(path)
    if not path.is_file():
        raise SchemaError(f"transitions file {path} does not exist")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise SchemaError(f"{path} is not a readable Parquet file ({error})") from None
    check_columns(schema, path)
    try:
        table = pq.read_table(path, columns=[name for name in COLUMNS if name in schema.names])
    except (pa.ArrowException, OSError) as error:  # a damaged page: the footer read, the data did not
        raise SchemaError(
            f"{path}: its data cannot be read ({error}); the file is damaged: collect it "
            "again (dreamgym collect) or restore it (dvc checkout)"
        ) from None
    table = table.cast(
        pa.schema(
            [
                table.schema.field(name).with_type(
                    _EQUIVALENT_TYPES.get(table.schema.field(name).type, table.schema.field(name).type)
                )
                for name in table.schema.names
            ]
        )
    )
    for name in OPTIONAL_COLUMNS:
        if name not in schema.names:
            table = table.add_column(
                COLUMNS.index(name),
                TRANSITION_SCHEMA.field(name).with_nullable(True),
                pa.nulls(table.num_rows, TRANSITION_SCHEMA.field(name).type),
            )
    if allow_nulls:
        return table.cast(NULLABLE_SCHEMA)
    with_nulls = [name for name in COLUMNS if not TRANSITION_SCHEMA.field(name).nullable and table[name].null_count]
    if with_nulls:
        raise SchemaError(
            f"{path}: null values in required columns {', '.join(with_nulls)}; "
            "`dreamgym validate` quarantines such rows"
        )
    return table.cast(TRANSITION_SCHEMA)


def read_metadata(path: str | Path) -> dict[str, Any] | None:
    """The `dreamgym` metadata stored in a Parquet file, or None if the file has none."""
    try:
        raw = (pq.read_schema(path).metadata or {}).get(METADATA_KEY)
    except (pa.ArrowInvalid, OSError):
        return None
    return json.loads(raw) if raw else None
