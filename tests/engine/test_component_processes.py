"""How component processes start: forked from a fork server that imported torch once, each with its own random
streams, and gone with the process that started them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import psutil
import pytest
import torch

from sfengine.engine.event_loop import Component, EngineProcess, stop_own_loop
from sfengine.engine.fork_server import component_context, parent_of_components, serial_mode_asked


class DrawsRandomNumbers(Component):
    """Writes one draw of torch's and one of numpy's global random streams into its row of ``draws`` and its
    parent's pid into ``parents``, then stops its loop (the process then ends with exit code 0)."""

    def __init__(self, loop, row: int, draws: torch.Tensor, parents: torch.Tensor):
        super().__init__(loop, f"drawer_{row}")
        self.row, self.draws, self.parents = row, draws, parents

    def on_start(self) -> None:
        self.draws[self.row, 0] = torch.rand(())
        self.draws[self.row, 1] = float(np.random.rand())
        self.parents[self.row] = os.getppid()
        stop_own_loop(self)


def draw_in_components(context, names: list[str], seed: tuple[int, ...]) -> tuple[list[list[float]], list[int]]:
    """Start a component process per name, seeded from ``seed``; their draws (torch's, numpy's) and parents."""
    draws = torch.zeros(len(names), 2, dtype=torch.float64).share_memory_()
    parents = torch.zeros(len(names), dtype=torch.int64).share_memory_()
    processes = []
    for row, name in enumerate(names):
        process = EngineProcess(f"{name}_process", context, seed)
        drawer = DrawsRandomNumbers(process.event_loop, row, draws, parents)
        process.event_loop.start.connect(drawer.on_start)
        process.start()
        processes.append(process)
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    return draws.tolist(), parents.tolist()


def test_components_fork_from_the_server_and_each_draws_its_own_random_numbers_from_the_seed():
    context = component_context()
    assert context.get_start_method() == "forkserver"
    draws, parents = draw_in_components(context, ["a", "b", "c"], (5, 0))
    server = parent_of_components(context)
    assert server != os.getpid() and psutil.Process(server).ppid() == os.getpid()
    assert parents == [server] * 3  # forked by the server, not spawned by this process
    # A fork copies the server's random state: without a seed of its own every worker would add the same noise.
    assert len({row[0] for row in draws}) == 3 and len({row[1] for row in draws}) == 3
    # The same seed and name draw the same numbers again (a run is repeatable), another seed other numbers.
    assert draw_in_components(context, ["b"], (5, 0))[0] == [draws[1]]
    other = draw_in_components(context, ["b"], (6, 0))[0][0]
    assert other[0] != draws[1][0] and other[1] != draws[1][1]


def test_the_package_imports_without_torch_and_its_public_names_on_first_use():
    # `python -m sfengine.train` imports the package before its fork server starts: torch must not come with it.
    code = "import sys, sfengine; assert 'torch' not in sys.modules; from sfengine import register_env, Trainer; print(Trainer.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "Trainer", result.stderr[-2000:]


def test_a_command_refused_at_once_leaves_no_fork_server_behind(tmp_path):
    # The server is forked before the command parses its options; bad input ends the command within a second or
    # two: the command stops it, rather than leave it to end by itself, holding the command's output open
    # meanwhile. (Output to a file: a pipe would wait for the server.)
    mark = {"SFENGINE_TEST_MARK": str(tmp_path)}  # the server inherits the command's environment
    with open(tmp_path / "err", "w") as err:
        command = [sys.executable, "-m", "sfengine.train", "--env=no_such_env"]
        env = {**os.environ, **mark}
        returncode = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=err, env=env, timeout=120).returncode
    left = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("SFENGINE_TEST_MARK") == mark["SFENGINE_TEST_MARK"]:
                left.append((process, f"{process.name()}: {' '.join(process.cmdline())[:200]}"))
    assert [command for _, command in left if "forkserver" in command] == []
    # multiprocessing's resource tracker ends by itself once the command has (a moment later on a busy machine).
    _, alive = psutil.wait_procs([process for process, _ in left], timeout=10)
    assert alive == []
    assert returncode == 2 and "unknown env 'no_such_env'" in (tmp_path / "err").read_text()


def test_a_run_imports_torch_once_however_many_processes_it_starts(tmp_path):
    # The command imports torch and forks the fork server from itself, which forks the components: none of them
    # imports it again (a spawned server did, 2.5 s of CPU a run). -X importtime reaches every interpreter a run
    # starts (multiprocessing passes the flag on), and each prints a line for every module it imports.
    command = [sys.executable, "-X", "importtime", "-m", "sfengine.train", "--env=CartPole-v1"]
    command += ["--train_for_env_steps=2048", f"--train_dir={tmp_path}", "--experiment=once"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    torch_imports = [line for line in result.stderr.splitlines() if line.split("|")[-1].strip() == "torch"]
    assert len(torch_imports) == 1, torch_imports
    assert "reached 2048 env steps" in result.stdout


@pytest.mark.parametrize(
    "argv, serial",
    [
        (["--serial_mode=True"], True),
        (["--serial_mode", "yes"], True),
        (["--serial_mode=1", "--env=x"], True),
        (["--serial_mode=false"], False),
        (["--serial_mode", "off"], False),
        (["--serial_mode=True", "--serial_mode=0"], False),  # the last one given, as the config reads it
        (["--serial_mode_x=True"], False),
        (["--env=CartPole-v1"], False),
    ],
)
def test_a_serial_run_is_told_from_its_command_line_as_the_config_reads_it(argv, serial):
    # A serial run starts no component process, so no fork server is started early for it; a run that is not one
    # gets one (its components start faster), whichever way the option is written.
    assert serial_mode_asked(argv) is serial
