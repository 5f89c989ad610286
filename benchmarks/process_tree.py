"""Run a command and sample the peak resident memory of its whole process tree."""

from __future__ import annotations

import subprocess
import threading
import time
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
    command: list[str], timeout: float, interval: float = 0.5, env: dict | None = None, cwd: Path | None = None
) -> TreeRun:
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    root = psutil.Process(process.pid)
    peak, last_cpu = 0, 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, last_cpu
        while not done.is_set():
            rss, cpu = tree_rss_and_cpu(root)
            peak = max(peak, rss)
            last_cpu = max(last_cpu, cpu)
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        done.set()
        sampler.join()
    wall = time.time() - started
    return TreeRun(process.returncode, stdout, stderr, peak / 2**20, 100 * last_cpu / max(wall, 1e-6), wall)
