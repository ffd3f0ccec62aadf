"""The dream-vs-real gap's arithmetic and warning (dreamgym/rl/monitor.py), on hand-made episodes."""

from __future__ import annotations

import pytest

from dreamgym.envs.base import Task
from dreamgym.rl.monitor import GAP_WARNING, gap_metrics, gap_warning
from dreamgym.rl.rollout import Episode


def episode(task_id: str, won: bool, steps: int, real: bool, cut: bool = False) -> Episode:
    played = Episode(Task(task_id, "cook", "textworld"), won=won, cut=cut, real=real)
    played.rewards = [0.0] * steps
    played.decisions = [None] * steps  # only counted here
    return played


def test_the_gap_compares_the_same_tasks_only():
    dream = [
        episode("a", True, 3, False),
        episode("a", True, 4, False),
        episode("b", False, 5, False),
        episode("variation", True, 2, False),  # no real game: left out
        episode("a", True, 9, False, cut=True),
    ]  # outcome unknown: left out
    real = [episode("a", False, 6, True), episode("a", True, 4, True), episode("b", False, 7, True)]
    metrics = gap_metrics(dream, real)
    assert metrics["dream_success_checked"] == pytest.approx(2 / 3)
    assert metrics["real_success_rate"] == pytest.approx(1 / 3)
    assert metrics["dream_real_gap"] == pytest.approx(1 / 3)
    assert metrics["real_check_transitions"] == 17
    assert gap_metrics(dream, []) == {}


def test_a_large_positive_gap_warns_and_a_negative_one_does_not():
    metrics = {"epoch": 3.0, "dream_success_checked": 0.9, "real_success_rate": 0.2, "dream_real_gap": 0.7}
    assert "exploiting" in gap_warning(metrics)
    assert gap_warning({**metrics, "dream_real_gap": GAP_WARNING - 0.01}) is None
    assert gap_warning({**metrics, "dream_real_gap": -0.5}) is None
    assert gap_warning({"epoch": 1.0}) is None
