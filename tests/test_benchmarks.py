"""The reusable benchmarks of benchmarks/ run at a tiny size and measure what they say they measure.

The ones that need a finished project (a trained experience model, a BC policy, the buffer) run on
the pipeline test's project: `smoke_project_benchmarks`, called by tests/test_pipeline.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_params

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(
    script: str, *args: str, cwd: Path = ROOT, report: Path | None = None, writes: Path | None = None
) -> dict:
    """Runs benchmarks/`script` with `args` (and `--json report` when given); its JSON report, the
    JSON file it `writes` by itself, or else the JSON it prints last."""
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    command = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    if report is not None:
        command += ["--json", str(report)]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    if report is not None or writes is not None:
        return json.loads((report or writes).read_text())
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_buffer_benchmark_finds_the_true_neighbours_through_the_index(tmp_path):
    report = run_benchmark(
        "buffer.py",
        *("--scales", "1000", "--vectors", "lowrank", "--queries", "10", "--ef", "40", "--batch-ef", "40"),
        *("--sample-rows", "200", "--increment", "200", "--batch-rows", "200", "--repeats", "1"),
        report=tmp_path / "buffer.json",
    )
    assert set(report["sample_ingest"]) == {"with_index", "without_index"}
    assert all(report["sample_ingest"]["with_index"][path] > 0 for path in ("copy_bulk", "copy_per_batch"))
    scale = report["scales"]["lowrank"]["1000"]
    search = next(row for row in scale["queries"] if row["form"] == "search")
    # Half the queries have a near-duplicate stored: an index that works finds nearly all ten.
    assert search["recall_at_10"] >= 0.9, search
    assert scale["batching"]["batched_qps"] > 0 and scale["index_build_s"] > 0


def test_encoder_benchmark_encodes_each_distinct_text_once(offline_dataset, tmp_path):
    from dreamgym.buffer.embeddings import transition_text
    from dreamgym.data.schema import read_transitions

    report = run_benchmark(
        "encoder.py", "--data", str(offline_dataset), "--rows", "16", "--repeats", "1", report=tmp_path / "e.json"
    )
    rows = read_transitions(offline_dataset).to_pylist()[:16]
    assert report["texts"] == 16
    assert report["distinct_texts"] == len({transition_text(r["instruction"], r["state"], r["action"]) for r in rows})
    assert set(report["texts_per_second"]) == {"float32", "bf16", "encoder"}
    assert all(rate > 0 for rate in report["texts_per_second"].values())


def test_policy_scoring_benchmark_times_bc_steps_and_decisions(offline_dataset, tmp_path):
    report = run_benchmark(
        "policy_scoring.py",
        *("--data", str(offline_dataset), "--batch", "4", "--act-batch", "4", "--steps", "1", "--repeats", "1"),
        report=tmp_path / "p.json",
    )
    assert report["examples"] > 0 and report["mean_candidates"] > 1  # a choice among the available actions
    assert report["bc_examples_per_second"] > 0 and report["act_decisions_per_second"] > 0


@pytest.mark.long
def test_real_env_benchmark_generates_plays_and_collects(tmp_path):
    report = run_benchmark("real_env.py", "--games", "2", "--repeats", "1", report=tmp_path / "r.json")
    medians = report["median"]
    assert {"env_steps_per_s", "collect_transitions_per_s_2_workers", "generate_s_per_game_1_worker"} <= set(medians)
    assert all(value > 0 for value in medians.values())


def smoke_project_benchmarks(project: Path, overrides: dict, bc_policy: Path, tmp: Path) -> None:
    """The benchmarks that read a finished project, on the pipeline test's tiny one: each runs and
    reports what it measured (the project's own parameters are left as the pipeline read them)."""
    tmp.mkdir(parents=True, exist_ok=True)
    params = write_params(project, overrides, "bench-params.yaml")
    at = {"cwd": project}

    experience = run_benchmark(
        "experience.py", *("--params", str(params), "--transitions", "2", "--batches", "2", "--repeats", "1"),
        report=tmp / "experience.json", **at,
    )  # fmt: skip
    assert experience["batches"]["2"]["transitions_per_s"] > 0 and experience["parameters"] > 0

    synthetic = run_benchmark(
        "synthetic_env.py",
        *("--params", str(params), "--batches", "4", "--steps", "2", "--repeats", "1", "--real-games", "1"),
        *("--policy", str(bc_policy)),
        report=tmp / "synthetic.json", **at,
    )  # fmt: skip
    assert synthetic["real_steps_per_s"] > 0 and synthetic["synthetic"]["4"]["transitions_per_s"] > 0
    # GRPO's rollouts without and with the recorded real steps recalled (the pipeline's default).
    plain, recalling = synthetic["grouped"]["4"], synthetic["grouped_recalling"]["4"]
    assert plain["recalled_share"] == 0 and 0 <= recalling["recalled_share"] <= 1

    # The pretrained backbone's two halves, both on the CPU here: the export records retrieval and
    # measures the project's model live; the GPU half measures that same model from the bundle
    # alone (retrieval replayed) and must score what it scored live.
    bundle, held_out = tmp / "bundle", project / "outputs" / "experience" / "fidelity_real.parquet"
    live = run_benchmark(
        "pretrained_experience.py", "--params", str(params), "export", "--out", str(bundle),
        "--set", f"held-out={held_out}", "--check-transitions", "4", writes=bundle / "baseline.json", **at,
    )["sets"]["held-out"]  # fmt: skip
    assert live["model"]["transitions"] > 0 and 0 <= live["no_model"]["next_state_exact_match"] <= 1
    [model_dir] = (project / "outputs" / "experience").glob("model-*/model")
    replayed = run_benchmark(
        "pretrained_experience.py", "--params", str(params), "run", "--bundle", str(bundle),
        "--trained", str(model_dir), "--sets", "held-out", "--throughput-batches", "1", "--throughput", "2",
        "--work", str(tmp / "work"), report=tmp / "replayed.json", **at,
    )  # fmt: skip
    for key in ("transitions", "next_state_exact_match", "reward_accuracy", "done_accuracy"):
        assert replayed["sets"]["held-out"][key] == live["model"][key], key
    assert replayed["throughput"]["transitions_per_s"]["1"] > 0

    # The LM-only scaling table's row: the LM trained on the project's data (here made to write every
    # change) and no model, measured on the same transitions.
    scaling = run_benchmark(
        "experience_scaling.py", "--params", str(params), "--out", str(tmp / "scaling"), "--real", str(held_out),
        "experience.epochs=0.5", "experience.copy_examples=false", **at,
    )  # fmt: skip
    assert scaling["steps"] > 0 and scaling["examples"] >= scaling["transitions"] > 0
    measured = scaling[str(held_out)]
    assert measured["lm"]["transitions"] == measured["no_model"]["transitions"] > 0

    rl = run_benchmark(
        "real_rl_settings.py",
        *("--params", str(params), "--start", str(bc_policy), "--out", str(tmp / "rl")),
        *("--games", str(project / "data" / "games" / "test"), "rl.real_budget=20", "rl.epochs=1"),
        **at,
    )
    assert set(rl["wins"]) == {"start test", "trained test"}
    assert 0 < rl["curve"]["real_transitions"][-1] <= 20  # real RL spends real transitions, within its budget
