"""CPU threads per process: torch's intra-op pool and numpy's BLAS pool, set together.

Each process of a run computes on one core's worth of work (rollout and inference workers on 1 thread, the learner
on ``--learner_threads``). torch's pool obeys ``torch.set_num_threads``; numpy's OpenBLAS keeps its own pool, one
thread per core, whose idle threads spin after every matrix product. In the learner's numpy step
(``--learner_backend=numpy``) those spinning threads took the cores the rollout workers needed: on the 2-core
machine a Pendulum run's policy lag was 1.8-2.3 versions and its return -455 to -743; with the pool limited, 0.55
and -191 to -197.
"""

from __future__ import annotations

import torch
from threadpoolctl import threadpool_limits


def set_cpu_threads(num_threads: int) -> None:
    """Limit this process's torch and BLAS thread pools to ``num_threads`` each (for the rest of the process)."""
    torch.set_num_threads(num_threads)
    threadpool_limits(num_threads, user_api="blas")
