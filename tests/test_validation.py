"""Validation on a real collected dataset: each test corrupts a copy one way and checks exactly
which rows are quarantined and why."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dreamgym.data.config import ValidationConfig
from dreamgym.data.schema import (
    METADATA_KEY,
    NULLABLE_SCHEMA,
    SchemaError,
    content_hash,
    read_transitions,
    to_table,
    write_transitions,
)
from dreamgym.data.validation import find_bad_rows, quarantine_reasons, validate_transitions

CONFIG = ValidationConfig()
ONE_LINE_PARSE_ERROR = (
    "state does not parse as an abstract state (expected 4 lines (location, visible, inventory, actions), got 1)"
)
CHAIN = "next_state differs from the state of the trajectory's next step"
NOT_AVAILABLE = "action is not among the state's available actions"


@pytest.fixture(scope="module")
def records(offline_dataset) -> list[dict]:
    return read_transitions(offline_dataset).to_pylist()


@pytest.fixture(scope="module")
def trajectories(records) -> dict[str, list[int]]:
    """Row positions of each trajectory, in file order."""
    rows: dict[str, list[int]] = {}
    for index, row in enumerate(records):
        rows.setdefault(row["trajectory_id"], []).append(index)
    assert len(rows) >= 3 and all(len(r) >= 5 for r in rows.values()), "fixture changed shape"
    return rows


@pytest.fixture
def rows(records) -> list[dict]:
    return [dict(row) for row in records]  # a copy to corrupt


@pytest.fixture
def traj(trajectories) -> list[int]:
    """The rows of the first trajectory, the one most tests corrupt."""
    return next(iter(trajectories.values()))


def rehashed(row: dict) -> dict:
    """The row with the content hash of its (corrupted) content, as a collector with that bug
    would write it; a row whose content cannot be hashed (a null) keeps its hash."""
    try:
        return {**row, "content_hash": content_hash(row)}
    except (TypeError, ValueError):
        return row


def run(tmp_path, rows, config=CONFIG, schema=None, rehash=True):
    """Write `rows` (each with the hash of its content unless not `rehash`), validate them; the
    result and the quarantine as {row_index: reasons}."""
    rows = [rehashed(row) for row in rows] if rehash else rows
    table = pa.Table.from_pylist(rows, schema=schema) if schema else to_table(rows)
    source = tmp_path / "in.parquet"
    write_transitions(table, source)
    result = validate_transitions(
        source,
        config,
        quarantine_path=tmp_path / "quarantine.parquet",
        report_path=tmp_path / "report.json",
        clean_path=tmp_path / "clean.parquet",
    )
    quarantine = pq.read_table(result.quarantine_path).to_pylist()
    return result, {row["row_index"]: row["quarantine_reasons"] for row in quarantine}


def expected(trajectory_rows, records, direct):
    """The quarantine of one trajectory: `direct` rows with their reasons, the rest with the
    trajectory reason naming the steps of the direct rows."""
    steps = sorted({records[row]["step"] for row in direct})
    label = "step" if len(steps) == 1 else "steps"
    reason = f"trajectory has invalid rows ({label} {', '.join(map(str, steps))})"
    return {row: direct.get(row, [reason]) for row in trajectory_rows}


def check_one_bad_trajectory(tmp_path, rows, traj, direct, reason_counts, rehash=True):
    result, quarantine = run(tmp_path, rows, rehash=rehash)
    rows = [rehashed(row) for row in rows] if rehash else rows
    assert quarantine == expected(traj, rows, direct)
    assert result.reasons == reason_counts
    assert (result.rows, result.quarantined_rows, result.valid_rows) == (len(rows), len(traj), len(rows) - len(traj))
    assert result.quarantined_trajectories == 1
    clean = read_transitions(result.clean_path).to_pylist()
    assert clean == [row for index, row in enumerate(rows) if index not in set(traj)]
    return result


def test_clean_dataset_passes(tmp_path, records, offline_dataset):
    result, quarantine = run(tmp_path, records)
    assert quarantine == {}
    assert (result.rows, result.valid_rows, result.quarantined_rows) == (len(records), len(records), 0)
    assert result.passed and result.bad_fraction == 0.0 and result.reasons == {}
    clean = pq.read_table(result.clean_path)
    assert clean.equals(read_transitions(offline_dataset))
    assert "PASSED" in result.summary()
    # The empty quarantine still has every column, so downstream can tell validation ran.
    schema = pq.read_schema(result.quarantine_path)
    assert schema.names[-2:] == ["quarantine_reasons", "row_index"]
    assert schema.field("quarantine_reasons").type == pa.list_(pa.string())


def test_clean_output_keeps_input_metadata(tmp_path, offline_dataset):
    result = validate_transitions(offline_dataset, CONFIG, clean_path=tmp_path / "clean.parquet")
    original = pq.read_schema(offline_dataset).metadata[METADATA_KEY]
    assert pq.read_schema(result.clean_path).metadata[METADATA_KEY] == original
    assert result.quarantine_path is None and result.report_path is None


def test_empty_state(tmp_path, rows, traj):
    rows[traj[0]]["state"] = ""
    check_one_bad_trajectory(
        tmp_path,
        rows,
        traj,
        {traj[0]: ["state is empty", ONE_LINE_PARSE_ERROR]},
        {"state is empty": 1, "state does not parse as an abstract state": 1},
    )


def test_empty_action(tmp_path, rows, traj):
    rows[traj[1]]["action"] = ""
    check_one_bad_trajectory(
        tmp_path, rows, traj, {traj[1]: ["action is empty", NOT_AVAILABLE]}, {"action is empty": 1, NOT_AVAILABLE: 1}
    )


@pytest.mark.parametrize("reward", [10.5, -2.0])
def test_reward_out_of_range(tmp_path, rows, traj, reward):
    rows[traj[2]]["reward"] = reward
    check_one_bad_trajectory(
        tmp_path, rows, traj, {traj[2]: ["reward outside [-1, 10]"]}, {"reward outside [-1, 10]": 1}
    )


@pytest.mark.parametrize("reward", [float("inf"), float("nan")])
def test_a_reward_that_is_not_a_number_is_named_so_not_null(tmp_path, rows, traj, reward):
    rows[traj[2]]["reward"] = reward
    reasons = ["reward outside [-1, 10]", "reward is not a finite number"]
    check_one_bad_trajectory(tmp_path, rows, traj, {traj[2]: reasons}, dict.fromkeys(reasons, 1))


def test_a_content_hash_that_is_not_the_rows_own_is_quarantined(tmp_path, rows, traj):
    rows[traj[1]]["action"] = rows[traj[1]]["expert_action"] or rows[traj[1]]["action"]
    rows[traj[1]]["reward"] = rows[traj[1]]["reward"] + 0.5  # edited after the hash was computed
    check_one_bad_trajectory(
        tmp_path,
        rows,
        traj,
        {traj[1]: ["content_hash is not the hash of the row's content"]},
        {"content_hash is not the hash of the row's content": 1},
        rehash=False,
    )


def test_null_values_are_quarantined_not_fatal(tmp_path, rows, traj):
    rows[traj[0]]["state"] = None
    rows[traj[3]]["reward"] = None
    result, quarantine = run(tmp_path, rows, schema=NULLABLE_SCHEMA)
    assert quarantine == expected(traj, rows, {traj[0]: ["state is null"], traj[3]: ["reward is null"]})
    assert result.reasons == {"state is null": 1, "reward is null": 1}
    # The quarantine keeps the nulls as they were read.
    assert pq.read_table(result.quarantine_path).to_pylist()[0]["state"] is None


def test_step_gap(tmp_path, rows, traj):
    rows[traj[2]]["step"] = 5
    check_one_bad_trajectory(
        tmp_path,
        rows,
        traj,
        {traj[2]: ["step out of sequence within its trajectory (expected 2, got 5)"]},
        {"step out of sequence within its trajectory": 1},
    )


def test_final_step_not_terminated(tmp_path, rows, traj):
    last = traj[-1]
    assert rows[last]["terminated"] and not rows[last]["truncated"]
    rows[last]["terminated"] = False
    reason = "last step of its trajectory is neither terminated nor truncated"
    check_one_bad_trajectory(tmp_path, rows, traj, {last: [reason]}, {reason: 1})


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_episode_end_in_the_middle(tmp_path, rows, traj, flag):
    rows[traj[2]][flag] = True
    reason = "terminated or truncated before the last step of its trajectory"
    check_one_bad_trajectory(tmp_path, rows, traj, {traj[2]: [reason]}, {reason: 1})


def test_both_terminated_and_truncated(tmp_path, rows, traj):
    rows[traj[-1]]["truncated"] = True
    check_one_bad_trajectory(
        tmp_path, rows, traj, {traj[-1]: ["both terminated and truncated"]}, {"both terminated and truncated": 1}
    )


def test_next_state_chain_broken(tmp_path, rows, traj, trajectories):
    other = list(trajectories.values())[1]
    replacement = rows[other[-1]]["next_state"]  # a valid state text from another episode
    assert replacement != rows[traj[2]]["state"]
    rows[traj[1]]["next_state"] = replacement
    check_one_bad_trajectory(tmp_path, rows, traj, {traj[1]: [CHAIN]}, {CHAIN: 1})


def test_unparseable_state_also_breaks_the_chain_into_it(tmp_path, rows, traj):
    rows[traj[2]]["state"] = "You are in a kitchen."
    # Step 1's next_state no longer matches step 2's state: that row fails too.
    check_one_bad_trajectory(
        tmp_path,
        rows,
        traj,
        {traj[1]: [CHAIN], traj[2]: [ONE_LINE_PARSE_ERROR]},
        {CHAIN: 1, "state does not parse as an abstract state": 1},
    )


def test_unparseable_next_state(tmp_path, rows, traj):
    rows[traj[-1]]["next_state"] = rows[traj[-1]]["next_state"].split("\n")[0]  # location only
    reason = "next_state does not parse as an abstract state"
    check_one_bad_trajectory(
        tmp_path, rows, traj, {traj[-1]: [ONE_LINE_PARSE_ERROR.replace("state", "next_state", 1)]}, {reason: 1}
    )


def test_action_not_available(tmp_path, rows, traj):
    rows[traj[1]]["action"] = "dance with the fridge"
    check_one_bad_trajectory(tmp_path, rows, traj, {traj[1]: [NOT_AVAILABLE]}, {NOT_AVAILABLE: 1})


def test_action_availability_is_only_checked_on_textworld(tmp_path, rows, traj):
    rows[traj[1]]["action"] = "dance with the fridge"
    rows[traj[1]]["env"] = "webshop"
    result, quarantine = run(tmp_path, rows)
    assert quarantine == {} and result.passed


def test_duplicate_content_hash(tmp_path, rows, traj):
    rows.append(dict(rows[traj[1]]))
    duplicate = len(rows) - 1
    result, quarantine = run(tmp_path, rows)
    # Only the later copy is flagged, as a duplicate (not also as a broken chain or step).
    assert quarantine == expected(
        [*traj, duplicate], rows, {duplicate: [f"duplicate content_hash (same as row {traj[1]})"]}
    )
    assert result.reasons == {"duplicate content_hash": 1}
    assert result.quarantined_trajectories == 1


@pytest.mark.parametrize(
    "column, limit, extra",
    [
        ("instruction", 8000, []),
        ("state", 8000, [ONE_LINE_PARSE_ERROR]),
        ("action", 200, [NOT_AVAILABLE]),
    ],
)
def test_text_too_long(tmp_path, rows, traj, column, limit, extra):
    rows[traj[0]][column] = "x" * (limit + 1)
    reason = f"{column} is longer than {limit} characters"
    check_one_bad_trajectory(
        tmp_path, rows, traj, {traj[0]: [reason, *extra]}, {reason: 1, **{e.split(" (")[0]: 1 for e in extra}}
    )


def test_text_at_the_limit_passes(tmp_path, rows, traj):
    rows[traj[0]]["instruction"] = "x" * CONFIG.max_text_chars
    assert run(tmp_path, rows)[1] == {}


def test_source_not_in_set(tmp_path, rows, traj):
    rows[traj[3]]["source"] = "simulated"
    check_one_bad_trajectory(
        tmp_path,
        rows,
        traj,
        {traj[3]: ["source is not one of real, synthetic"]},
        {"source is not one of real, synthetic": 1},
    )


def test_whole_trajectories_are_quarantined_and_others_untouched(tmp_path, rows, trajectories):
    first, second, *rest = trajectories.values()
    rows[first[1]]["reward"] = 99.0
    rows[first[3]]["action"] = "sing"
    rows[second[0]]["source"] = "made-up"
    result, quarantine = run(tmp_path, rows)
    assert quarantine == {
        **expected(first, rows, {first[1]: ["reward outside [-1, 10]"], first[3]: [NOT_AVAILABLE]}),
        **expected(second, rows, {second[0]: ["source is not one of real, synthetic"]}),
    }
    assert quarantine[first[0]] == ["trajectory has invalid rows (steps 1, 3)"]
    assert result.quarantined_trajectories == 2
    assert result.quarantined_rows == len(first) + len(second)
    untouched = [row for traj in rest for row in traj]
    assert [r["content_hash"] for r in read_transitions(result.clean_path).to_pylist()] == [
        rows[row]["content_hash"] for row in untouched
    ]


def test_threshold(tmp_path, rows, traj):
    rows[traj[0]]["source"] = "simulated"
    fraction = len(traj) / len(rows)
    below = ValidationConfig(max_bad_fraction=fraction - 0.001)
    above = ValidationConfig(max_bad_fraction=fraction + 0.001)
    failed, _ = run(tmp_path, rows, config=below)
    passed, _ = run(tmp_path, rows, config=above)
    assert failed.bad_fraction == pytest.approx(fraction) and not failed.passed
    assert passed.bad_fraction == pytest.approx(fraction) and passed.passed
    assert "FAILED" in failed.summary() and "source is not one of real, synthetic" in failed.summary()
    # The default 2% is below one whole trajectory of this small dataset.
    assert not run(tmp_path, rows)[0].passed


def test_empty_file_fails(tmp_path):
    result, quarantine = run(tmp_path, [])
    assert quarantine == {}
    assert (result.rows, result.quarantined_rows, result.passed) == (0, 0, False)


def test_missing_column_is_a_schema_error(tmp_path, records):
    table = to_table(records).drop_columns(["reward"])
    write_transitions(table, tmp_path / "in.parquet")
    with pytest.raises(SchemaError, match="missing columns reward"):
        validate_transitions(tmp_path / "in.parquet", CONFIG)


def test_wrong_type_is_a_schema_error(tmp_path, records):
    table = to_table(records)
    table = table.set_column(table.schema.get_field_index("step"), "step", table["step"].cast(pa.string()))
    write_transitions(table, tmp_path / "in.parquet")
    with pytest.raises(SchemaError, match="step is string"):
        validate_transitions(tmp_path / "in.parquet", CONFIG)


def test_report_holds_the_gx_result(tmp_path, rows, traj):
    rows[traj[2]]["reward"] = float("inf")
    _result, _ = run(tmp_path, rows)

    def not_json(constant):
        raise AssertionError(f"report is not strict JSON: {constant}")

    report = json.loads((tmp_path / "report.json").read_text(), parse_constant=not_json)
    assert report["dreamgym"]["quarantined_rows"] == len(traj)
    assert report["dreamgym"]["reasons"] == {"reward outside [-1, 10]": 1, "reward is not a finite number": 1}
    gx = report["great_expectations"]
    assert gx["success"] is False
    failed = {r["expectation_config"]["kwargs"]["column"]: r["result"] for r in gx["results"] if not r["success"]}
    assert set(failed) == {"reward", "check_reward_finite"}
    assert failed["reward"]["unexpected_index_list"] == [traj[2]]
    assert failed["check_reward_finite"]["unexpected_index_list"] == [traj[2]]
    assert failed["reward"]["unexpected_list"] == ["inf"]
    assert len(gx["results"]) == len(report["dreamgym"]["checks"])


def test_pure_helpers_on_a_dataframe(records, traj):
    df = to_table(records).to_pandas()
    assert find_bad_rows(df, CONFIG) == {}
    df.loc[traj[1], "action"] = "sing"
    df.loc[traj[1], "content_hash"] = content_hash(df.loc[traj[1]].to_dict())
    bad = find_bad_rows(df, CONFIG)
    assert bad == {traj[1]: [NOT_AVAILABLE]}
    assert quarantine_reasons(df, bad) == expected(traj, records, bad)


def test_an_expert_action_the_state_does_not_offer_is_quarantined(tmp_path, rows, traj):
    assert all(row["expert_action"] for row in rows), "collection records the expert's action"
    rows[traj[1]]["expert_action"] = "fly to the moon"
    check_one_bad_trajectory(
        tmp_path,
        rows,
        traj,
        {traj[1]: ["expert_action is not among the state's available actions"]},
        {"expert_action is not among the state's available actions": 1},
    )


def test_a_file_without_the_expert_action_column_reads_as_unlabelled(tmp_path, offline_dataset):
    table = pq.read_table(offline_dataset).drop_columns(["expert_action"])
    pq.write_table(table, tmp_path / "older.parquet")
    read = read_transitions(tmp_path / "older.parquet")
    assert read.column_names == pq.read_schema(offline_dataset).names
    assert read["expert_action"].null_count == read.num_rows
    result = validate_transitions(tmp_path / "older.parquet", CONFIG)
    assert result.passed and result.quarantined_rows == 0
