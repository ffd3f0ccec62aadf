"""Real-environment policy evaluation: the Wilson interval, reproducible reports, the CLI."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from dreamgym.config import PipelineConfig
from dreamgym.errors import DreamgymError
from dreamgym.evaluation import (
    EPISODE_COLUMNS,
    episodes_path,
    evaluate_held_out,
    evaluate_policy,
    evaluation_metrics,
    held_out_games,
    summarize,
    wilson_interval,
    write_episodes,
    write_report,
)
from dreamgym.ops.config import EvaluationConfig
from dreamgym.policy.config import PolicyConfig
from dreamgym.policy.model import load_policy

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"
TINY_POLICY = PolicyConfig(vocab_size=400, hidden_size=32, layers=1, heads=2, max_length=512)


@pytest.fixture(scope="module")
def policy_dir(offline_dataset, tmp_path_factory) -> Path:
    """An untrained from-scratch policy (tokenizer learned from the BC examples), saved."""
    from dreamgym.data.schema import read_transitions
    from dreamgym.policy.bc import bc_examples, initial_policy, policy_kept_names

    rows = read_transitions(offline_dataset).to_pylist()
    kept = policy_kept_names(rows, TINY_POLICY)
    examples = bc_examples(rows, TINY_POLICY, kept)
    return initial_policy(examples, TINY_POLICY, seed=0, kept=kept).save(tmp_path_factory.mktemp("policy") / "policy")


@pytest.fixture(scope="module")
def policy(policy_dir):
    return load_policy(policy_dir)


@pytest.mark.parametrize(
    ("successes", "n", "expected"),
    [
        (8, 10, (0.4902, 0.9433)),
        (0, 10, (0.0, 0.2775)),
        (10, 10, (0.7225, 1.0)),
        (5, 10, (0.2366, 0.7634)),
        (1, 1, (0.2065, 1.0)),
    ],
)
def test_wilson_interval_hand_values(successes, n, expected):
    assert wilson_interval(successes, n) == pytest.approx(expected, abs=1e-4)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)  # no trials: nothing known
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    narrower = wilson_interval(80, 100)
    assert narrower[0] > 0.4902 and narrower[1] < 0.9433  # more trials, tighter interval
    for bad in ((11, 10), (-1, 10), (0, -1)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)


def test_the_held_out_set_spreads_over_the_folder(tmp_path):
    """Game names sort by setting, so the held-out set is spread over the sorted names, not the
    first ones (which would be the easiest settings only)."""
    names = [f"cooking-test-r{recipe}t1g1-okc-s{seed}.z8" for recipe in (1, 2, 3) for seed in range(4)]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    chosen = held_out_games(dataclasses.replace(PipelineConfig(), evaluation=EvaluationConfig(games=6)), tmp_path)
    assert [game.name for game in chosen] == sorted(names)[::2]
    assert {name.split("-")[2] for name in (game.name for game in chosen)} == {"r1t1g1", "r2t1g1", "r3t1g1"}
    every = held_out_games(dataclasses.replace(PipelineConfig(), evaluation=EvaluationConfig(games=0)), tmp_path)
    assert [game.name for game in every] == sorted(names)
    more = held_out_games(dataclasses.replace(PipelineConfig(), evaluation=EvaluationConfig(games=40)), tmp_path)
    assert more == every


def test_summary_from_records():
    records = [
        {"won": True, "return": 3.0, "steps": 4},
        {"won": False, "return": 1.0, "steps": 10},
        {"won": True, "return": 2.0, "steps": 6},
        {"won": False, "return": 0.0, "steps": 10},
    ]
    summary = summarize(records)
    assert summary == {
        "episodes": 4,
        "wins": 2,
        "success_rate": 0.5,
        "ci95": list(wilson_interval(2, 4)),
        "mean_return": 1.5,
        "mean_steps": 7.5,
        "real_transitions": 30,
        "outcomes": "1010",  # won or lost, episode by episode in play order
    }
    assert "eval_outcomes" not in evaluation_metrics(summary)  # a string is not a metric
    assert evaluation_metrics(summary)["eval_ci95_low"] == summary["ci95"][0]


@pytest.mark.parametrize("greedy", [True, False])
def test_same_seed_same_report(policy, test_games, greedy):
    def run(seed):
        return evaluate_policy(
            policy, test_games, episodes_per_game=3, seed=seed, max_steps=6, greedy=greedy, batch=2, progress=False
        )

    first, again = run(7), run(7)
    assert first.summary == again.summary and first.records == again.records
    actions = [record["actions"] for record in first.records]
    if greedy:  # greedy episodes of one game repeat exactly
        assert len(set(actions)) == 1
    else:  # sampling differs between episodes and between seeds (fixed seeds: not flaky)
        assert len(set(actions)) > 1
        assert [record["actions"] for record in run(8).records] != actions


def test_report_numbers_are_consistent(policy, train_games, tmp_path):
    report = evaluate_policy(
        policy, train_games, episodes_per_game=2, seed=0, max_steps=6, greedy=False, batch=4, progress=False
    )
    summary, records = report.summary, report.records
    assert summary["episodes"] == len(records) == len(train_games) * 2
    assert [(record["game"], record["episode"]) for record in records] == [
        (game.name, index) for game in train_games for index in range(2)
    ]
    assert summary["real_transitions"] == sum(record["steps"] for record in records)
    wins = sum(record["won"] for record in records)
    assert summary["wins"] == wins and summary["success_rate"] == wins / len(records)
    assert summary["ci95"] == list(wilson_interval(wins, len(records)))
    assert summary["mean_steps"] == pytest.approx(summary["real_transitions"] / len(records))
    for record in records:
        assert 1 <= record["steps"] <= 6 and len(record["actions"].split(" | ")) == record["steps"]
        assert not (record["won"] and record["truncated"])
    written = list(csv.DictReader(write_episodes(records, tmp_path / "e.csv").open()))
    assert tuple(written[0]) == EPISODE_COLUMNS and len(written) == len(records)


def test_held_out_evaluation_and_its_report_are_what_the_cli_and_the_flow_share(policy, test_games, tmp_path):
    """`dreamgym eval`, the pipeline's evaluation task and the promotion gate play through
    `evaluate_held_out` (the config's settings and seed) and write through `write_report`."""
    evaluation = EvaluationConfig(episodes_per_game=2, max_steps=5, greedy=False)
    config = dataclasses.replace(PipelineConfig(), seed=3, evaluation=evaluation)
    report = evaluate_held_out(policy, test_games, config)
    assert report == evaluate_policy(policy, test_games, 2, 3, 5, greedy=False)
    path = tmp_path / "out" / "report.json"
    written = write_report(report, path, {"name": "tiny", "games": len(test_games)})
    assert list(written)[:3] == ["name", "games", "episodes"]  # the header first, then the summary
    assert json.loads(path.read_text()) == written == {"name": "tiny", "games": len(test_games), **report.summary}
    rows = list(csv.DictReader(episodes_path(path).open()))
    assert [int(row["steps"]) for row in rows] == [record["steps"] for record in report.records]


def test_eval_command_writes_report_and_logs_to_mlflow(policy_dir, test_games, mlflow_tracking, tmp_path, monkeypatch):
    import mlflow
    from typer.testing import CliRunner

    from dreamgym.cli import app

    for key in ("PREFECT_HOME", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"):  # restored after the test
        monkeypatch.delenv(key, raising=False)
    params = shutil.copy(PARAMS, tmp_path / "params.yaml")  # the run dir goes under tmp_path
    out = tmp_path / "eval" / "policy.json"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--policy",
            str(policy_dir),
            "--games",
            str(test_games[0].parent),
            "--episodes-per-game",
            "2",
            "--seed",
            "3",
            "--max-steps",
            "5",
            "--sample",
            "--json",
            str(out),
            "--params",
            str(params),
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(out.read_text())
    assert set(report) == {
        "policy",
        "games",
        "seed",
        "episodes_per_game",
        "max_steps",
        "greedy",
        "episodes",
        "wins",
        "success_rate",
        "ci95",
        "mean_return",
        "mean_steps",
        "real_transitions",
        "outcomes",
    }
    assert len(report["outcomes"]) == report["episodes"] and report["outcomes"].count("1") == report["wins"]
    assert (report["policy"], report["games"], report["seed"], report["episodes"], report["greedy"]) == (
        str(policy_dir),
        len(test_games),
        3,
        2 * len(test_games),
        False,
    )
    assert len(report["ci95"]) == 2 and 0 <= report["ci95"][0] <= report["success_rate"] <= report["ci95"][1] <= 1
    rows = list(csv.DictReader(episodes_path(out).open()))
    assert len(rows) == report["episodes"] and sum(int(row["steps"]) for row in rows) == report["real_transitions"]
    assert "success" in result.output and "95% CI" in result.output

    [run] = mlflow.search_runs(
        search_all_experiments=True, filter_string="tags.`dreamgym.stage` = 'policy-eval'", output_format="list"
    )
    assert run.info.run_name == "policy-eval" and run.data.tags["dreamgym.policy"] == str(policy_dir)
    assert run.data.metrics["eval_success_rate"] == report["success_rate"]
    assert run.data.metrics["eval_real_transitions"] == report["real_transitions"]
    logged = {Path(a.path).name for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "evaluation")}
    assert logged == {"policy.json", "policy.episodes.csv"}


def test_eval_command_bad_input(policy_dir, test_games, tmp_path):
    from typer.testing import CliRunner

    from dreamgym.cli import app

    def invoke(policy: str, games: Path) -> BaseException | None:
        return (
            CliRunner()
            .invoke(
                app,
                [
                    "eval",
                    "--policy",
                    policy,
                    "--games",
                    str(games),
                    "--json",
                    str(tmp_path / "x.json"),
                    "--params",
                    str(PARAMS),
                ],
            )
            .exception
        )

    done = CliRunner().invoke(app, ["eval", "--help"])
    assert done.exit_code == 0 and "--episodes-per-game" in done.output
    empty = tmp_path / "empty"
    empty.mkdir()
    error = invoke(str(policy_dir), empty)
    assert (
        isinstance(error, DreamgymError)
        and "no games (.z8) or tasks (.swtask)" in str(error)
        and "dreamgym games" in str(error)
    )
    error = invoke(str(tmp_path / "no-policy"), test_games[0].parent)
    assert isinstance(error, DreamgymError) and "no such folder" in str(error) and "models:/" in str(error)
