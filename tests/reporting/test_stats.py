"""Run statistics: the early stop at a target return or success rate, and the learner's share of the time."""

from __future__ import annotations

import json
import math

import pytest

from sfengine.engine.messages import EpisodeStats, LearnerReport
from sfengine.reporting import stats as stats_module
from sfengine.reporting.reporter import json_text
from sfengine.reporting.stats import RunStats


def episodes(returns: list[float], success: float = math.nan) -> list[EpisodeStats]:
    return [EpisodeStats(episode_return=r, length=10, success=success, task=0) for r in returns]


def test_a_target_counts_only_once_the_window_is_full_and_its_mean_reaches_it():
    stats = RunStats(stats_window=4, initial_env_steps=0)
    stats.add_episodes(episodes([500.0, 500.0, 500.0]))
    assert stats.target_reached(400.0, math.inf) is None  # three lucky first episodes are not a full window
    stats.add_episodes(episodes([90.0]))  # mean 397.5
    assert stats.target_reached(400.0, math.inf) is None
    stats.add_episodes(episodes([110.0]))  # the window slides: 500, 500, 90, 110 -> 300
    assert stats.target_reached(300.0, math.inf) == (
        "the mean return of the last 4 episodes, 300.0, reached --stop_at_return=300"
    )
    assert stats.target_reached(math.inf, math.inf) is None  # the defaults never stop a run


def test_a_success_target_reads_the_success_of_the_window():
    stats = RunStats(stats_window=4, initial_env_steps=0)
    stats.add_episodes(episodes([1.0, 1.0, 0.0], success=1.0) + episodes([0.0], success=0.0))
    assert stats.target_reached(math.inf, 0.8) is None  # 3 of 4
    assert stats.target_reached(math.inf, 0.75) == (
        "the mean success of the last 4 episodes, 0.750, reached --stop_at_success=0.75"
    )
    assert stats.target_reached(0.0, math.inf).startswith("the mean return of the last 4 episodes, 0.5")


def test_a_reached_target_keeps_its_window_in_the_summary_while_the_run_stops():
    stats = RunStats(stats_window=4, initial_env_steps=0)
    stats.add_episodes(episodes([1.0] * 4, success=1.0))
    assert (
        stats.target_reached(math.inf, 0.8)
        == "the mean success of the last 4 episodes, 1.000, reached --stop_at_success=0.8"
    )
    stats.freeze_windows()  # the runner stops here; episodes that finish while it stops are counted, not windowed
    stats.add_episodes(episodes([0.0, 0.0], success=0.0))
    summary = stats.summary()
    assert (summary["success_rate"], summary["episode_return_mean"], summary["episodes"]) == (1.0, 1.0, 6)


def test_summaries_are_strict_json_where_a_loss_diverged():
    text = json_text({"loss": math.nan, "curve": [1.0, math.inf], "nested": {"x": -math.inf}, "n": 3})
    assert json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name}")) == {
        "loss": None,
        "curve": [1.0, None],
        "nested": {"x": None},
        "n": 3,
    }


def test_an_update_longer_than_a_status_window_counts_in_every_window_it_spans(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(stats_module.time, "time", lambda: now[0])
    stats = RunStats(stats_window=4, initial_env_steps=0)
    # Two short updates in a 5 s window: their own time.
    now[0] = 1002.0
    stats.add_learner_report(LearnerReport(256, 1, 0.5, 0.0, {}))
    now[0] = 1005.0
    stats.add_learner_report(LearnerReport(512, 2, 0.5, 0.0, {}))
    assert stats.time_split()["learner"] == pytest.approx(0.2)
    # An update of 12 s from 1006: busy in the windows it spans while under way, and its end counts only its part
    # in the window it ends in (not 12 s in 5).
    now[0] = 1010.0
    assert stats.time_split(learner_busy_since=1006.0)["learner"] == pytest.approx(0.8)
    now[0] = 1015.0
    assert stats.time_split(learner_busy_since=1006.0)["learner"] == pytest.approx(1.0)
    now[0] = 1018.0
    stats.add_learner_report(LearnerReport(768, 3, 12.0, 0.0, {}))
    now[0] = 1020.0
    assert stats.time_split()["learner"] == pytest.approx(0.6)
