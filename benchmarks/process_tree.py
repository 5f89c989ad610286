"""Run a command and sample the peak resident memory of its whole process tree."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass
class TreeRun:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_mb: float
    cpu_percent: float  # mean CPU use of the tree over the run, 100 = one core
    wall_seconds: float


def tree_rss_and_cpu(root: psutil.Process) -> tuple[int, float]:
    """(RSS in bytes, cumulative CPU seconds) over root and all its descendants."""
    rss, cpu = 0, 0.0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0.0
    for p in processes:
        try:
            rss += p.memory_info().rss
            times = p.cpu_times()
            cpu += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return rss, cpu


def run_and_measure(
    command: list[str],
    timeout: float,
    interval: float = 0.5,
    env: dict | None = None,
    cwd: Path | None = None,
    interrupt_when: Callable[[str], bool] | None = None,
) -> TreeRun:
    """Run ``command`` to its end, sampling its tree's memory every ``interval`` seconds. ``interrupt_when(stdout)``,
    asked after each line of output, may end the run early: the command then gets one SIGINT (the engine's clean
    stop: checkpoint, summary, exit 0)."""
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    root = psutil.Process(process.pid)
    peak, last_cpu = 0, 0.0
    done = threading.Event()
    stdout_lines: list[str] = []
    stderr_lines: list[str] = []

    def sample() -> None:
        nonlocal peak, last_cpu
        while not done.is_set():
            rss, cpu = tree_rss_and_cpu(root)
            peak = max(peak, rss)
            last_cpu = max(last_cpu, cpu)
            done.wait(interval)

    def read_stdout() -> None:
        interrupted = False
        for line in process.stdout:
            stdout_lines.append(line)
            if interrupt_when is not None and not interrupted and interrupt_when("".join(stdout_lines)):
                process.send_signal(signal.SIGINT)
                interrupted = True

    sampler = threading.Thread(target=sample, daemon=True)
    readers = [
        threading.Thread(target=read_stdout, daemon=True),
        threading.Thread(target=lambda: stderr_lines.extend(process.stderr), daemon=True),
    ]
    for thread in [sampler, *readers]:
        thread.start()
    try:
        process.wait(timeout=timeout)
    finally:
        done.set()
        sampler.join()
    for reader in readers:  # the pipes close when the last process holding them exits
        reader.join(timeout=60)
    wall = time.time() - started
    stdout, stderr = "".join(stdout_lines), "".join(stderr_lines)
    return TreeRun(process.returncode, stdout, stderr, peak / 2**20, 100 * last_cpu / max(wall, 1e-6), wall)
