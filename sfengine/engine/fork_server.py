"""How component processes start: forked by a fork server that imported torch and the components' modules once.

Standard library only, so that a command can start the server before it imports torch itself (``start_early``):
the two imports then run side by side, on two cores, instead of one after the other.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal

# What the fork server imports once for every component it starts: torch and the components' own modules.
PRELOADED_MODULES = [
    "torch",
    "sfengine.rollout.rollout_worker",
    "sfengine.inference.inference_worker",
    "sfengine.learning.learner_worker",
]


def component_context() -> multiprocessing.context.BaseContext:
    """How component processes start: forked by a fork server that imported torch and the components' modules
    once (``PRELOADED_MODULES``), where the platform has one; spawned otherwise. A spawned component is a fresh
    interpreter that imports torch itself, about 1.5 s of CPU a process, which every run's start waited for.

    The server is started here, before the run builds anything, so its imports overlap the runner's own start. It
    must outlive a SIGTERM sent to the whole process group (a scheduler's, ``timeout``'s): the runner stops the
    components in order after one, and the server reports their exit codes. So it starts with SIGTERM ignored (an
    ignored signal stays ignored across its exec); it ignores SIGINT on its own, and it ends when the runner does
    (see ``die_with_parent``)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED_MODULES)
    # Blocked meanwhile, a SIGTERM to this process waits for its handler instead of being ignored with the server's.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    handler = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return context


def parent_of_components(context: multiprocessing.context.BaseContext) -> int:
    """The pid of the process a component started now will be a child of: the fork server, or this process."""
    if context.get_start_method() != "forkserver":
        return os.getpid()
    component_context()  # the server again if it died (a SIGKILL): it is needed to start one
    return multiprocessing.forkserver._forkserver._forkserver_pid


def stop_fork_server() -> None:
    """End this process's fork server once every component it started has ended. It would end by itself when this
    process does, but only after its interpreter's teardown of torch (about half a second), holding the run's
    stdout and stderr open meanwhile: whatever reads a run's output to its end waited for that."""
    server = multiprocessing.forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is None:
            return
        os.kill(server._forkserver_pid, signal.SIGKILL)
        os.waitpid(server._forkserver_pid, 0)
        os.close(server._forkserver_alive_fd)
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None


def leave_fork_server() -> None:
    """A forked component's first act: close its copy of the fork server's 'alive' pipe, which the server exits on
    once every holder has closed it. Then the runner holds the only copy, and the server ends with the runner."""
    server = multiprocessing.forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and server._forkserver_pid is None:  # inherited, not a server this process started
        os.close(fd)
        server._forkserver_alive_fd = None


def start_early(argv: list[str]) -> None:
    """Start the fork server at once, from a command's ``__main__`` before its own imports, so the server imports
    torch while the command does. Not for a serial run (``--serial_mode``: no component processes) or a help text;
    a server that turns out unused (a preset's serial mode, bad input) is stopped at the command's end
    (``end_process_now``)."""
    if any(arg in ("-h", "--help") for arg in argv) or serial_mode_asked(argv):
        return
    component_context()


def serial_mode_asked(argv: list[str]) -> bool:
    """Whether the command line turns ``--serial_mode`` on (``--serial_mode=VALUE`` or ``--serial_mode VALUE``, the
    last one given, VALUE true as the config reads it: 1, true, yes or on; its words are repeated here because this
    module imports nothing of the package)."""
    asked = False
    for i, arg in enumerate(argv):
        name, has_value, value = arg.partition("=")
        if name == "--serial_mode":
            value = value if has_value else (argv[i + 1] if i + 1 < len(argv) else "")
            asked = value.strip().lower() in ("1", "true", "yes", "on")
    return asked
