"""The evaluation's episode set, its statistics and its runner's count, without processes."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from sfengine.config import parse_config
from sfengine.engine.event_loop import EngineEventLoop
from sfengine.engine.messages import EpisodeStats, WorkerReport
from sfengine.env.multitask import TaskInfo
from sfengine.evaluation.episode_queue import SharedEpisodeQueue, evaluation_episodes
from sfengine.evaluation.evaluator import EvalRunner
from sfengine.evaluation.report import EvalReport, wilson_interval

TASKS = TaskInfo(["a", "b", "c"], [4, 2, 3], ["pick a", "pick b", "pick c"])


@pytest.mark.parametrize(
    "successes, n, expected",
    [(5, 10, (0.2366, 0.7634)), (0, 10, (0.0, 0.2775)), (10, 10, (0.7225, 1.0)), (45, 50, (0.7864, 0.9565))],
)
def test_wilson_interval_matches_the_published_formula(successes, n, expected):
    low, high = wilson_interval(successes, n)
    assert low == pytest.approx(expected[0], abs=1e-4) and high == pytest.approx(expected[1], abs=1e-4)
    # Exact at the ends, so that an interval always contains its rate (0.0 <= 0.0, 1.0 <= 1.0).
    assert low <= successes / n <= high


@pytest.mark.parametrize("n", [1, 7, 50, 500])
def test_wilson_bounds_are_exactly_0_and_1_at_no_and_all_successes(n):
    assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0


def test_queue_hands_out_every_episode_once_whatever_the_envs_current_tasks():
    episodes = evaluation_episodes(TASKS, 0, 1, episodes_per_init=2)
    queue = SharedEpisodeQueue(episodes)
    rng = random.Random(0)
    drawn = []
    while (episode := queue.next(rng.choice([-1, 0, 1, 2, 7]))) is not None:
        drawn.append(episode)
    assert Counter(e[:3] for e in drawn) == Counter(e[:3] for e in episodes) and len(drawn) == 2 * 9
    assert sorted(e.position for e in drawn) == list(range(18))  # each carries where it was drawn from
    assert queue.next(0) is None


def test_a_dead_workers_unreported_episodes_are_handed_out_again_first_and_once():
    queue = SharedEpisodeQueue(evaluation_episodes(TaskInfo(["a", "b", "c"], [3, 3, 3]), 0, 1))
    drawn = [queue.next(task, worker=0) for task in (0, 1, 2)]
    other = queue.next(0, worker=1)
    reported_one = queue.next(0, worker=0)
    assert [e[:2] for e in (*drawn, other, reported_one)] == [(0, 0), (1, 0), (2, 0), (0, 1), (0, 2)]
    # Worker 0 reported (0, 2) before it died: the other three it drew are lost; worker 1's draw is not touched.
    reported = {other.position, reported_one.position}
    again = queue.hand_out_again(0, reported)
    assert [e[:2] for e in again] == [(0, 0), (1, 0), (2, 0)] and all(not e.video for e in again)
    assert queue.hand_out_again(0, reported) == []  # already waiting: not handed out twice
    # Drawn before anything new, an env's own task first; then the sequence goes on where it was.
    assert [queue.next(task, worker=1)[:2] for task in (1, 2, 2, 2)] == [(1, 0), (2, 0), (0, 0), (2, 1)]
    rest = []
    while (episode := queue.next(2, worker=1)) is not None:
        rest.append(episode[:2])
    assert sorted(rest) == [(1, 1), (1, 2), (2, 2)]
    assert queue.hand_out_again(0, reported) == []  # worker 1 drew them since: nothing is worker 0's


def test_an_env_keeps_its_task_and_a_free_env_joins_the_task_with_most_left():
    queue = SharedEpisodeQueue(evaluation_episodes(TaskInfo(["a", "b", "c"], [3, 3, 3]), 0, 1))
    assert [queue.next(-1)[:2] for _ in range(3)] == [(0, 0), (1, 0), (2, 0)]  # free envs spread over the tasks
    assert [queue.next(1)[:2] for _ in range(2)] == [(1, 1), (1, 2)]  # an env keeps to its task
    assert queue.next(1)[:2] == (0, 1)  # task 1 ran out: the first of the tasks with the most left (2 each)
    assert queue.next(2)[:2] == (2, 1)
    assert [queue.next(0)[:2] for _ in range(2)] == [(0, 2), (2, 2)]
    assert queue.next(2) is None


def test_ranks_share_the_pairs_without_overlap_and_videos_mark_the_first_init_states():
    shards = [evaluation_episodes(TASKS, rank, 2, video_per_task=1) for rank in (0, 1)]
    pairs = [(e.task, e.init_state) for shard in shards for e in shard]
    assert sorted(pairs) == [(t, i) for t, count in enumerate([4, 2, 3]) for i in range(count)]
    assert {(e.task, e.init_state) for shard in shards for e in shard if e.video} == {(0, 0), (1, 0), (2, 0)}
    narrowed = evaluation_episodes(TASKS, 0, 1, only_tasks=[2], init_states=2)
    assert [(e.task, e.init_state) for e in narrowed] == [(2, 0), (2, 1)]
    with pytest.raises(ValueError, match="tasks 0..2"):
        evaluation_episodes(TASKS, 0, 1, only_tasks=[5])


def test_report_tables_per_task_with_instructions_and_overall():
    episodes = [EpisodeStats(1.0, 10, 1.0, 0, 0), EpisodeStats(0.0, 20, 0.0, 0, 1), EpisodeStats(1.0, 30, 1.0, 2, 0)]
    report = EvalReport(episodes, TASKS.task_names, TASKS.instructions)
    assert [(t.name, t.instruction, t.episodes, t.success_rate) for t in report.tasks] == [
        ("a", "pick a", 2, 0.5),
        ("c", "pick c", 1, 1.0),
    ]
    assert report.overall.success_rate == pytest.approx(2 / 3) and report.overall.length_mean == 20.0
    table = report.markdown()
    assert "| a | pick a | 2 | 0.500 [0.09, 0.91] | 0.50 | 15.0 |" in table
    assert "| **overall** |  | 3 | 0.667 [0.21, 0.94]" in table


def test_an_episode_reported_twice_after_a_respawn_counts_once():
    # A worker that reported an episode just before it died has it handed out again (its report was still on the way
    # when the runner looked): the replay's report must not count it a second time.
    cfg = parse_config(["--env=multitask_toy"])
    queue = SharedEpisodeQueue(evaluation_episodes(TaskInfo(["a"], [3]), 0, 1))
    runner = EvalRunner(EngineEventLoop("test_eval_runner", serial_mode=True), cfg, queue, None, leads=False)
    first, second = (EpisodeStats(1.0, 10, 1.0, 0, state, position) for state, position in ((0, 0), (1, 1)))
    runner.on_worker_report(WorkerReport(0, [first, second], 0.0, 0.0, 1.0))
    runner.on_worker_report(WorkerReport(1, [second._replace(success=0.0)], 0.0, 0.0, 1.0))
    assert runner.episodes == [first, second] and runner.repeats == 1
