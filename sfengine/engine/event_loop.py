"""signal-slot-mp event loops with one addition: hooks that run after each batch of received signals.

The inference worker needs this to batch: its slot only records a request, and the hook runs one forward
pass over every request that arrived in the same batch of signals. Without it, each request would get its own
forward pass, or the loop would have to poll.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import os
import random
import signal
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from queue import Full

import numpy as np
import psutil
import torch
from signal_slot.signal_slot import EventLoop, EventLoopObject, EventLoopProcess

from sfengine.engine.distributed import RankInfo
from sfengine.engine.fork_server import leave_fork_server, name_this_process, parent_of_components, stop_fork_server

EMIT_TIMEOUT_SEC = 60.0


class Component(EventLoopObject):
    """Base of every engine component. Its signals apply backpressure instead of being dropped.

    signal-slot-mp drops a signal whose receiver's inbox is full (and only logs it). Our inboxes hold 5 MB and
    the number of messages in flight is bounded by design (one request per split, one trajectory message per
    buffer, one report per component per second), so a full inbox means a receiver has stalled: the emitter
    waits for room, and fails loudly if none comes, rather than losing a buffer id.
    """

    # Inboxes of processes that were killed (a hung component): never written again. A process stopped or killed
    # inside a queue operation keeps the queue's shared lock forever, and a put would then wait on it for good.
    abandoned_inboxes: list = []  # the queues themselves: an id() could be reused by a later queue

    def emit_many(self, signal_: str, list_of_args: Iterable[tuple]) -> None:
        messages = tuple((self.object_id, signal_, args) for args in list_of_args)
        receivers = self.send_signals_to.get(signal_, ())
        for queue in {id(q): q for q in (self.receiver_queues[r] for r in receivers)}.values():
            if self.abandoned_inboxes and any(queue is abandoned for abandoned in self.abandoned_inboxes):
                continue
            try:
                queue.put_many(messages, block=True, timeout=EMIT_TIMEOUT_SEC)
            except Full:
                raise RuntimeError(
                    f"{self.object_id}: signal '{signal_}' could not be delivered for {EMIT_TIMEOUT_SEC:.0f} s "
                    f"(receivers {sorted(receivers)} are not reading their inbox)"
                ) from None


class EngineEventLoop(EventLoop):
    def __init__(self, unique_loop_name: str, serial_mode: bool = False):
        super().__init__(unique_loop_name, serial_mode)
        self.after_signals: list[Callable[[], None]] = []

    def _loop_iteration(self) -> bool:
        keep_running = super()._loop_iteration()
        for hook in self.after_signals:
            hook()
        return keep_running


class EngineProcess(EventLoopProcess):
    """An EventLoopProcess whose loop is an EngineEventLoop. Children never own the terminal: the runner
    coordinates shutdown, so a Ctrl-C or SIGTERM must reach only the runner (see ``ignore_interrupts``)."""

    def __init__(self, name: str, mp_context: multiprocessing.context.BaseContext, seed: tuple[int, ...] = ()):
        self.mp_context = mp_context
        self.seed, self.starts = seed, 0  # what its random streams are seeded from (see reseed_random_streams)
        self._process = mp_context.Process(target=self._target, name=name, daemon=False)
        self._init_func = None
        self._args, self._kwargs = (), {}
        self.event_loop = EngineEventLoop(f"{name}_evt_loop")
        EventLoopObject.__init__(self, self.event_loop, name)

    def start(self) -> None:
        self.parent_pid = parent_of_components(self.mp_context)  # travels to the process with this object
        self.started_at = time.monotonic()
        self.starts += 1
        super().start()

    def respawn(self) -> None:
        """Start a fresh process in place of this one, which has ended: the same components, built anew from the
        runner's copies of them (never started there), on the same event loop and inbox, so every connection made
        before the first start still reaches it (see sfengine.engine.respawn)."""
        self._process = self.mp_context.Process(target=self._target, name=self.name, daemon=False)
        self.start()

    def _target(self):
        leave_fork_server()
        die_with_parent(self.parent_pid)
        ignore_interrupts()
        reseed_random_streams((*self.seed, zlib.crc32(self.name.encode()), self.starts) if self.seed else None)
        set_process_title(self.name)
        configure_logging()
        print_stacks_on_sigusr1()
        super()._target()
        end_process_now()


def end_process_now(code: int = 0) -> None:
    """End a process whose work is done and closed (a component whose loop returned: its envs, checkpoint and final
    report; a command whose ``main`` returned ``code``) without the interpreter's own teardown of torch and the
    envs' modules, which took about a second a component process and half a second a command, and every run's stop
    waited for. Output is flushed first, and a command's fork server is stopped (``stop_fork_server``)."""
    stop_fork_server()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def configure_logging() -> None:
    """One log format for the runner and every component process: time, pid, and the rank under torchrun."""
    ranks = RankInfo.from_environment()
    rank = f"[rank {ranks.rank}]" if ranks.world_size > 1 else ""
    logging.basicConfig(level=logging.INFO, format=f"[%(asctime)s][%(process)d]{rank} %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("signal_slot").setLevel(logging.WARNING)


def print_stacks_on_sigusr1() -> None:
    """SIGUSR1 prints every thread's Python stack to stderr and the process goes on, even while it is stuck in C
    code: the runner sends it to a hung worker (sfengine.engine.hang_watch), and a user can send it to any engine
    process, the main one included (kill -USR1 <pid>)."""
    stream = sys.stderr
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # stderr captured in memory (a command run in-process)
        stream = sys.__stderr__
    faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)


# A component process ran a command's main() as it imported the user's script: an exit code no simulator is
# likely to use, read as such only where the main process runs a script (not python -m sfengine.*).
UNGUARDED_MAIN_EXIT = 97


def start_command() -> None:
    """What every command's main process sets up first: the log format and the stacks on SIGUSR1. Called in a
    component process that is still importing the user's script (multiprocessing imports it in every process it
    starts, so a script that calls main() unguarded would start a run in each), it says so and ends that process
    with UNGUARDED_MAIN_EXIT, which the runner names (``death_reason``)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # (multiprocessing's own test of this)
        print(
            f"sfengine: {multiprocessing.current_process().name} ran your script's main() as it imported it: "
            'call main() under if __name__ == "__main__":',
            file=sys.stderr,
            flush=True,
        )
        os._exit(UNGUARDED_MAIN_EXIT)  # (SystemExit here would end the process with code 1, unnamed)
    configure_logging()
    print_stacks_on_sigusr1()


def reseed_random_streams(words: tuple[int, ...] | None) -> None:
    """Seed this process's torch, numpy and ``random`` streams from ``words`` (a run's --seed, its rank, the
    component's name and how often it started: the same run draws the same numbers, every component and every
    respawn its own), or from the OS's entropy where there are none. Forked components would otherwise all draw the
    fork server's numbers (every worker the same action noise), and spawned ones torch's one fixed default seed."""
    if words is None:
        torch.seed()
        np.random.seed()
        random.seed()
        return
    state = np.random.SeedSequence([word & 0xFFFF_FFFF_FFFF_FFFF for word in words]).generate_state(4)
    torch.manual_seed(int(state[0]) << 32 | int(state[1]))
    np.random.seed(state)
    random.seed(int(state[2]) << 32 | int(state[3]))


def die_with_parent(parent_pid: int | None = None) -> None:
    """Have the kernel SIGKILL this component when its parent dies (Linux): the runner, or the fork server, which
    exits with the runner (``parent_pid``; default: the spawning process). Components ignore SIGINT and SIGTERM and
    wait on each other, so without this a runner killed by SIGKILL or the OOM killer would leave them running
    forever, each spinning on its event loop."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    runner = multiprocessing.parent_process()
    if runner is None:
        return
    if os.getppid() != (parent_pid or runner.pid):
        os._exit(1)  # the parent died before the request above took effect
    if not process_alive(runner.pid):
        os._exit(1)  # the runner died, and the fork server is about to follow


def process_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def set_process_title(name: str) -> None:
    """Show components as sfe-rollout-0, sfe-inference-0, sfe-learner in top, ps and psutil (Linux only)."""
    name_this_process("sfe-" + name.removesuffix("_process").replace("_worker", "").replace("_", "-"))


def ignore_interrupts() -> None:
    """Ctrl-C in a terminal, and a job scheduler's or ``timeout``'s SIGTERM, go to the whole process group. A
    component killed by them would take no checkpoint and could die holding a queue's lock, leaving the runner
    blocked on it; so only the runner acts on them, and it stops the components in order (one that does not stop is
    killed, see ``terminate_processes``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def stop_own_loop(component: EventLoopObject) -> None:
    """Stop the component's loop if it runs in a process of its own. In serial mode every component shares the
    runner's loop, and only the runner may stop it (after the learner's final report)."""
    if component.event_loop.process is not None:
        component.event_loop.stop()


def death_reason(process) -> str:
    """Why a run stops on a component process's death, in words."""
    reason = f"process died: {process.name} (exit code {process.exitcode})"
    if imported_main_unguarded(process):
        reason += (
            ": it ran your script's call of main() as it imported the script (every component process imports it): "
            'put the call under if __name__ == "__main__":'
        )
    return reason


def unrespawnable(process) -> str | None:
    """Why a dead component is not respawned whatever --max_respawns allows, or None."""
    if imported_main_unguarded(process):
        return "its successor would import the script the same way"
    return None


def imported_main_unguarded(process) -> bool:
    """Whether ``process`` ended as one that ran the user's main() on import (``start_command``): its exit code,
    where this process runs a script by its path (whose call of main() may lack its guard)."""
    run_as_script = getattr(sys.modules["__main__"], "__spec__", None) is None
    return process.exitcode == UNGUARDED_MAIN_EXIT and run_as_script
