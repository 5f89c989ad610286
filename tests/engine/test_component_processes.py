"""How component processes start: forked from a fork server that imported torch once, each with its own random
streams, and gone with the process that started them."""

from __future__ import annotations

import os

import numpy as np
import psutil
import torch

from sfengine.engine.event_loop import (
    Component,
    EngineProcess,
    component_context,
    parent_of_components,
    stop_own_loop,
)


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


def test_components_fork_from_the_server_and_each_draws_its_own_random_numbers():
    context = component_context()
    assert context.get_start_method() == "forkserver"
    draws, parents = torch.zeros(3, 2).share_memory_(), torch.zeros(3, dtype=torch.int64).share_memory_()
    processes = []
    for row in range(3):
        process = EngineProcess(f"drawer_{row}_process", context)
        drawer = DrawsRandomNumbers(process.event_loop, row, draws, parents)
        process.event_loop.start.connect(drawer.on_start)
        process.start()
        processes.append(process)
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    server = parent_of_components(context)
    assert server != os.getpid() and psutil.Process(server).ppid() == os.getpid()
    assert parents.tolist() == [server] * 3  # forked by the server, not spawned by this process
    # A fork copies the server's random state: without a fresh seed every worker would add the same action noise.
    assert len(set(draws[:, 0].tolist())) == 3 and len(set(draws[:, 1].tolist())) == 3
