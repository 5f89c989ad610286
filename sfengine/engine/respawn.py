"""Respawning a rollout or inference worker that died or hung, in place, while the run goes on.

    runner._watch: a worker process died, or HangWatch says it is hung (its stack printed first)
        --> Respawner.respawn: SIGKILL it if it still runs; check --max_respawns
            --> repair the inboxes it may have left broken (below)
            --> rollout worker: the episodes its envs were playing go back to the task sequence, to be played again
                at the same positions, and (group advantages) the batcher discards the steps of theirs it holds;
                the rollouts it was filling are dropped, and its buffers still with the batcher come back as usual
            --> EngineProcess.respawn: a fresh process on the same event loop and inbox
            --> inference worker: the rollout workers it serves send their waiting requests again

**Why the same inbox.** signal-slot-mp wires connections before processes start: each emitter holds its
receivers' inboxes (faster-fifo queues in shared memory that a process can only inherit at its spawn). A new inbox
could not reach the processes that already run, so the respawned worker keeps its predecessor's event loop and
inbox, and is built from the component objects the runner made before the first start (they hold configuration
and handles to shared memory, nothing a process changed). Messages queued for the dead process are read by its
successor: request numbers (``SplitState.requests``) and lend counts (``SharedBuffers.lends``) let it ignore those
meant for its predecessor.

**The repair.** A faster-fifo queue guards its state with a process-shared pthread mutex and two condition
variables, none of them robust. A process killed inside a queue operation leaves the mutex locked for good, and
one killed while it waited for its inbox stays counted as a waiter of the condition variable: with glibc the
next signal that finds a live waiter then blocks, so the first message to its successor would hang its sender.
Before the new process starts, the runner releases every queue mutex the dead process held (its owner field holds
the dead thread's id; queue operations run on the main thread, whose id is the pid) and re-initialises its own
inbox's condition variables, under the mutex, while no live process waits on them. The layout read here is that of
faster-fifo 1.5 on 64-bit Linux with glibc, checked at start (``inbox_layout_known``); elsewhere respawning is off
and a dead worker stops the run, as with ``--max_respawns=0``. A lock the dead process held is released only once
what it was doing inside is set right: a message it was writing and never finished is cut from the ring
(``repair_ring``), and a condition variable it was signalling is unlocked (``release_condition_locks``). The
runner's loop cannot do this for its own inbox, on which it may wait with no time limit, so a thread of the
runner's process does it for every inbox, whatever process died (``DeadHolderWatch``).

One case is left: a worker killed while it waited for room in another component's full inbox stays counted as a
waiter there. Inboxes hold 5 MB and the messages in flight are bounded by design, so a full inbox means its
receiver had stalled already.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import random
import signal as os_signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from sfengine.config import Config
from sfengine.engine.buffers import NO_ENV, SharedBuffers
from sfengine.engine.event_loop import EngineProcess
from sfengine.tasks.sequence import SharedTaskSequence

log = logging.getLogger(__name__)

# faster-fifo 1.5's queue object: six size_t fields, a mutex attribute, the mutex (glibc x86-64: 40 bytes, the
# owner's thread id at offset 8), a condition attribute, two waiter counts and two 48-byte condition variables.
QUEUE_OBJECT_SIZE = 208
CAPACITY, HEAD, TAIL, SIZE, COUNT = 0, 16, 24, 32, 40  # bytes of the ring; where reading and writing are; bytes held
HEADER = 8  # each message in the ring: its length (size_t), then its bytes
MUTEX, MUTEX_OWNER, COND_ATTR, WAITER_COUNTS, CONDS = 56, 64, 96, (100, 104), (112, 160)
COND_SIZE = 48
LOCK_TIMEOUT_SEC = 5.0
# A condition variable's own lock (glibc 2.25 and later): the two low bits of its __g1_orig_size, 32 bytes in. A
# signal takes it, always under the queue's mutex here; a waiter whose time ran out takes it for a moment without.
COND_LOCK, COND_LOCK_WAIT_SEC, FUTEX_WAKE, SYS_FUTEX = 32, 0.5, 1, 202
_RELEASING = threading.Lock()  # the runner's loop and its DeadHolderWatch: a lock is released once


class InboxLockHeld(RuntimeError):
    """An inbox's lock stayed held by a live process (``owner``): one stuck inside the queue."""

    def __init__(self, owner: int):
        super().__init__(f"an inbox's lock stayed held for {LOCK_TIMEOUT_SEC:.0f} s by process {owner}")
        self.owner = owner


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def inbox_layout_known(queue) -> bool:
    """Whether ``queue`` is a faster-fifo queue whose locks this module knows how to repair."""
    buffer = getattr(queue, "queue_obj_buffer", None)
    return (
        buffer is not None
        and len(buffer) == QUEUE_OBJECT_SIZE
        and platform.system() == "Linux"
        and platform.machine() == "x86_64"
        and platform.libc_ver()[0] == "glibc"
    )


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def lock_owner(queue) -> int:
    """The id of the thread holding ``queue``'s mutex (for a queue operation, the pid of its process), 0 if free."""
    return ctypes.c_int.from_address(ctypes.addressof(queue.queue_obj_buffer) + MUTEX_OWNER).value


def release_lock_held_by(queue, pid: int) -> bool:
    """Unlock ``queue``'s mutex if the dead process ``pid`` holds it; True if it did. What it was writing or reading
    is set right first (``repair_ring``), while the lock keeps every other process out. glibc's default mutex may be
    unlocked by any thread: it clears the owner, releases the lock word and wakes a waiter."""
    with _RELEASING:
        if lock_owner(queue) != pid:
            return False
        dropped = repair_ring(queue)
        if dropped:
            log.warning("dropped %d byte(s) of a message half written to an inbox when its sender died", dropped)
        if release_condition_locks(queue):
            log.warning("released an inbox's condition variable that a process died signalling")
        _libc().pthread_mutex_unlock(ctypes.c_void_p(ctypes.addressof(queue.queue_obj_buffer) + MUTEX))
        return True


def is_dead(thread: int) -> bool:
    """Whether no live thread has the id ``thread``: a lock's owner is a thread, the main one's id its process's pid
    but a batcher's not (a zombie is dead)."""
    try:
        with open(f"/proc/{thread}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def process_of(thread: int) -> int:
    """The pid of the process whose thread is ``thread`` (0 if it has gone)."""
    try:
        with open(f"/proc/{thread}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("Tgid:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return 0


class DeadHolderWatch(threading.Thread):
    """A thread of the runner's process that frees each inbox whose lock a dead process holds, and ends a component
    frozen inside a queue operation, looking every ``interval`` seconds.

    The runner's loop frees a dead worker's locks when it notices the death, but a queue operation waits for a held
    lock with no time limit: a worker killed while it sent to the runner leaves the runner's own inbox locked, and
    the runner, the one process that could notice, would wait inside its next read for good (as a storm of SIGKILLs
    to an inference worker showed). A worker frozen there (stopped, or stuck in the kernel) would do the same while
    alive: one of ``processes`` seen holding the same inbox's lock at every look for ``frozen_after_sec`` (a queue
    operation holds it for microseconds; 0: never) is SIGKILLed, and its death is then handled as any other. The
    runner passes twice --hang_timeout_sec: where its loop is free to, the hang watch, which prints the stack and
    names the env, goes first. Queue operations leave the interpreter lock, so this thread runs while the loop
    waits. It watches only inboxes whose layout it knows."""

    def __init__(self, inboxes: list, processes: list, frozen_after_sec: float = 0.0, interval: float = 0.5):
        super().__init__(name="dead-holder-watch", daemon=True)
        self.inboxes, self.interval = [q for q in inboxes if inbox_layout_known(q)], interval
        self.processes, self.frozen_after_sec = processes, frozen_after_sec
        self.held: dict[int, tuple[int, float]] = {}  # inbox index -> (its lock's owner, when first seen holding it)
        self.stopped = threading.Event()
        self.start()

    def stop(self) -> None:
        self.stopped.set()
        self.join()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            for index, queue in enumerate(self.inboxes):
                owner = lock_owner(queue)
                if owner and is_dead(owner):
                    if release_lock_held_by(queue, owner):
                        log.warning("freed an inbox whose lock the dead process %d held", owner)
                elif owner and self.frozen_after_sec:
                    self._frozen(index, owner)
                    continue
                self.held.pop(index, None)

    def _frozen(self, index: int, owner: int) -> None:
        """End the component whose thread ``owner`` has held inbox ``index``'s lock at every look for too long."""
        seen, since = self.held.get(index, (0, 0.0))
        if seen != owner:
            self.held[index] = (owner, time.monotonic())
            return
        held_for, pid = time.monotonic() - since, process_of(owner)
        process = next((p for p in self.processes if p.pid == pid), None)
        if held_for < self.frozen_after_sec or process is None:
            return
        log.error(
            "%s has held an inbox's lock for %.0f s, frozen inside a queue operation (2x --hang_timeout_sec); "
            "ending it",
            process.name.removesuffix("_process"),
            held_for,
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, os_signal.SIGKILL)  # by pid: the loop may have put a successor in its place meanwhile
        del self.held[index]


def repair_ring(queue) -> int:
    """Make ``queue``'s ring consistent after a process died inside one of its operations; call it holding the
    queue's lock. Returns how many bytes of a half-written message were dropped.

    A put writes each message's length, then its bytes, moving the ring's end and then the count of bytes held
    after each; a get moves the start, then the count. A writer killed between those steps leaves a count that
    covers a length without its message, or an end past the count: the reader would take garbage for a message,
    the count would wrap below zero and every later put would find the inbox full. The ring is cut back to the
    complete messages from its start, those every step of whose put finished: the message the dead writer was
    putting is lost, as if it had died just before the put. A reader killed after moving the start is covered too:
    the bytes held are measured from the new start to the end."""
    base = ctypes.addressof(queue.queue_obj_buffer)
    size_t = {offset: ctypes.c_size_t.from_address(base + offset) for offset in (CAPACITY, HEAD, TAIL, SIZE, COUNT)}
    capacity, head, tail, size = (size_t[offset].value for offset in (CAPACITY, HEAD, TAIL, SIZE))
    ring = memoryview(queue.shared_memory).cast("B")
    end = (tail - head) % capacity or (capacity if size == capacity else 0)  # the end at the start: empty or full

    def length_at(offset: int) -> int:
        position = (head + offset) % capacity
        first = ring[position : min(position + HEADER, capacity)].tobytes()
        return int.from_bytes(first + ring[: HEADER - len(first)].tobytes(), sys.byteorder)

    held, whole, messages = min(size, end), 0, 0
    while whole + HEADER <= held and 0 < (length := length_at(whole)) <= held - whole - HEADER:
        whole, messages = whole + HEADER + length, messages + 1
    size_t[SIZE].value, size_t[TAIL].value, size_t[COUNT].value = whole, (head + whole) % capacity, messages
    return end - whole


def release_condition_locks(queue) -> int:
    """Release the internal lock of each of ``queue``'s condition variables that a process died holding, inside a
    signal; call it holding the queue's mutex for that dead process. Held on, it would make the next signal wait
    for it for good, the sender inside the queue's mutex and every other process at its door. A waiter whose time ran
    out holds it for a moment: a lock still held after COND_LOCK_WAIT_SEC is the dead signaller's. Its bits are
    cleared and whoever waits for it is woken: one that set its "waited for" bit in between finds the word changed
    and takes the lock anew. Returns how many were released."""
    base, released = ctypes.addressof(queue.queue_obj_buffer), 0
    for cond in CONDS:
        word = ctypes.c_uint.from_address(base + cond + COND_LOCK)
        deadline = time.monotonic() + COND_LOCK_WAIT_SEC
        while word.value & 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        if word.value & 3:
            word.value &= ~3
            _libc().syscall(SYS_FUTEX, ctypes.c_void_p(base + cond + COND_LOCK), FUTEX_WAKE, 2**31 - 1, None, None, 0)
            released += 1
    return released


def reset_waiters(queue) -> None:
    """Re-initialise the condition variables of an inbox whose only reader died: under its mutex no sender is
    inside the queue, and no live process waits on them."""
    libc, base = _libc(), ctypes.addressof(queue.queue_obj_buffer)
    deadline = _Timespec(int(time.time() + LOCK_TIMEOUT_SEC), 0)
    if libc.pthread_mutex_timedlock(ctypes.c_void_p(base + MUTEX), ctypes.byref(deadline)) != 0:
        raise InboxLockHeld(ctypes.c_int.from_address(base + MUTEX_OWNER).value)
    try:
        for cond, count in zip(CONDS, WAITER_COUNTS):
            ctypes.memset(base + cond, 0, COND_SIZE)
            libc.pthread_cond_init(ctypes.c_void_p(base + cond), ctypes.c_void_p(base + COND_ATTR))
            ctypes.c_int.from_address(base + count).value = 0
    finally:
        libc.pthread_mutex_unlock(ctypes.c_void_p(base + MUTEX))


def repair_inboxes(dead: EngineProcess, pid: int, inboxes: list) -> int:
    """Make every inbox usable after the death of process ``pid`` (``dead``): the locks it held released, its own
    inbox's waiters reset. Returns how many locks it held."""
    released = sum(release_lock_held_by(queue, pid) for queue in inboxes)
    reset_waiters(dead.event_loop.signal_queue)
    return released


@dataclass
class RespawnStats:
    """For the status line, TensorBoard and summary.json."""

    respawns: dict[str, int] = field(default_factory=dict)  # component -> respawns
    dropped_trajectories: int = 0  # rollouts a dead worker was filling
    seconds_lost: float = 0.0  # from each death noticed to the first report of the worker that replaced it
    chaos_kills: int = 0

    @property
    def total(self) -> int:
        return sum(self.respawns.values())

    def as_dict(self) -> dict:
        return {
            "respawns": dict(self.respawns),
            "respawn_dropped_trajectories": self.dropped_trajectories,
            "respawn_seconds_lost": round(self.seconds_lost, 2),
            "chaos_kills": self.chaos_kills,
        }


class Respawner:
    """The runner's respawn policy and bookkeeping: who may be respawned, how often, and what the death cost."""

    def __init__(
        self,
        cfg: Config,
        buffers: SharedBuffers,
        task_sequence: SharedTaskSequence | None,
        inboxes: list,
    ):
        self.cfg, self.buffers, self.task_sequence, self.inboxes = cfg, buffers, task_sequence, inboxes
        run = cfg.run
        self.enabled = run.max_respawns > 0 and all(inbox_layout_known(q) for q in inboxes)
        if run.max_respawns > 0 and not self.enabled:
            log.warning("respawning is not available here (its inbox repair needs faster-fifo 1.5 on x86-64 glibc)")
        self.history: dict[str, deque[float]] = {}  # component -> when it was respawned, within the window
        self.expected_deaths: set[str] = set()  # killed by --chaos_kill_every_sec: not counted against the budget
        self.starting: dict[str, float] = {}  # component -> when its death was noticed, until its first report
        self.stats = RespawnStats()
        self.rng = random.Random(cfg.env.seed)
        chaos = cfg.debug.chaos_kill_every_sec
        self.next_chaos = time.monotonic() + chaos if chaos else None

    def refusal(self, component: str) -> str | None:
        """Why ``component`` may not be respawned now, or None."""
        if not self.enabled:
            if not self.cfg.run.max_respawns:
                return "respawning is off (--max_respawns=0)"
            return "respawning is off (its inbox repair needs faster-fifo 1.5 on x86-64 glibc)"
        if component in self.expected_deaths:
            return None
        window, limit = self.cfg.run.respawn_window_sec, self.cfg.run.max_respawns
        recent = self.history.setdefault(component, deque())
        while recent and time.monotonic() - recent[0] > window:
            recent.popleft()
        if len(recent) >= limit:
            return f"it was respawned {len(recent)} times within {window:g} s (--max_respawns={limit})"
        return None

    def respawn(self, process: EngineProcess, processes: list[EngineProcess]) -> list[int]:
        """End ``process`` if it still runs, repair the inboxes and start its successor. Returns the sequence
        positions of the episodes it was playing (a rollout worker), which the batcher must forget. Raises
        InboxLockHeld if an inbox cannot be repaired."""
        component = process.name.removesuffix("_process")
        pid = process.pid
        if process.is_alive():
            process.kill()
        process.join(10.0)
        if component in self.expected_deaths:
            self.expected_deaths.discard(component)
        else:
            self.history.setdefault(component, deque()).append(time.monotonic())
        try:
            held = repair_inboxes(process, pid, self.inboxes)
        except InboxLockHeld as stuck:
            # A sender caught inside the inbox while its reader hung (a signal that waits for the frozen reader):
            # it can never leave. It is ended too, its lock released, and the watch respawns it next.
            casualty = next((p for p in processes if p.pid == stuck.owner and p is not process), None)
            if casualty is None or not casualty.name.startswith(("rollout_worker_", "inference_worker_")):
                raise
            log.error("%s is stuck inside %s's inbox; ending it too", casualty.name, component)
            self.expected_deaths.add(casualty.name.removesuffix("_process"))
            casualty.kill()
            casualty.join(10.0)
            for queue in self.inboxes:
                release_lock_held_by(queue, stuck.owner)
            held = repair_inboxes(process, pid, self.inboxes)
        positions = self._replay_episodes(component) if component.startswith("rollout_worker_") else []
        self.starting[component] = time.monotonic()
        self.stats.respawns[component] = self.stats.respawns.get(component, 0) + 1
        process.respawn()
        locks = f"; it held {held} inbox lock(s), released" if held else ""
        log.warning("respawned %s (pid %d -> %d)%s", component, pid, process.pid, locks)
        return positions

    def _replay_episodes(self, component: str) -> list[int]:
        """The dead rollout worker's rollouts are dropped; the episodes its envs were playing are handed out again."""
        worker = int(component.rsplit("_", 1)[1])
        splits, num_splits = self.buffers.splits, self.cfg.sampler.worker_num_splits
        rows = range(worker * num_splits, (worker + 1) * num_splits)
        self.stats.dropped_trajectories += len(rows) * self.cfg.envs_per_split
        envs = [
            (
                (*splits.assignments[row, env].tolist(), int(splits.positions[row, env])),
                tuple(splits.drawing[row, env].tolist()),
            )
            for row in rows
            for env in range(self.cfg.envs_per_split)
        ]
        splits.positions[list(rows)] = -1
        splits.drawing[list(rows)] = -1
        splits.stepping_env[list(rows)] = NO_ENV
        if self.task_sequence is None:
            return []
        episodes = self.task_sequence.hand_out_again(envs)
        if not episodes:
            return []
        shown = ", ".join(f"({task}, {init_state})" for task, init_state, _ in episodes[:8])
        more = f" and {len(episodes) - 8} more" if len(episodes) > 8 else ""
        log.info("%s: %d episodes handed out again, (task, init state): %s%s", component, len(episodes), shown, more)
        return [position for _, _, position in episodes]

    def heard_from(self, component: str) -> None:
        """A worker reported: if it is a respawned one, its start-up is over."""
        noticed = self.starting.pop(component, None)
        if noticed is not None:
            self.stats.seconds_lost += time.monotonic() - noticed

    def chaos_victim(self, processes: list[EngineProcess]) -> EngineProcess | None:
        """--chaos_kill_every_sec: when it is time, a random running rollout or inference worker, killed here."""
        if self.next_chaos is None or time.monotonic() < self.next_chaos:
            return None
        self.next_chaos = time.monotonic() + self.cfg.debug.chaos_kill_every_sec
        candidates = [
            p
            for p in processes
            if p.name.startswith(("rollout_worker_", "inference_worker_"))
            and p.is_alive()
            and p.name.removesuffix("_process") not in self.starting
        ]
        if not candidates:
            return None
        victim = self.rng.choice(candidates)
        self.expected_deaths.add(victim.name.removesuffix("_process"))
        self.stats.chaos_kills += 1
        log.warning("chaos: SIGKILL to %s (pid %d), --chaos_kill_every_sec", victim.name, victim.pid)
        os.kill(victim.pid, os_signal.SIGKILL)
        return victim
