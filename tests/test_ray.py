"""The distributed engine (compute.task_runner: ray): work cut into pieces gives what one process
gives. The cutting is checked as pure functions; the real held-out evaluation of a tiny policy on
the real tiny games runs on a real local Ray with two workers, through the flows' own stage task."""

from __future__ import annotations

import csv
import dataclasses
import time
from pathlib import Path

import pytest

# The tiny policy and its fixtures: tests/test_evaluation.py's, not a copy.
from test_evaluation import policy, policy_dir  # noqa: F401

from dreamgym.config import PipelineConfig
from dreamgym.errors import ConfigError
from dreamgym.evaluation import evaluate_policy
from dreamgym.ops.config import ComputeConfig, EvaluationConfig
from dreamgym.ops.fanout import InProcess, evaluate_in_pieces
from dreamgym.ops.sharding import evaluation_shards, evaluation_unit, merge, split
from flows.compute import compute_settings, ray_init_kwargs

# 16 greedy episodes per game fill one batch of 16 (evaluation.BATCH), so an evaluation can be cut
# after any game: the three tiny training games make two shards (one game, two) for two workers.
EPISODES, MAX_STEPS = 16, 6


def test_split_keeps_the_order_and_cuts_evenly_in_whole_blocks():
    items = list(range(10))
    assert split(items, 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert split(items, 2, unit=4) == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]  # blocks 0-3, 4-7, 8-9
    assert split(items, 5, unit=4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # fewer blocks than pieces
    assert split(items, 1) == [items] and split([], 4) == []
    for pieces in range(1, 12):
        for unit in range(1, 5):
            parts = split(items, pieces, unit)
            assert merge(parts) == items and all(parts)
            assert all(len(part) % unit == 0 for part in parts[:-1])
    with pytest.raises(ValueError, match="at least 1"):
        split(items, 0)


def test_evaluation_shards_fall_on_batch_boundaries_and_sampling_is_never_cut():
    assert evaluation_unit(episodes_per_game=1, batch=16) == 16
    assert evaluation_unit(episodes_per_game=3, batch=16) == 16  # 48 episodes: 3 whole batches
    assert evaluation_unit(episodes_per_game=4, batch=16) == 4
    assert evaluation_unit(episodes_per_game=16, batch=16) == 1
    games = [f"g{i}" for i in range(40)]
    # 40 episodes are 3 batches (16, 16, 8): every batch whole, as in one process.
    shards = evaluation_shards(games, pieces=4, episodes_per_game=1, batch=16, greedy=True)
    assert [len(shard) for shard in shards] == [16, 16, 8] and merge(shards) == games
    assert [len(shard) for shard in evaluation_shards(games, 2, 1, 16, greedy=True)] == [16, 24]
    assert evaluation_shards(games, pieces=4, episodes_per_game=1, batch=16, greedy=False) == [games]
    assert evaluation_shards([], pieces=4, episodes_per_game=1, batch=16, greedy=False) == []


def test_the_environment_switches_to_ray_and_is_checked():
    local = ComputeConfig()
    assert compute_settings(local, {}) == local  # the default: no Ray
    chosen = compute_settings(local, {"DREAMGYM_RAY_ADDRESS": "ray://head:10001"})
    assert (chosen.task_runner, chosen.ray_address) == ("ray", "ray://head:10001")
    assert compute_settings(local, {"RAY_ADDRESS": "head:6379"}) == local  # Ray's own variable does not switch
    with pytest.raises(
        ConfigError, match=r"DREAMGYM_RAY_ADDRESS='http://head': use 'local', 'auto', 'ray://HOST:PORT'"
    ):
        compute_settings(local, {"DREAMGYM_RAY_ADDRESS": "http://head"})


def test_ray_arguments_carry_the_workers_environment(prefect_server, monkeypatch):
    from prefect.settings import PREFECT_API_URL

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////shared/mlflow.db")
    kwargs = ray_init_kwargs(ComputeConfig(task_runner="ray", ray_workers=3))
    assert (kwargs["address"], kwargs["num_cpus"], kwargs["include_dashboard"]) == ("local", 3, False)
    # The test server is set in Prefect's settings only, never in os.environ: it must travel.
    assert kwargs["runtime_env"]["env_vars"]["PREFECT_API_URL"] == PREFECT_API_URL.value().rstrip("/")
    assert kwargs["runtime_env"]["env_vars"]["MLFLOW_TRACKING_URI"] == "sqlite:////shared/mlflow.db"
    joined = ray_init_kwargs(ComputeConfig(task_runner="ray", ray_address="auto"))
    assert joined["address"] == "auto" and "num_cpus" not in joined  # a cluster's CPUs are its own
    with pytest.raises(ConfigError, match="cannot reach this machine's Prefect API"):
        ray_init_kwargs(ComputeConfig(task_runner="ray", ray_address="ray://head.example:10001"))


@pytest.mark.parametrize("greedy", [True, False])
def test_pieces_in_process_give_the_one_process_report(policy, policy_dir, train_games, greedy):  # noqa: F811
    """The cutting and merging alone, without a cluster: greedy in three shards, sampled in one."""
    kwargs = {"episodes_per_game": 8 if greedy else 2, "seed": 5, "max_steps": MAX_STEPS, "greedy": greedy}
    alone = evaluate_policy(policy, train_games, progress=False, **kwargs)
    pieces = evaluate_in_pieces(policy_dir, train_games, fanout=InProcess(width=3), **kwargs)
    assert pieces.records == alone.records and pieces.summary == alone.summary


@pytest.fixture(scope="module")
def ray_compute(prefect_server):
    """A real local Ray with two workers, started as the pipeline starts it, for the module."""
    from flows.compute import ray_cluster

    compute = ComputeConfig(task_runner="ray", ray_address="local", ray_workers=2)
    with ray_cluster(compute):
        yield compute
    # ray_cluster stopped it: a later module finds no Ray running.


def _episodes(json_path: str) -> list[dict]:
    with Path(json_path).with_suffix(".episodes.csv").open() as file:
        return list(csv.DictReader(file))


def _piece_runs(flow_state, seconds: float = 60) -> list[str]:
    """The states of the flow run's `evaluate-piece` task runs (one per shard), once none is
    running: a Ray worker's task states reach the server as events, after its result (under load
    one was still `Running` on the server when the flow had ended)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    flow_run = FlowRunFilter(id=FlowRunFilterId(any_=[flow_state.state_details.flow_run_id]))
    deadline = time.monotonic() + seconds
    while True:
        # The sync client sends None for an unset sort and limit, which the server refuses.
        runs = get_client(sync_client=True).read_task_runs(
            flow_run_filter=flow_run, sort=TaskRunSort.EXPECTED_START_TIME_ASC, limit=100
        )
        states = sorted(run.state.name for run in runs if run.name.startswith("evaluate-piece"))
        if "Running" not in states or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def test_real_evaluation_on_ray_matches_one_process(ray_compute, policy_dir, train_games, tmp_path):  # noqa: F811
    """The flows' evaluation stage task, in a flow on the default runner and on Ray: the same
    summary and per-episode records; on Ray the games were played in shards, one Prefect task each."""
    import ray
    from prefect import flow

    from flows.compute import fanout, on_compute
    from flows.train_policy import evaluate_task

    config = dataclasses.replace(
        PipelineConfig(),
        evaluation=EvaluationConfig(games=0, episodes_per_game=EPISODES, max_steps=MAX_STEPS, greedy=True),
    )

    @flow(name="evaluate-tiny-policy")
    def evaluate(out_dir: str) -> tuple[dict, int]:
        pieces = fanout()
        summary = evaluate_task("tiny", str(policy_dir), str(train_games[0].parent), out_dir, config, count=3)
        return summary, 0 if pieces is None else pieces.width

    local_state = evaluate(str(tmp_path / "local"), return_state=True)
    ray_state = on_compute(evaluate, ray_compute)(str(tmp_path / "ray"), return_state=True)
    (local, local_width), (distributed, ray_width) = local_state.result(), ray_state.result()

    assert (local_width, ray_width) == (0, 2)  # in this process locally; two pieces at once on Ray
    assert ray.cluster_resources()["CPU"] == 2
    assert _piece_runs(local_state) == [] and _piece_runs(ray_state) == ["Completed", "Completed"]
    local_path, distributed_path = local.pop("json_path"), distributed.pop("json_path")
    assert distributed == local and distributed["episodes"] == EPISODES * len(train_games)
    assert _episodes(distributed_path) == _episodes(local_path)


def test_collection_on_ray_matches_one_process(ray_compute, train_games, tmp_path):
    """The ingest flow's collection task on Ray: the same rows in the same order (all but the time
    each was written) and the same file metadata, so either runner reuses what the other made."""
    from prefect import flow

    from dreamgym.data.collect import CollectionSettings, collect
    from dreamgym.data.schema import read_metadata, read_transitions
    from flows.compute import on_compute
    from flows.ingest import collect_task

    settings = CollectionSettings("noisy-expert", 0.3, episodes_per_game=2, seed=0, max_steps=10)

    @flow(name="collect-tiny")
    def collect_flow(out: str):
        return collect_task([str(game) for game in train_games], out, settings, 1, "run")

    distributed = on_compute(collect_flow, ray_compute)(str(tmp_path / "ray.parquet"))
    local = collect(train_games, tmp_path / "local.parquet", settings, workers=1, run_id="run", progress=False)

    def rows(path: str) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "created_at"} for row in read_transitions(path).to_pylist()]

    assert not distributed.reused and rows(distributed.path) == rows(local.path)
    assert read_metadata(distributed.path) == read_metadata(local.path)
    assert (distributed.transitions, distributed.success_rate) == (local.transitions, local.success_rate)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["local.parquet", "ray.parquet"]  # parts removed
    again = collect(train_games, distributed.path, settings, workers=1, run_id="run", progress=False)
    assert again.reused
