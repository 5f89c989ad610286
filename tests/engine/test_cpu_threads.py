"""set_cpu_threads limits numpy's BLAS pool as well as torch's: the learner's numpy step runs its matrix products
on OpenBLAS, whose default pool (one thread per core) spins on the cores the rollout workers need."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json
from threadpoolctl import threadpool_info
import torch
from sfengine.engine.cpu_threads import set_cpu_threads
set_cpu_threads(1)
blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
print(json.dumps({"torch": torch.get_num_threads(), "blas": blas}))
"""


def test_set_cpu_threads_limits_torch_and_blas_pools_to_one_thread():
    env = {"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "PATH": ""}  # pools of 2 before the call
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    threads = json.loads(result.stdout)
    assert threads["torch"] == 1
    assert threads["blas"] and all(n == 1 for n in threads["blas"]), threads
