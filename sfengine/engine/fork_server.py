"""How component processes start: forked by a fork server that imported torch and the components' modules once.

A command (``python -m sfengine.train``, ``sfengine.evaluate``) imports torch and those modules first thing and
forks its server from itself (``start_early``), before it builds anything or starts a thread: the server then holds
them without importing them again. Elsewhere (a user's script calling ``main()``) the server is multiprocessing's
own, a fresh interpreter that imports them (``component_context``). Standard library only at import time, so that a
command reads its options before torch is imported.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import socket
import sys
import threading
import types
from collections.abc import Callable
from multiprocessing import connection, resource_tracker, util

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

    A command's start forks the server from itself (``start_early``); otherwise it is started here, before the run
    builds anything, so its imports overlap the runner's own start. Either way it must outlive a SIGTERM sent to
    the whole process group (a scheduler's, ``timeout``'s): the runner stops the components in order after one,
    and the server reports their exit codes. So it starts with SIGTERM ignored (an ignored signal stays ignored
    across its exec); it ignores SIGINT on its own, and it ends when the runner does (see ``die_with_parent``)."""
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


def stops_its_fork_server(main: Callable[..., int]) -> Callable[..., int]:
    """A command's ``main``, ending the fork server it started however it returns. A start refused (bad input) or
    interrupted (Ctrl-C in the env's check) returns before any run could stop the server, and a user's script that
    calls ``main()`` has no ``end_process_now`` after it: the spawned server, still importing torch for seconds on a
    loaded machine, then outlived the command, holding its stdout and stderr open, so that whatever read them to
    their end (``tee``, a test's ``communicate``) waited for it."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        finally:
            stop_fork_server()

    return wrapped


def leave_fork_server() -> None:
    """A forked component's first act: close its copy of the fork server's 'alive' pipe, which the server exits on
    once every holder has closed it. Then the runner holds the only copy, and the server ends with the runner."""
    server = multiprocessing.forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and server._forkserver_pid is None:  # inherited, not a server this process started
        os.close(fd)
        server._forkserver_alive_fd = None


def start_early(argv: list[str]) -> None:
    """Import torch and the components' modules, and fork the fork server from this process, from a command's
    ``__main__`` before anything else: a spawned server imported them a second time, about 2.5 s of CPU every run
    paid again on a loaded machine. Not for a serial run (``--serial_mode``: no component processes) or a help
    text; a server that turns out unused (a preset's serial mode, bad input) is stopped at the command's end
    (``end_process_now``)."""
    if any(arg in ("-h", "--help") for arg in argv) or serial_mode_asked(argv):
        return
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    for name in PRELOADED_MODULES:
        __import__(name)
    fork_server_from_here(multiprocessing.forkserver._forkserver)


def fork_server_from_here(server: multiprocessing.forkserver.ForkServer) -> None:
    """Start ``server`` as a fork of this process, which has imported what it preloads and started no thread of
    its own, as multiprocessing's ``ensure_running`` would start it by spawning a fresh interpreter: the same
    listening socket, "alive" pipe and loop (``multiprocessing.forkserver.main``), SIGTERM ignored. The server's
    ``__main__`` is made a blank module, as a spawned server's is, so each component imports the command's module
    by name as it does from a spawned server, never this process's half-run copy of it."""
    with server._lock:
        if server._forkserver_pid is not None:
            return
        resource_tracker.ensure_running()
        address = connection.arbitrary_address("AF_UNIX")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # what is buffered now would be written again by every component
            stream.flush()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # a SIGTERM now waits for this process
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(alive_w)
                server._lock = threading.Lock()  # held here by this process: every component would inherit it held
                sys.modules["__main__"] = types.ModuleType("__main__")
                name_this_process("forkserver")  # not a second copy of the command in top and ps
                multiprocessing.forkserver.main(listener.fileno(), alive_r, [])
            finally:
                os._exit(0)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        listener.close()
        os.close(alive_r)
        server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid


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


def name_this_process(title: str) -> None:
    """The name top, ps and psutil show for this process (its first 15 characters; Linux only)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        pr_set_name = 15
        libc.prctl(pr_set_name, title.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass
