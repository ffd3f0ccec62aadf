import itertools
import random
from dataclasses import replace

import pyarrow.compute as pc
import pytest

from dreamgym.data.collect import CollectionSettings, choose_action, collect, summarize
from dreamgym.data.schema import COLUMNS, MISTAKE_POLICY, content_hash, read_metadata, read_transitions
from dreamgym.envs.textworld.cooking import TextWorldCooking
from dreamgym.errors import DreamgymError
from dreamgym.state import parse_state


def test_choose_action_follows_the_policy():
    available = ("a", "b", "c")
    rng = random.Random(0)
    assert {choose_action("expert", rng, 0.0, available, "b") for _ in range(50)} == {"b"}
    assert {choose_action("noisy-expert", rng, 0.0, available, "b") for _ in range(50)} == {"b"}
    noisy = [choose_action("noisy-expert", rng, 0.5, available, "b") for _ in range(2000)]
    # With epsilon 0.5, "b" comes from the expert half the time and from the uniform draw a sixth.
    assert 0.62 < noisy.count("b") / len(noisy) < 0.71
    assert set(choose_action("random", rng, 0.0, available, "b") for _ in range(100)) == set(available)
    assert choose_action("expert", rng, 0.0, available, None) in available  # no plan: act at random


def test_settings_are_checked():
    with pytest.raises(DreamgymError, match="unknown policy"):
        CollectionSettings("greedy", 0.1, 1, 0, 10)
    with pytest.raises(DreamgymError, match="epsilon"):
        CollectionSettings("noisy-expert", 1.5, 1, 0, 10)


def test_offline_dataset_is_well_formed(offline_dataset):
    table = read_transitions(offline_dataset)
    assert table.column_names == list(COLUMNS)
    rows = table.to_pylist()
    assert len({row["content_hash"] for row in rows}) == len(rows)
    assert all(row["content_hash"] == content_hash(row) for row in rows)
    assert all(row["source"] == "real" and row["policy"] == "noisy-expert(epsilon=0.3)" for row in rows)
    by_trajectory = {}
    for row in rows:
        by_trajectory.setdefault(row["trajectory_id"], []).append(row)
    assert len(by_trajectory) == 3 * 4
    for steps in by_trajectory.values():
        assert [row["step"] for row in steps] == list(range(len(steps)))
        assert all(row["action"] in parse_state(row["state"]).actions for row in steps)
        assert all(a["next_state"] == b["state"] for a, b in itertools.pairwise(steps))
        assert [row["terminated"] or row["truncated"] for row in steps] == [False] * (len(steps) - 1) + [True]
        assert sum(row["reward"] for row in steps) == steps[-1]["score"]


def test_policies_order_success_rates(train_games, tmp_path):
    rates = {}
    for policy, epsilon in (("expert", 0.0), ("noisy-expert", 0.5), ("random", 0.0)):
        settings = CollectionSettings(policy, epsilon, 3, seed=1, max_steps=30)
        rates[policy] = collect(train_games, tmp_path / f"{policy}.parquet", settings, progress=False).success_rate
    assert rates["expert"] == 1.0
    assert rates["random"] < rates["expert"]
    assert rates["random"] <= rates["noisy-expert"] <= rates["expert"]


def test_collection_is_reproducible_and_reused(train_games, tmp_path):
    settings = CollectionSettings("noisy-expert", 0.3, 2, seed=5, max_steps=30)
    first = collect(train_games, tmp_path / "a.parquet", settings, workers=2, progress=False)
    other = collect(train_games, tmp_path / "b.parquet", settings, workers=1, progress=False)
    hashes = [read_transitions(p)["content_hash"].to_pylist() for p in (first.path, other.path)]
    assert hashes[0] == hashes[1], "the number of workers must not change the data"
    assert not first.reused and read_metadata(first.path)["collection"]["seed"] == 5

    mtime = (tmp_path / "a.parquet").stat().st_mtime_ns
    again = collect(train_games, tmp_path / "a.parquet", settings, progress=False)
    assert again.reused and again.transitions == first.transitions
    assert (tmp_path / "a.parquet").stat().st_mtime_ns == mtime

    changed = collect(
        train_games,
        tmp_path / "a.parquet",
        CollectionSettings("noisy-expert", 0.3, 2, seed=6, max_steps=30),
        progress=False,
    )
    assert not changed.reused


def test_mistake_episodes_follow_the_expert_but_once_and_the_game_shows_what_the_mistake_does(train_games, tmp_path):
    settings = CollectionSettings(
        "noisy-expert", 0.3, 1, seed=0, max_steps=30, mistake_episodes=2, domain="textworld-cooking"
    )
    out = collect(train_games, tmp_path / "mistakes.parquet", settings, progress=False)
    rows = read_transitions(out.path).to_pylist()
    episodes = {}
    for row in rows:
        if row["policy"] == MISTAKE_POLICY:
            episodes.setdefault(row["trajectory_id"], []).append(row)
    per_game = {steps[0]["task_id"] for steps in episodes.values()}
    assert len(per_game) == len(train_games) and len(episodes) <= 2 * len(train_games)
    made = set()
    for steps in episodes.values():
        assert [row["step"] for row in steps] == list(range(len(steps)))
        assert all(a["next_state"] == b["state"] for a, b in itertools.pairwise(steps))
        wrong = [row for row in steps if row["action"] != row["expert_action"]]
        assert len(wrong) == 1, "the expert everywhere but at one step"
        mistake = wrong[0]
        assert mistake["action"] in TextWorldCooking().mistakes(mistake["instruction"], mistake["expert_action"])
        made.add((mistake["task_id"], mistake["step"], mistake["action"]))
        # what the real game does with it: tw-cooking loses a wrongly prepared ingredient
        assert mistake is steps[-1] and mistake["terminated"] and mistake["lost"] and mistake["reward"] == 0
    assert len(made) == len(episodes), "each episode of a game makes another mistake"
    assert sum(row["policy"] != MISTAKE_POLICY for row in rows) > 0  # the behaviour policy's episodes stay

    none = replace(settings, domain="none")
    plain = read_transitions(collect(train_games, tmp_path / "none.parquet", none, progress=False).path)
    assert MISTAKE_POLICY not in plain["policy"].to_pylist()


def test_summarize_counts_successes(offline_dataset):
    table = read_transitions(offline_dataset)
    summary = summarize(table)
    last = table.filter(pc.or_(table["terminated"], table["truncated"]))
    assert summary["trajectories"] == last.num_rows
    assert summary["success_rate"] == sum(last["won"].to_pylist()) / last.num_rows
