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


# One Python for a project's benchmarks: each is run as `python benchmarks/<script>` runs it (as
# __main__, its own stdout), but torch and the library are imported once, not six times (~30 s of
# the suite on 2 cores).
_ONE_PROCESS = """
import contextlib, io, json, runpy, sys, traceback
benchmarks, runs = sys.argv[1], json.loads(sys.argv[2])
sys.path[0] = benchmarks  # as `python benchmarks/<script>` sets it: not the working directory
printed = []
for script, args in runs:
    sys.argv = [script, *args]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            sys.exit(f"{script} exited with {stop.code}")
    except BaseException:
        traceback.print_exc()
        sys.exit(f"{script} failed")
    printed.append(out.getvalue())
print(json.dumps(printed))
"""


def run_benchmarks(runs: list[tuple[str, list[str], Path | None]], cwd: Path) -> list[dict]:
    """The benchmarks `runs` (script, its arguments, the JSON file it writes or None for the JSON
    it prints last), one after the other in one Python process in `cwd`; their reports, in order."""
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    scripts = [(str(ROOT / "benchmarks" / script), args) for script, args, _ in runs]
    command = [sys.executable, "-c", _ONE_PROCESS, str(ROOT / "benchmarks"), json.dumps(scripts)]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    return [
        json.loads(written.read_text()) if written is not None else json.loads(out.strip().splitlines()[-1])
        for (_, _, written), out in zip(runs, printed, strict=True)
    ]


def smoke_project_benchmarks(project: Path, overrides: dict, bc_policy: Path, tmp: Path) -> None:
    """The benchmarks that read a finished project, on the pipeline test's tiny one: each runs and
    reports what it measured (the project's own parameters are left as the pipeline read them)."""
    tmp.mkdir(parents=True, exist_ok=True)
    params = str(write_params(project, overrides, "bench-params.yaml"))
    bundle, held_out = tmp / "bundle", project / "outputs" / "experience" / "fidelity_real.parquet"
    [model_dir] = (project / "outputs" / "experience").glob("model-*/model")
    dream_run = sorted((project / "outputs" / "policy").glob("rl-*-dream-*"))[0].name
    tables = sorted((project / "outputs" / "policy").glob("eval-*.episodes.csv"))
    games = [arg for folder in sorted((project / "data" / "games").iterdir()) for arg in ("--games", str(folder))]
    test_games = str(project / "data" / "games" / "test")
    experience, synthetic, live, replayed, scaling, rl, divergence, failures, bc, losses = run_benchmarks(
        [
            (
                "experience.py",
                ["--params", params, "--transitions", "2", "--batches", "2", "--repeats", "1",
                 "--json", str(tmp / "experience.json")],
                tmp / "experience.json",
            ),
            (
                "synthetic_env.py",
                ["--params", params, "--batches", "4", "--steps", "2", "--repeats", "1", "--real-games", "1",
                 "--policy", str(bc_policy), "--json", str(tmp / "synthetic.json")],
                tmp / "synthetic.json",
            ),
            # The pretrained backbone's two halves, both on the CPU here: the export records
            # retrieval and measures the project's model live; the GPU half measures that same
            # model from the bundle alone (retrieval replayed) and must score what it scored live.
            (
                "pretrained_experience.py",
                ["--params", params, "export", "--out", str(bundle), "--set", f"held-out={held_out}",
                 "--check-transitions", "4"],
                bundle / "baseline.json",
            ),
            (
                "pretrained_experience.py",
                ["--params", params, "run", "--bundle", str(bundle), "--trained", str(model_dir), "--sets",
                 "held-out", "--throughput-batches", "1", "--throughput", "2", "--work", str(tmp / "work"),
                 "--json", str(tmp / "replayed.json")],
                tmp / "replayed.json",
            ),
            # The LM-only scaling table's row: the LM trained on the project's data (here made to
            # write every change) and no model, measured on the same transitions.
            (
                "experience_scaling.py",
                ["--params", params, "--out", str(tmp / "scaling"), "--real", str(held_out),
                 "experience.epochs=0.5", "experience.copy_examples=false"],
                None,
            ),
            (
                "real_rl_settings.py",
                ["--params", params, "--start", str(bc_policy), "--out", str(tmp / "rl"),
                 "--games", test_games, "rl.real_budget=20", "rl.epochs=1"],
                None,
            ),
            # The dream's episodes, written back by the project's RL run, replayed in their real games.
            ("dream_divergence.py", ["--params", params, "--run", dream_run], None),
            # How the project's evaluated policies lost their games.
            ("failure_modes.py", [*map(str, tables), *games, "--json", str(tmp / "fails.json")], tmp / "fails.json"),
            # The project's own BC under its own settings: reused, not trained again, then played.
            ("bc_settings.py", ["--params", params, "--out", str(bc_policy.parent), "--games", test_games], None),
            # How sure BC was of the moves it lost the test games by, and whether real RL changed them.
            (
                "confident_losses.py",
                ["--params", params, "--start", str(bc_policy), "--trained", str(tmp / "rl" / "policy"),
                 "--games", test_games,
                 "--json", str(tmp / "losses.json")],
                tmp / "losses.json",
            ),
        ],
        cwd=project,
    )  # fmt: skip
    assert experience["batches"]["2"]["transitions_per_s"] > 0 and experience["parameters"] > 0
    assert synthetic["real_steps_per_s"] > 0 and synthetic["synthetic"]["4"]["transitions_per_s"] > 0
    # GRPO's rollouts without and with the recorded real steps recalled (the pipeline's default).
    plain, recalling = synthetic["grouped"]["4"], synthetic["grouped_recalling"]["4"]
    assert plain["recalled_share"] == 0 and 0 <= recalling["recalled_share"] <= 1
    live = live["sets"]["held-out"]
    assert live["model"]["transitions"] > 0 and 0 <= live["no_model"]["next_state_exact_match"] <= 1
    for key in ("transitions", "next_state_exact_match", "reward_accuracy", "done_accuracy"):
        assert replayed["sets"]["held-out"][key] == live["model"][key], key
    assert replayed["throughput"]["transitions_per_s"]["1"] > 0
    assert scaling["steps"] > 0 and scaling["examples"] >= scaling["transitions"] > 0
    measured = scaling[str(held_out)]
    assert measured["lm"]["transitions"] == measured["no_model"]["transitions"] > 0
    assert set(rl["wins"]) == {"start test", "trained test"}
    assert 0 < rl["curve"]["real_transitions"][-1] <= 20  # real RL spends real transitions, within its budget
    # (The tiny model's dream may write nothing back: test_a_dream_episode_is_followed_... below replays one.)
    assert divergence["run"] == dream_run and sum(divergence["outcomes"].values()) == divergence["replayed"]
    assert sum(divergence["parted_at_verb"].values()) == divergence["outcomes"].get("parted", 0)
    assert len(tables) >= 2 and list(failures["tables"]) == list(map(str, tables))
    for table in failures["tables"].values():
        assert sum(table["endings"].values()) == table["episodes"] > 0
        assert table["wins"] == table["endings"].get("won", 0)
    assert bc["reused"] and bc["steps"] > 0 and set(bc["wins"]) == {"test"}
    assert bc["wins"]["test"] == rl["wins"]["start test"]  # the same policy, played greedily on the same games
    won, played = map(int, bc["wins"]["test"].split("/"))
    assert len(losses["rows"]) == played - won == sum(row["lost"] for row in losses["summary"].values())
    assert all(0 < row["start_p"] <= 1 and 0 < row["trained_p"] <= 1 for row in losses["rows"])


RECIPE = (
    "You are hungry! Let's cook a delicious meal. Check the cookbook in the kitchen for the recipe. Once done, "
    "enjoy your meal! Recipe: ingredients: carrot, white tuna. directions: dice the carrot; fry the carrot; "
    "slice the white tuna; roast the white tuna; prepare meal."
)  # a headroom game's, as `load_task` reads it


@pytest.mark.parametrize(
    ("actions", "won", "truncated", "expected"),
    [
        (["take carrot", "prepare meal", "eat meal"], True, False, "won"),
        (["go east", "go west"], False, True, "out of steps"),
        (["take carrot", "cook carrot with oven"], False, False, "cook: the wrong appliance to fry"),
        (["cook white tuna with stove"], False, False, "cook: the wrong appliance to roast"),
        (["cook carrot with stove", "cook carrot with stove"], False, False, "cook: again"),
        (["take carrot", "chop carrot with knife"], False, False, "cut: the wrong cut"),
        (["dice carrot with knife", "dice carrot with knife"], False, False, "cut: again"),
        (["cook red onion with stove"], False, False, "cook: not an ingredient"),
        (["take carrot", "eat carrot"], False, False, "eat: an ingredient"),
        (["drop carrot"], False, False, "other: drop"),
    ],
)
def test_a_lost_game_is_judged_by_its_last_step_against_the_recipe(actions, won, truncated, expected, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from failure_modes import ending

    assert ending(actions, won, truncated, RECIPE) == expected


def test_a_dream_episode_is_followed_in_its_real_game_until_the_step_that_differs(
    offline_dataset, train_games, monkeypatch
):
    """dream_divergence.py's replay, on a real episode taken as a dream: a faithful dream is followed
    to its end; one whose third step leads to another room parts there, in the location."""
    import dataclasses

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from dream_divergence import replay

    from dreamgym.data.schema import read_transitions
    from dreamgym.envs.textworld.env import TextWorldEnv, load_task
    from dreamgym.state import parse_state

    rows = read_transitions(offline_dataset).to_pylist()
    first = min(row["trajectory_id"] for row in rows)
    episode = sorted((row for row in rows if row["trajectory_id"] == first), key=lambda row: row["step"])
    [game] = [game for game in train_games if game.stem == episode[0]["task_id"]]
    env = TextWorldEnv(len(episode) + 1)
    assert replay(env, load_task(game), episode) == {"outcome": "followed", "followed": len(episode)}
    elsewhere = dataclasses.replace(parse_state(episode[2]["next_state"]), location="imagined room")
    dreamt = [*episode[:2], episode[2] | {"next_state": elsewhere.to_text()}, *episode[3:]]
    assert replay(env, load_task(game), dreamt) == {
        "outcome": "parted",
        "followed": 2,
        "verb": episode[2]["action"].split()[0],
        "differs": ["location"],
    }
