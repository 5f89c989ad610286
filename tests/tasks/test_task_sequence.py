"""The shared task sequence: exact across processes, failure-weighted in curriculum mode, resumable."""

from __future__ import annotations

import multiprocessing
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfengine.tasks.scheduler import Assignment, TaskSchedule, shard_pairs
from sfengine.tasks.sequence import SharedTaskSequence

SPAWN = multiprocessing.get_context("spawn")


def draw_many(sequence: SharedTaskSequence, count: int, start, results) -> None:
    start.wait(60)  # all at once: spawned processes start a second apart, far longer than the draws take
    results.put([tuple(sequence.next()) for _ in range(count)])


@pytest.mark.slow
def test_processes_drawing_at_once_get_each_position_exactly_once():
    schedule = TaskSchedule(shard_pairs([7, 3, 5], rank=0, world_size=1))
    sequence = SharedTaskSequence.allocate(schedule)
    start, results = SPAWN.Barrier(4), SPAWN.Queue()
    # Enough draws that the drawers overlap for many thousands of positions: a position read by two of them
    # before either writes it back is handed out twice.
    draws = 20_000
    processes = [SPAWN.Process(target=draw_many, args=(sequence, draws, start, results)) for _ in range(3)]
    for process in processes:
        process.start()
    draw_many(sequence, draws, start, results)
    drawn = Counter(Assignment(*a) for _ in range(4) for a in results.get(timeout=120))
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert int(sequence.position[0]) == 4 * draws
    assert drawn == Counter(schedule.at(p) for p in range(4 * draws))


def test_curriculum_draws_a_failing_task_more_often():
    schedule = TaskSchedule(shard_pairs([5] * 4, rank=0, world_size=1))
    sequence = SharedTaskSequence.allocate(schedule, curriculum=True, window=10)
    for task in range(4):
        for _ in range(10):
            sequence.record(task, success=task != 2)  # task 2 fails all its last 10 episodes
    drawn = Counter(sequence.next().task for _ in range(2000))
    # Weights 11 : 1 : 1 : 1 -> task 2 gets about 11/14 of the draws.
    assert 0.7 < drawn[2] / 2000 < 0.86
    assert all(drawn[task] > 50 for task in (0, 1, 3))  # a task that succeeds is still visited


def test_curriculum_weights_recover_when_a_failing_task_starts_succeeding():
    schedule = TaskSchedule(shard_pairs([5] * 4, rank=0, world_size=1))
    sequence = SharedTaskSequence.allocate(schedule, curriculum=True, window=10)

    def share_of_task_2(draws: int = 2000) -> float:
        return Counter(sequence.next().task for _ in range(draws))[2] / draws

    for task in range(4):
        for _ in range(10):
            sequence.record(task, success=task != 2)
    assert 0.7 < share_of_task_2() < 0.86  # weights 11 : 1 : 1 : 1
    # The task is learnt: each success pushes its oldest failure out of the window, so its weight falls back.
    for _ in range(5):
        sequence.record(2, success=True)
    assert 0.58 < share_of_task_2() < 0.75  # 5 failures left in the window: weights 6 : 1 : 1 : 1
    for _ in range(5):
        sequence.record(2, success=True)
    assert 0.18 < share_of_task_2() < 0.32  # no failure left: every task equally likely again
    # And a task that then fails again is favoured again, from its latest outcomes alone.
    for _ in range(10):
        sequence.record(2, success=False)
    assert 0.7 < share_of_task_2() < 0.86


@settings(max_examples=50, deadline=None)
@given(
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    group=st.integers(1, 3),
    outcomes=st.lists(st.booleans(), min_size=0, max_size=60),
)
def test_curriculum_keeps_every_tasks_init_states_cycling_without_gaps(counts, group, outcomes):
    schedule = TaskSchedule(shard_pairs(counts, rank=0, world_size=1), group)
    sequence = SharedTaskSequence.allocate(schedule, curriculum=True, window=5)
    per_task: dict[int, list[int]] = {}
    for i in range(len(outcomes) + 30):
        assignment = sequence.next()
        per_task.setdefault(assignment.task, []).append(assignment.init_state)
        if i < len(outcomes):
            sequence.record(assignment.task, outcomes[i])
    for task, states in per_task.items():
        # Each init state G times in a row, then the next, wrapping around: 0,0,1,1,2,2,0,0,...
        groups = [states[i : i + group] for i in range(0, len(states) - len(states) % group, group)]
        assert all(len(set(g)) == 1 for g in groups)
        assert [g[0] for g in groups] == [k % counts[task] for k in range(len(groups))]


def test_curriculum_state_resumes_the_same_sequence():
    schedule = TaskSchedule(shard_pairs([4, 4, 4], rank=0, world_size=1))
    first = SharedTaskSequence.allocate(schedule, curriculum=True, window=4, seed=3)
    for _ in range(7):
        assignment = first.next()
        first.record(assignment.task, assignment.task == 0)
    second = SharedTaskSequence.allocate(schedule, curriculum=True, window=4, seed=3)
    second.load_state_dict(first.state_dict())
    assert [second.next() for _ in range(20)] == [first.next() for _ in range(20)]


def test_episodes_handed_out_again_come_first_with_their_positions_and_survive_a_checkpoint():
    schedule = TaskSchedule(shard_pairs([4, 4], rank=0, world_size=1), group_size=2)
    sequence = SharedTaskSequence.allocate(schedule, envs=4)
    drawn = [sequence.next_with_position() for _ in range(5)]
    cut = [(a.task, a.init_state, position) for a, position in drawn[1:3]]  # a dead worker's two episodes
    assert sequence.hand_out_again([(episode, episode) for episode in cut]) == cut
    saved = sequence.state_dict()
    resumed = SharedTaskSequence.allocate(schedule, envs=4)
    resumed.load_state_dict(saved)
    for seq in (sequence, resumed):
        replayed = [seq.next_with_position() for _ in range(2)]
        assert sorted((a.task, a.init_state, p) for a, p in replayed) == sorted(cut)
        assert seq.next_with_position() == (schedule.at(5), 5)  # then the sequence goes on where it was


class Killed(Exception):
    """A worker's death inside a draw, right after it recorded the draw."""


def test_a_worker_killed_inside_a_draw_has_its_latest_counted_draw_handed_out_again():
    schedule = TaskSchedule(shard_pairs([4, 4], rank=0, world_size=1))
    sequence = SharedTaskSequence.allocate(schedule, envs=4)
    held_assignment, held_position = sequence.next_with_position()
    held = (*held_assignment, held_position)  # the episode the env played last, in its split table
    recorded = []

    def record(assignment, position):
        recorded.append((*assignment, position))

    def record_then_die(assignment, position):
        record(assignment, position)
        raise Killed

    # Killed after recording its next draw, before the draw counted: the draw never happened, and the env's
    # episode is the one it held.
    with pytest.raises(Killed):
        sequence.next_with_position(record_then_die)
    assert int(sequence.position[0]) == 1
    assert sequence.hand_out_again([(held, recorded[-1])]) == [held]
    assert sequence.next_with_position() == (held_assignment, held_position)
    # Killed after the draw counted, before its env took it (the split table still shows the episode before):
    # the draw is the env's episode; handing out the one before instead would skip this position for good.
    drawn = sequence.next_with_position(record)
    assert sequence.hand_out_again([(held, recorded[-1])]) == [recorded[-1]]
    assert sequence.next_with_position() == drawn
    # The same for an episode waiting to be handed out again (another dead worker's): killed before its draw
    # counted, it still waits, once, and the env's own episode waits too; killed after, it was the env's.
    own = recorded[-1]
    assert sequence.hand_out_again([(held, held)]) == [held]
    with pytest.raises(Killed):
        sequence.next_with_position(record_then_die)
    assert recorded[-1] == held
    assert sequence.hand_out_again([(own, recorded[-1])]) == [own]
    assert sequence.next_with_position() == (Assignment(*own[:2]), own[2])
    assert sequence.next_with_position(record) == (held_assignment, held_position)
    assert sequence.hand_out_again([(own, recorded[-1])]) == [held]
    assert sequence.next_with_position() == (held_assignment, held_position)
    assert sequence.next_with_position() == (schedule.at(2), 2)  # then on with the sequence, nothing skipped
