"""A run that heals itself: rollout and inference workers killed, hung or dying at every start, with real processes
and real signals; and the repair of the shared-memory inboxes that makes a respawn possible."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from faster_fifo import Queue

from helpers import (
    FAST,
    assert_nothing_left,
    component,
    read_summary,
    running_component,
    shm_entries,
    start,
    train_command,
    wait_for_training,
    write_inference_fault_script,
    write_recording_script,
)
from sfengine.config import Config
from sfengine.engine import respawn
from sfengine.engine.hang_watch import HangWatch
from sfengine.engine.respawn import (
    COUNT,
    HEAD,
    MUTEX,
    MUTEX_OWNER,
    SIZE,
    TAIL,
    WAITER_COUNTS,
    DeadHolderWatch,
    Respawner,
    inbox_layout_known,
    lock_owner,
    release_lock_held_by,
    reset_waiters,
)
from sfengine.engine.supervision import Supervision
from sfengine.tasks.scheduler import Assignment, TaskSchedule, shard_pairs
from sfengine_envs.multitask_toy import NUM_INIT_STATES, NUM_TASKS


def start_training(train_dir: Path, experiment: str, *args: str, script: Path | None = None) -> subprocess.Popen:
    command = train_command(train_dir, experiment, *FAST, *args)
    if script is not None:
        command = [sys.executable, str(script), *command[3:]]
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if script is None:
        wait_for_training(process)
    return process


def wait_for_episodes(logs: Path, pattern: str, count: int, timeout: float = 120) -> None:
    """Wait until the recording envs whose logs match ``pattern`` have started ``count`` episodes in all."""
    deadline = time.time() + timeout
    while sum(len(path.read_text().splitlines()) for path in logs.glob(pattern)) < count:
        assert time.time() < deadline, f"no {count} episodes in {logs}/{pattern}"
        time.sleep(0.05)


def kill_and_wait_for_successor(process: subprocess.Popen, name: str) -> tuple[int, list[psutil.Process]]:
    """SIGKILL the component shown as ``name`` and wait for the one that replaces it. Returns the killed pid and
    every component process seen, to check afterwards that none outlived the run."""
    victim = component(process, name)
    seen = psutil.Process(process.pid).children(recursive=True)
    victim.kill()
    deadline = time.time() + 60
    # A short run can reach its env steps on the other workers before the successor has started; the checks on
    # its output and summary then say whether the respawn happened.
    while process.poll() is None:
        successor = running_component(process, name)
        if successor is not None and successor.pid != victim.pid:
            return victim.pid, [*seen, successor]
        assert time.time() < deadline, f"{name} was not respawned"
        time.sleep(0.2)
    return victim.pid, seen


@pytest.mark.parametrize(
    "name, layout",
    [
        ("sfe-rollout-1", "--num_inference_workers=1"),
        ("sfe-inference-0", "--num_inference_workers=1"),
        ("sfe-rollout-1", "--num_inference_workers=0"),  # a worker that acts itself: its successor acts too
        ("sfe-evaluator", "--eval_every_env_steps=20000"),  # a side job: its death must not end the training
    ],
)
@pytest.mark.slow
def test_a_killed_worker_is_respawned_and_the_run_trains_to_its_end(train_dir, name, layout):
    shm_before = shm_entries()
    # Stopped by the clock: the kill comes at the first status line with steps, a few seconds in, and a run of a
    # fixed number of env steps long enough for its successor on a fast machine would be minutes on a slow one.
    args = ["--train_for_env_steps=100000000", "--train_for_seconds=20", "--report_every_sec=1", layout]
    process = start_training(train_dir, "killed", *args)
    _, seen = kill_and_wait_for_successor(process, name)
    output = process.communicate(timeout=240)[0]
    assert process.returncode == 0, output[-3000:]
    summary = read_summary(train_dir, "killed")
    expected = {"rollout": "rollout_worker_1", "inference": "inference_worker_0", "evaluator": "evaluator"}
    expected = expected[name.split("-")[1]]
    assert summary["respawns"] == {expected: 1}
    assert summary["stop_reason"] == "trained for 20 s" and summary["exit_code"] == 0
    assert f"{expected} died (exit code -9); respawning it" in output
    if "rollout" in name:
        assert summary["respawn_dropped_trajectories"] == 4  # the rollouts of its 4 envs in flight
    assert summary["respawn_seconds_lost"] > 0  # its successor started and reported before the run's end
    if "evaluator" in name:  # its successor evaluates: the final weights at least
        assert summary["eval"][-1]["final"] and summary["eval"][-1]["env_steps"] == summary["env_steps"]
    assert_nothing_left(seen, shm_before)


@pytest.mark.slow
def test_an_inference_worker_hung_with_requests_in_hand_is_replaced_and_they_are_asked_again(tmp_path, train_dir):
    # One rollout worker with one split: the request its hung inference worker held is all it waits on, so unless it
    # asks the successor again the run makes no step more.
    shm_before = shm_entries()
    script = tmp_path / "hangs_once.py"
    write_inference_fault_script(script, tmp_path / "hung_once")
    args = ["--model=faults_once", "--env=CartPole-v1", "--num_workers=1", "--worker_num_splits=1"]
    args += ["--num_envs_per_worker=4", "--hang_timeout_sec=3", "--train_for_env_steps=20000"]
    command = [sys.executable, str(script), f"--train_dir={train_dir}", "--experiment=asked_again", *args]
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    children = []
    while not children and process.poll() is None:
        time.sleep(0.5)
        children = psutil.Process(process.pid).children(recursive=True)
    output = process.communicate(timeout=180)[0]
    assert process.returncode == 0, output[-3000:]
    assert "inference_worker_0 sent no report for" in output and "in act" in output  # its stack, in the forward
    summary = read_summary(train_dir, "asked_again")
    assert summary["respawns"] == {"inference_worker_0": 1} and summary["env_steps"] >= 20000
    assert_nothing_left(children, shm_before)


STOP_INSIDE_A_PUT_TO_THE_RUNNER = textwrap.dedent(
    """
    import ctypes
    import gc
    import signal

    from signal_slot.signal_slot import EventLoopObject

    from sfengine.engine.respawn import MUTEX, SIZE, TAIL


    def fault():
        # As a put to the runner that a signal stopped after the message's length: the lock held, the length
        # written and counted, the message's bytes never.
        objects = (o for o in gc.get_objects() if isinstance(o, EventLoopObject))
        inbox = next(o for o in objects if "runner" in o.receiver_queues).receiver_queues["runner"]
        base = ctypes.addressof(inbox.queue_obj_buffer)
        ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(base + MUTEX))
        capacity, tail = inbox.max_size_bytes, ctypes.c_size_t.from_address(base + TAIL)
        ring = (ctypes.c_ubyte * capacity).from_buffer(inbox.shared_memory)
        for i, byte in enumerate((200).to_bytes(8, sys.byteorder)):
            ring[(tail.value + i) % capacity] = byte
        tail.value = (tail.value + 8) % capacity
        ctypes.c_size_t.from_address(base + SIZE).value += 8
        os.kill(os.getpid(), signal.{signal})
    """
)


@pytest.mark.parametrize("end", ["SIGKILL", "SIGSTOP"])
@pytest.mark.slow
def test_a_worker_killed_or_frozen_inside_a_put_to_the_runner_does_not_stop_the_run(tmp_path, train_dir, end):
    # The runner waits for a held lock with no time limit, so unless the lock is freed from outside its loop (a dead
    # worker's), or its holder ended (a frozen one's, after 2x --hang_timeout_sec), the run would hang; unless the
    # half-written message is dropped, the runner's inbox would be garbage.
    script = tmp_path / "inside_a_put.py"
    fault = STOP_INSIDE_A_PUT_TO_THE_RUNNER.replace("{signal}", end)
    write_inference_fault_script(script, tmp_path / "faulted_once", fault=fault)
    args = ["--model=faults_once", *FAST, "--train_for_env_steps=40000", "--num_inference_workers=1"]
    args += ["--hang_timeout_sec=5"]
    command = [sys.executable, str(script), f"--train_dir={train_dir}", "--experiment=inside_a_put", *args]
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output[-3000:]
    if end == "SIGSTOP":
        assert "inference_worker_0 has held an inbox's lock for" in output
    assert "freed an inbox whose lock the dead process" in output
    assert "dropped 8 byte(s) of a message half written" in output
    assert read_summary(train_dir, "inside_a_put")["respawns"] == {"inference_worker_0": 1}, output[-6000:]


@pytest.mark.parametrize("critic_free", [False, True])
@pytest.mark.slow
def test_the_episodes_of_a_killed_worker_are_played_again_so_the_sequence_is_covered_exactly(
    tmp_path, train_dir, critic_free
):
    script, logs = tmp_path / "recorded.py", tmp_path / "logs"
    write_recording_script(script, logs)
    args = ["--env=recorded_toy", "--batch_size=512", "--num_batches_per_epoch=1", "--train_for_env_steps=16000"]
    group_size = 4 if critic_free else 1
    if critic_free:
        args += ["--advantage=rloo", f"--task_group_size={group_size}"]
    process = start_training(train_dir, "cover", *args, script=script)
    # Killed once its 4 envs have each played an episode or so, long before the run's end (a 16k-step run on this
    # toy takes a few seconds, less than its first status line with steps).
    wait_for_episodes(logs, "rank0_*_1_*.txt", 8)
    killed, _ = kill_and_wait_for_successor(process, "sfe-rollout-1")
    output = process.communicate(timeout=240)[0]
    assert process.returncode == 0, output[-3000:]
    assert read_summary(train_dir, "cover")["respawns"] == {"rollout_worker_1": 1}

    assert len(list(logs.glob(f"rank0_{killed}_1_*.txt"))) == 4  # the killed worker's 4 envs
    handed_out = re.search(r"rollout_worker_1: 4 episodes handed out again, \(task, init state\): (.*)", output)
    assert handed_out, output[-3000:]
    cut = [Assignment(int(t), int(s)) for t, s in re.findall(r"\((\d+), (\d+)\)", handed_out[1])]
    received = Counter()
    for path in logs.glob("*.txt"):
        received.update(Assignment(*map(int, line.split())) for line in path.read_text().splitlines())
    schedule = TaskSchedule(shard_pairs([NUM_INIT_STATES] * NUM_TASKS, 0, 1), group_size)

    def covered_exactly(unlogged: Counter) -> bool:
        # Every position of the sequence was handed out once, and the cut episodes once more, before it moved on.
        # An env logs its assignment when it resets: an episode drawn by an env that died before its reset is in
        # the sequence and among the cut ones, but in no log (``unlogged``).
        drawn = sum(received.values()) + sum(unlogged.values()) - len(cut)
        return received + unlogged == Counter(schedule.at(p) for p in range(drawn)) + Counter(cut)

    candidates = {tuple(sorted(c)) for r in range(len(cut) + 1) for c in itertools.combinations(cut, r)}
    assert any(covered_exactly(Counter(unlogged)) for unlogged in candidates), (cut, received)


DIES_AT_START_SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    import gymnasium as gym

    from sfengine import register_env
    from sfengine.train import main


    def make_cursed_cartpole(ctx):
        if ctx.worker_index == 1:
            os._exit(3)  # as a simulator that cannot start on this worker would (a missing device, a bad driver)
        return gym.make("CartPole-v1")


    register_env("cursed_cartpole", make_cursed_cartpole)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_worker_that_dies_at_every_start_stops_the_run_after_max_respawns(tmp_path, train_dir):
    shm_before = shm_entries()
    script = tmp_path / "cursed.py"
    script.write_text(DIES_AT_START_SCRIPT)
    command = [sys.executable, str(script), *train_command(train_dir, "cursed", *FAST)[3:]]
    command += ["--env=cursed_cartpole", "--max_respawns=2", "--train_for_env_steps=100000000"]
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = []
    while process.poll() is None and len(seen) < 3:
        with contextlib.suppress(psutil.NoSuchProcess):
            seen = psutil.Process(process.pid).children(recursive=True)
        time.sleep(0.1)
    output = process.communicate(timeout=240)[0]
    assert process.returncode == 1, output[-3000:]
    assert (
        "a component process died: rollout_worker_1_process (exit code 3); it was respawned 2 times within 3600 s "
        "(--max_respawns=2); stopping the run" in output
    )
    summary = read_summary(train_dir, "cursed")
    assert summary["respawns"] == {"rollout_worker_1": 2}
    assert summary["stop_reason"] == "process died: rollout_worker_1_process (exit code 3)"
    assert_nothing_left(seen, shm_before)


# SAC on a cheap env: its learner sets the pace and holds most of a worker's buffers, so a respawned rollout worker
# finds too few free to start every split at once (it crashed there, and its crashes used up --max_respawns).
CHAOS_RUNS = {
    "ppo": [],
    "sac": ["--algo=sac", "--env=Pendulum-v1", "--learning_starts=500", "--num_workers=2", "--num_envs_per_worker=4"],
}


@pytest.mark.slow
@pytest.mark.parametrize("run", CHAOS_RUNS)
def test_chaos_kills_workers_every_second_and_the_run_still_finishes(train_dir, run):
    # For 20 s of training: a respawn takes seconds (a new process imports torch), so how far a run of a fixed
    # length gets under kills every second depends wholly on the machine (12,000 env steps took 200 s beside two
    # benchmarks; 40,000 took 111 s quiet); the time limit holds the number of kills instead.
    shm_before = shm_entries()
    args = ["--train_for_env_steps=100000000", "--train_for_seconds=20", "--chaos_kill_every_sec=1", *CHAOS_RUNS[run]]
    process = start_training(train_dir, "chaos", *args)
    seen = {}
    while process.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess):
            seen.update({p.pid: p for p in psutil.Process(process.pid).children(recursive=True)})
        time.sleep(0.2)
    output = process.communicate(timeout=240)[0]
    assert process.returncode == 0, output[-3000:]
    summary = read_summary(train_dir, "chaos")
    assert summary["chaos_kills"] >= 5
    # Every kill but one made just before the stop was followed by a respawn, none counted against the budget,
    # and no successor died on its own.
    assert summary["chaos_kills"] - 1 <= sum(summary["respawns"].values()) <= summary["chaos_kills"], output[-3000:]
    assert "Traceback" not in output
    assert summary["env_steps"] >= 1024  # it trained between the kills
    assert_nothing_left(list(seen.values()), shm_before)


# ---------------------------------------------------------------------------------------- the inbox repair


# The processes around an inbox below only touch the queue: forked, they start in milliseconds (a spawned one
# imports this module, torch with it).
HELPERS = multiprocessing.get_context("fork")


def wait_in_get(queue) -> None:
    queue.get_many(timeout=1000)  # blocked in the queue's condition variable


def hold_the_lock(queue) -> None:
    ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(ctypes.addressof(queue.queue_obj_buffer) + MUTEX))
    time.sleep(1000)  # killed holding it, as a process killed inside a put would be


def receive_one(queue) -> None:
    queue.get_many(timeout=20)


def send_one(queue) -> None:
    queue.put(1, timeout=1)


def put_within(queue, seconds: float) -> bool:
    """Whether a sender process gets a message into ``queue`` within ``seconds`` (a blocked put would hold this
    process's interpreter lock, so it is made elsewhere)."""
    sender = HELPERS.Process(target=send_one, args=(queue,), daemon=True)
    sender.start()
    sender.join(seconds)
    if sender.is_alive():
        sender.kill()
        sender.join()
    return sender.exitcode == 0


@pytest.mark.skipif(not inbox_layout_known(Queue()), reason="the inbox repair knows faster-fifo 1.5 on x86-64 glibc")
@pytest.mark.parametrize("dies", [wait_in_get, hold_the_lock])
def test_an_inbox_whose_reader_was_killed_works_for_its_successor_once_repaired(dies):
    context = HELPERS
    inbox = Queue(max_size_bytes=100_000)
    reader = context.Process(target=dies, args=(inbox,), daemon=True)
    reader.start()
    base = ctypes.addressof(inbox.queue_obj_buffer)
    # Killed only once it waits (counted as a waiter) or holds the lock (its pid is the mutex's owner).
    field = base + (WAITER_COUNTS[0] if dies is wait_in_get else MUTEX_OWNER)
    deadline = time.time() + 60
    while ctypes.c_int.from_address(field).value not in (1, reader.pid):
        assert time.time() < deadline and reader.is_alive()
        time.sleep(0.05)
    os.kill(reader.pid, signal.SIGKILL)
    reader.join()
    assert release_lock_held_by(inbox, reader.pid) == (dies is hold_the_lock)
    reset_waiters(inbox)
    assert put_within(inbox, 30)  # senders get through while no reader runs
    inbox.get_many(timeout=1)
    waiters = ctypes.c_int.from_address(base + WAITER_COUNTS[0])
    for _ in range(3):  # successors that wait for their inbox are woken by a sender's put
        before = waiters.value
        successor = context.Process(target=receive_one, args=(inbox,), daemon=True)
        successor.start()
        while waiters.value == before:  # it waits now
            assert time.time() < deadline + 60 and successor.is_alive()
            time.sleep(0.05)
        assert put_within(inbox, 30)
        successor.join(10)
        assert successor.exitcode == 0


class PlainProcess:
    """The part of EngineProcess the Respawner uses, over a plain process running ``target(inbox)``: the worker
    named ``name`` whose inbox is ``inbox``."""

    def __init__(self, name: str, target, inbox):
        self.name, self.target = name, target
        self.event_loop = type("Loop", (), {"signal_queue": inbox})()
        self.respawn()

    def respawn(self) -> None:
        self.process = HELPERS.Process(target=self.target, args=(self.event_loop.signal_queue,), daemon=True)
        self.process.start()

    def __getattr__(self, name):  # pid, is_alive, kill, join, exitcode
        return getattr(self.process, name)


def wait_for_field(inbox, offset: int, value: int, process: PlainProcess) -> None:
    field, deadline = ctypes.c_int.from_address(ctypes.addressof(inbox.queue_obj_buffer) + offset), time.time() + 60
    while field.value != value:
        assert time.time() < deadline and process.is_alive()
        time.sleep(0.05)


def dies_signalling(queue) -> None:
    """Take the queue's lock and its "not empty" condition variable's own lock, as a sender inside its signal to a
    waiting reader does, and stay there to be killed."""
    base = ctypes.addressof(queue.queue_obj_buffer)
    ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(base + MUTEX))
    ctypes.c_uint.from_address(base + respawn.CONDS[0] + respawn.COND_LOCK).value |= 1
    time.sleep(1000)


@pytest.mark.skipif(not inbox_layout_known(Queue()), reason="the inbox repair knows faster-fifo 1.5 on x86-64 glibc")
def test_a_sender_killed_inside_its_signal_leaves_an_inbox_that_wakes_its_reader_once_freed():
    inbox = Queue(max_size_bytes=100_000)
    reader = HELPERS.Process(target=receive_one, args=(inbox,), daemon=True)
    reader.start()
    wait_for_field(inbox, WAITER_COUNTS[0], 1, reader)
    sender = HELPERS.Process(target=dies_signalling, args=(inbox,), daemon=True)
    sender.start()
    wait_for_field(inbox, MUTEX_OWNER, sender.pid, sender)
    os.kill(sender.pid, signal.SIGKILL)
    sender.join()
    assert release_lock_held_by(inbox, sender.pid)
    assert put_within(inbox, 20)  # its signal to the waiting reader takes the condition variable's lock
    reader.join(10)
    assert reader.exitcode == 0


def holds_the_lock_in_a_thread(queue) -> None:
    """Hold the queue's lock from a thread that is not the main one, as a batcher (a thread of the learner's
    process) inside a queue operation does: the lock's owner is then no process id."""
    holder = threading.Thread(target=hold_the_lock, args=(queue,), daemon=True)
    holder.start()
    holder.join()


@pytest.mark.skipif(not inbox_layout_known(Queue()), reason="the inbox repair knows faster-fifo 1.5 on x86-64 glibc")
def test_the_runners_watch_frees_an_inbox_a_dead_process_left_locked_and_ends_a_frozen_component():
    inboxes = [Queue(max_size_bytes=100_000) for _ in range(3)]
    holders = [
        HELPERS.Process(target=target, args=(inbox,), daemon=True)
        for target, inbox in zip((hold_the_lock, holds_the_lock_in_a_thread, holds_the_lock_in_a_thread), inboxes)
    ]
    dead, frozen, other = holders  # a component that died holding it, a component frozen in it, not a component
    for holder in holders:
        holder.start()
    for inbox, holder in zip(inboxes, holders):
        while lock_owner(inbox) == 0:
            assert holder.is_alive()
            time.sleep(0.05)
    assert lock_owner(inboxes[1]) != frozen.pid
    os.kill(dead.pid, signal.SIGKILL)
    dead.join()
    components = [SimpleNamespace(pid=holder.pid, name=f"worker_{i}_process") for i, holder in enumerate(holders[:2])]
    watch = DeadHolderWatch(inboxes, components, frozen_after_sec=1.0, interval=0.1)
    try:
        assert put_within(inboxes[0], 20)
        assert put_within(inboxes[1], 20)  # ended, then freed
        frozen.join(5)
        assert frozen.exitcode == -signal.SIGKILL
        assert lock_owner(inboxes[2]) != 0 and not put_within(inboxes[2], 0.5)  # left to whoever watches it
    finally:
        watch.stop()
        other.kill()


def ring(queue) -> dict[int, ctypes.c_size_t]:
    """The queue's ring fields (CAPACITY, HEAD, TAIL, SIZE, COUNT), in place."""
    base = ctypes.addressof(queue.queue_obj_buffer)
    return {offset: ctypes.c_size_t.from_address(base + offset) for offset in (HEAD, TAIL, SIZE, COUNT)}


@pytest.mark.skipif(not inbox_layout_known(Queue()), reason="the inbox repair knows faster-fifo 1.5 on x86-64 glibc")
@pytest.mark.parametrize("wraps", [False, True], ids=["flat", "wrapping"])
@pytest.mark.parametrize("stopped", ["after the length", "after the bytes", "after the byte count", "reader"])
def test_a_message_half_written_by_a_killed_sender_is_dropped_and_the_inbox_works_on(stopped, wraps):
    # A SIGKILL cannot be aimed between two stores of a put, so the ring is left as such a kill leaves it: the
    # third message put, then its last steps undone (or, for a reader, the first message read and the byte count
    # not yet lowered). A process that dies inside a queue operation holds its lock: here this one does.
    capacity, third = 1024, "third message " + "z" * 300  # its length needs two bytes
    inbox = Queue(max_size_bytes=capacity)
    for _ in range(40):  # traffic that leaves old messages past the ring's end
        inbox.put_many(["old", "old"], timeout=1)
        inbox.get_many(timeout=1)
    inbox.put_many(["first", "second"])
    two = ring(inbox)[SIZE].value
    inbox.get_many()
    # An empty ring may start anywhere: for a wrapping ring, where the third message's length is split by the ring's
    # end after its first byte.
    ring(inbox)[HEAD].value = ring(inbox)[TAIL].value = capacity - two - 1 if wraps else 0
    inbox.put_many(["first", "second"])
    before = {offset: field.value for offset, field in ring(inbox).items()}
    inbox.put(third, timeout=1)
    fields = ring(inbox)
    assert (fields[TAIL].value < before[TAIL]) == wraps
    expected = ["first", "second"]
    if stopped == "after the length":
        fields[TAIL].value, fields[SIZE].value = (before[TAIL] + 8) % capacity, before[SIZE] + 8
    elif stopped == "after the bytes":
        fields[SIZE].value = before[SIZE] + 8
    else:
        expected.append(third)
    if stopped == "reader":  # the start moved past the first message, the byte count and the count not lowered
        held = fields[SIZE].value
        assert inbox.get_many(max_messages_to_get=1) == ["first"]
        fields[SIZE].value = held
        expected.remove("first")
    fields[COUNT].value = before[COUNT] + (stopped == "reader")  # a put raises it last, a get lowers it last
    libc = ctypes.CDLL(None)
    libc.pthread_mutex_lock(ctypes.c_void_p(ctypes.addressof(inbox.queue_obj_buffer) + MUTEX))
    assert release_lock_held_by(inbox, os.getpid())
    assert inbox.qsize() == len(expected)
    assert inbox.get_many(timeout=1) == expected
    for number in range(20):  # round the ring several times
        inbox.put_many([number, "y" * 40], timeout=1)
        assert inbox.get_many(timeout=1) == [number, "y" * 40]


@pytest.mark.skipif(not inbox_layout_known(Queue()), reason="the inbox repair knows faster-fifo 1.5 on x86-64 glibc")
@pytest.mark.parametrize("holder", ["rollout_worker_0_process", "learner_process"])
def test_a_worker_stuck_holding_the_dead_workers_inbox_lock_is_ended_too(monkeypatch, holder):
    monkeypatch.setattr(respawn, "LOCK_TIMEOUT_SEC", 1.0)
    inbox = Queue(max_size_bytes=100_000)
    dead = PlainProcess("inference_worker_0_process", wait_in_get, inbox)
    wait_for_field(inbox, WAITER_COUNTS[0], 1, dead)
    # A live process stuck inside the hung worker's inbox, holding its lock (as one blocked inside a put would).
    stuck = PlainProcess(holder, hold_the_lock, inbox)
    wait_for_field(inbox, MUTEX_OWNER, stuck.pid, stuck)
    respawner = Respawner(Config(), buffers=None, task_sequence=None, inboxes=[inbox])
    first_pid = dead.pid
    if holder == "learner_process":  # not a worker: it is not ended, and the run stops
        with pytest.raises(respawn.InboxLockHeld, match=f"held for 1 s by process {stuck.pid}"):
            respawner.respawn(dead, [dead, stuck])
        assert stuck.is_alive()
        stuck.kill()
        return
    assert respawner.respawn(dead, [dead, stuck]) == []
    stuck.join(10)
    assert stuck.exitcode == -signal.SIGKILL
    assert respawner.expected_deaths == {"rollout_worker_0"}  # the watch respawns it next, outside the budget
    assert dead.pid != first_pid and dead.is_alive()
    assert put_within(inbox, 30)  # the successor's inbox works: it receives the message and returns
    dead.join(10)
    assert dead.exitcode == 0


def watched_pair(*workers: PlainProcess) -> tuple[Supervision, HangWatch]:
    """The runner's watch over ``workers`` and their inboxes, with the default --hang_timeout_sec of 120 s."""
    supervision = type("Watched", (Supervision,), {})()
    supervision.processes = list(workers)
    inboxes = [worker.event_loop.signal_queue for worker in workers]
    supervision.respawner = Respawner(Config(), buffers=None, task_sequence=None, inboxes=inboxes)
    supervision.hang_watch = HangWatch(Config(), splits=None)
    return supervision, supervision.hang_watch


@pytest.mark.skipif(not inbox_layout_known(Queue()), reason="the inbox repair knows faster-fifo 1.5 on x86-64 glibc")
def test_a_stopped_reader_is_named_rather_than_the_writer_stuck_signalling_it():
    # A reader stopped (SIGSTOP) while it waits on its inbox's condition variable can leave a writer that signals it
    # waiting inside the inbox, holding the lock: the writer is a holder, yet the stopped reader is the one to blame.
    inbox = Queue(max_size_bytes=100_000)
    reader = PlainProcess("inference_worker_0_process", wait_in_get, inbox)
    wait_for_field(inbox, WAITER_COUNTS[0], 1, reader)
    writer = PlainProcess("rollout_worker_0_process", lambda _own_inbox: hold_the_lock(inbox), Queue())
    wait_for_field(inbox, MUTEX_OWNER, writer.pid, writer)
    supervision, watch = watched_pair(reader, writer)
    try:
        now = time.monotonic()
        watch.last_heard = {"rollout_worker_0": now - 122, "inference_worker_0": now - 119}
        assert supervision._culprit() == "rollout_worker_0"  # not stopped: the holder, silent past the timeout
        os.kill(reader.pid, signal.SIGSTOP)
        deadline = time.time() + 10
        while psutil.Process(reader.pid).status() != psutil.STATUS_STOPPED:
            assert time.time() < deadline
            time.sleep(0.05)
        assert supervision._culprit() is None  # the stopped one is not past the timeout yet: no one is named
        watch.last_heard["inference_worker_0"] = now - 121
        assert supervision._culprit() == "inference_worker_0"
        assert supervision._culprit(among={"rollout_worker_0": writer}, stopping=True) == "rollout_worker_0"
    finally:
        for process in (reader, writer):
            process.kill()
            process.join(10)


@pytest.mark.skipif(not inbox_layout_known(Queue()), reason="the inbox repair knows faster-fifo 1.5 on x86-64 glibc")
@pytest.mark.parametrize("frozen", ["sender inside the reader's inbox", "reader inside its inbox", "neither"])
def test_a_worker_frozen_inside_an_inbox_is_named_rather_than_a_worker_it_silenced(frozen):
    # An inference worker frozen inside a put holds its rollout worker's inbox lock: both go silent, and the rollout
    # worker may have reported last a little earlier. The frozen one is to blame, and respawning it frees the other.
    # A rollout worker frozen inside its own inbox silences the inference worker that writes to it, the other way.
    inbox = Queue(max_size_bytes=100_000)
    reader = PlainProcess(
        "rollout_worker_0_process", hold_the_lock if frozen.startswith("reader") else wait_in_get, inbox
    )
    sender_target = (lambda _own_inbox: hold_the_lock(inbox)) if frozen.startswith("sender") else wait_in_get
    sender = PlainProcess("inference_worker_0_process", sender_target, Queue())
    if frozen != "neither":
        holder = sender if frozen.startswith("sender") else reader
        wait_for_field(inbox, MUTEX_OWNER, holder.pid, holder)
    supervision, watch = watched_pair(reader, sender)
    try:
        now = time.monotonic()
        watch.last_heard = {"rollout_worker_0": now - 121, "inference_worker_0": now - 119}
        # Only the reader is past the timeout: while the sender holds its inbox, it waits for the sender's turn.
        assert supervision._culprit() == (None if frozen.startswith("sender") else "rollout_worker_0")
        watch.last_heard["inference_worker_0"] = now - 120.5  # both past it, the reader silent longer
        assert supervision._culprit() == ("inference_worker_0" if frozen.startswith("sender") else "rollout_worker_0")
        watch.last_heard["inference_worker_0"] = now - 122  # both past it, the sender silent longer
        assert supervision._culprit() == ("rollout_worker_0" if frozen.startswith("reader") else "inference_worker_0")
        assert supervision._culprit(among={"inference_worker_0": sender}, stopping=True) == "inference_worker_0"
        # The writer blocked on a frozen reader's inbox passes the timeout first: it waits for the reader's turn.
        watch.last_heard = {"rollout_worker_0": now - 119, "inference_worker_0": now - 121}
        assert supervision._culprit() == (None if frozen.startswith("reader") else "inference_worker_0")
        watch.last_heard["rollout_worker_0"] = now - 0.5  # unless the reader is reporting: then it is not frozen
        assert supervision._culprit() == "inference_worker_0"
    finally:
        for process in (reader, sender):
            process.kill()
            process.join(10)
