"""The learners' process group on its own: two real gloo ranks in spawned processes."""

from __future__ import annotations

import multiprocessing
import os
import socket

import pytest
import torch

from sfengine.config import ModelConfig
from sfengine.engine.distributed import LearnerGroup, RankBatch, RankInfo, parameter_checksum
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    group = LearnerGroup(RankInfo.from_environment(), torch.device("cpu"))
    torch.manual_seed(100 + rank)  # different initial weights on each rank
    model = ActorCritic(ObsSpec({"obs": (3,)}, {"obs": torch.float32}), ActionSpec(True, 2), ModelConfig())
    before = parameter_checksum(model)
    group.broadcast_model(model)
    after = parameter_checksum(model)
    # Different data on each rank: the averaged gradient is the gradient of the mean loss over both.
    obs = torch.full((4, 3), float(rank + 1))
    _, values = model({"obs": obs})
    values.sum().backward()
    group.average_gradients(model)
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    model.update_normalizers({"obs": obs}, group.sum)
    # Rank 0's returns are all 0, rank 1's all 4: merged, mean 2 and std 2, and the same value head on both ranks.
    model.update_return_normalizer(torch.full((6,), 4.0 * rank), group.sum)
    return_stats = model.return_normalizer.stats
    returns = (float(return_stats.mean), float(return_stats.var), parameter_checksum(model))
    exchanged = group.exchange(RankBatch(10 + rank, rank == 1, {"position": rank}, after))
    # Plain lists, not tensors: a tensor travels as a file descriptor that this process must still serve when the
    # parent unpickles it, and it may have exited by then (a CI run failed on that).
    mean = model.normalizers["obs"].mean.tolist()
    results.put((rank, before, after, grads.tolist(), mean, returns, exchanged))
    group.close()


@pytest.mark.slow
def test_two_ranks_share_weights_gradients_normalisers_and_news():
    spawn = multiprocessing.get_context("spawn")
    results, port = spawn.Queue(), free_port()
    processes = [spawn.Process(target=rank_main, args=(rank, port, results)) for rank in range(2)]
    for process in processes:
        process.start()
    by_rank = dict((r[0], r[1:]) for r in (results.get(timeout=120) for _ in processes))
    for process in processes:
        process.join(30)
    (before0, after0, grads0, mean0, returns0, news0) = by_rank[0]
    (before1, after1, grads1, mean1, returns1, news1) = by_rank[1]
    assert before0 != before1  # the ranks started apart
    assert after0 == after1 == before0  # rank 0's weights everywhere
    assert grads0 == pytest.approx(grads1)
    # Each rank's observations are all 1.0 or all 2.0: the merged normaliser sees their mean, 1.5.
    assert mean0 == mean1
    assert mean0 == pytest.approx([1.5] * 3, abs=1e-3)
    assert returns0 == returns1
    assert returns0[0] == pytest.approx(2.0, abs=1e-3) and returns0[1] == pytest.approx(4.0, abs=1e-3)
    assert [n.samples for n in news0] == [n.samples for n in news1] == [10, 11]
    assert [n.stop_requested for n in news0] == [False, True]
    assert [n.task_sequence["position"] for n in news1] == [0, 1]
