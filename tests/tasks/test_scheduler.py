from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfengine.tasks.scheduler import Assignment, TaskSchedule, shard_pairs


def test_tasks_are_dealt_to_ranks_round_robin():
    assert sorted(shard_pairs([3] * 9, rank=0, world_size=2)) == [0, 2, 4, 6, 8]
    assert sorted(shard_pairs([3] * 9, rank=1, world_size=2)) == [1, 3, 5, 7]


def test_init_state_cursor_wraps_without_gaps():
    schedule = TaskSchedule(shard_pairs([10], rank=0, world_size=1))
    draws = [[schedule.next().init_state for _ in range(4)] for _ in range(3)]
    assert draws == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]


def test_task_cursor_turns_round_robin_over_the_ranks_tasks():
    schedule = TaskSchedule(shard_pairs([2, 2, 2, 2], rank=1, world_size=2))  # tasks 1 and 3
    assert [schedule.next() for _ in range(5)] == [
        Assignment(1, 0),
        Assignment(3, 0),
        Assignment(1, 1),
        Assignment(3, 1),
        Assignment(1, 0),
    ]


def test_group_size_hands_out_each_pair_g_times_in_a_row():
    schedule = TaskSchedule({0: [0, 1]}, group_size=3)
    assert [schedule.next().init_state for _ in range(6)] == [0, 0, 0, 1, 1, 1]


def test_more_ranks_than_tasks_deals_pairs_so_no_rank_idles():
    shards = [shard_pairs([2, 3], rank, world_size=4) for rank in range(4)]
    assert all(shards)
    pairs = [(task, s) for shard in shards for task, states in shard.items() for s in states]
    assert sorted(pairs) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]


def test_schedule_resumes_where_it_stopped():
    first = TaskSchedule({0: [0, 1, 2], 1: [0, 1, 2]})
    seen = [first.next() for _ in range(4)]
    second = TaskSchedule({0: [0, 1, 2], 1: [0, 1, 2]})
    second.load_state_dict(first.state_dict())
    assert [second.next() for _ in range(2)] == [first.at(4), first.at(5)]
    assert seen[-1] != second.at(4)


@settings(max_examples=200, deadline=None)
@given(
    # A count of 0: a task left out of the run (--tasks) or of an evaluation (--eval_tasks).
    counts=st.lists(st.integers(0, 7), min_size=1, max_size=9).filter(any),
    world_size=st.integers(1, 12),
    group=st.integers(1, 3),
    cycles=st.integers(1, 3),
)
def test_every_pair_is_used_exactly_k_times_per_k_cycles_across_all_ranks(counts, world_size, group, cycles):
    used = Counter()
    for rank in range(world_size):
        shard = shard_pairs(counts, rank, world_size)
        if not shard:
            assert world_size > sum(counts)  # only when there are more ranks than pairs
            continue
        schedule = TaskSchedule(shard, group)
        for _ in range(cycles * schedule.cycle_length):
            used[schedule.next()] += 1
    expected = {Assignment(t, s): cycles * group for t, n in enumerate(counts) for s in range(n)}
    assert used == expected


def test_tasks_left_out_are_skipped_and_the_rest_dealt_as_if_alone():
    # Tasks 1 and 3 of five: rank 0 gets task 1 and rank 1 task 3, as two ranks share a two-task env.
    assert shard_pairs([5, 5, 5, 5, 5], 0, 2) == {0: list(range(5)), 2: list(range(5)), 4: list(range(5))}
    assert shard_pairs([0, 5, 0, 4, 0], 0, 2) == {1: list(range(5))}
    assert shard_pairs([0, 5, 0, 4, 0], 1, 2) == {3: list(range(4))}
    # More ranks than tasks: pairs of the chosen tasks only.
    assert shard_pairs([0, 2, 0, 1], 2, 3) == {3: [0]}


def test_empty_shard_is_refused():
    with pytest.raises(ValueError):
        TaskSchedule({})
