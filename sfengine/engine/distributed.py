"""Multi-rank training on torch.distributed, launched by torchrun (one machine or several):

    torchrun --nproc_per_node=2 -m sfengine.train --env=libero_spatial

Each rank is a whole sfengine: its own runner, rollout workers, inference workers and learner. Only the
learners form the process group (gloo on CPU, nccl on CUDA), and they move in lockstep, one exchange per
training batch:

    rank 0 learner --+                       +--> same decision on every rank: train on this batch, or stop
    rank 1 learner --+-- exchange(RankBatch) +--> global env steps, episodes of the other ranks (for rank 0)
                                             +--> gradients all-reduced at every optimiser step

Every rank sees the same exchanged data, so all train the same number of batches and make the same number of
collective calls: a stop (the step limit, the clock, a signal on any rank) is agreed at an exchange, never
taken alone. The initial weights are broadcast from rank 0. Rank 0 alone writes checkpoints, TensorBoard and
summary.json. A rank that dies breaks the group: the others get an error from torch.distributed within the
group's timeout, stop, and torchrun ends the job.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from sfengine.engine.messages import EpisodeStats

GROUP_TIMEOUT = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # ranks on this machine
    local_rank: int = 0  # this rank's index among them

    @classmethod
    def from_environment(cls) -> RankInfo:
        """The rank torchrun gave this process (inherited by every process it spawns); rank 0 of 1 without it."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(
            int(os.environ.get("RANK", "0")),
            world_size,
            int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size))),
            int(os.environ.get("LOCAL_RANK", "0")),
        )


class Launcher:
    """torchrun's agent, the parent of this rank's main process. Killed alone (SIGKILL, the OOM killer, a lost
    node's agent), it signals nobody: without a watch its ranks would train on to the end of the run, holding the
    machine's cores and GPUs with no job around them. The runner asks ``gone`` on each tick of its watch and stops
    as after a SIGTERM (a checkpoint, the other ranks' agreement). Outside torchrun (no TORCHELASTIC_RUN_ID) the
    parent is a shell, which a run started with nohup is meant to outlive: nothing is watched."""

    def __init__(self):
        self.pid = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None

    def gone(self) -> str | None:
        """Why this rank should stop, once its launcher has exited (its parent is then another process)."""
        if self.pid is None or os.getppid() == self.pid:
            return None
        return f"torchrun (pid {self.pid}) exited"


def rank_device(name: str, ranks: RankInfo | None = None) -> torch.device:
    """The torch device of ``--device=name`` for this rank's learner and inference. On CUDA, each rank on a
    machine takes its own GPU (its local rank, modulo the GPUs there): nccl refuses two ranks on one GPU, and
    torchrun's ranks would otherwise all land on the first."""
    if name != "cuda":
        return torch.device(name)
    ranks = ranks or RankInfo.from_environment()
    return torch.device("cuda", ranks.local_rank % max(1, torch.cuda.device_count()))


@dataclass
class RankBatch:
    """What a learner tells the others before each training batch."""

    samples: int  # env steps in this rank's batch
    stop_requested: bool  # this rank's runner wants to stop (the clock, a signal)
    task_sequence: dict  # this rank's task sequence state, for the checkpoint
    parameter_checksum: float  # to check that every rank holds the same weights
    episodes: list[EpisodeStats] = field(default_factory=list)  # finished since the last exchange
    trainable: bool = True  # False: an empty group batch (only dropped groups' steps); no rank updates this round


class LearnerGroup:
    """The learners' process group. With one rank, every call is local and costs nothing."""

    def __init__(self, ranks: RankInfo, device: torch.device):
        self.ranks, self.device = ranks, device
        if ranks.world_size > 1:
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, init_method="env://", timeout=GROUP_TIMEOUT)

    @property
    def distributed(self) -> bool:
        return self.ranks.world_size > 1

    def broadcast_model(self, model: nn.Module) -> None:
        """Rank 0's parameters and buffers (the observation normalisers) to every rank."""
        if self.distributed:
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)

    def average_gradients(self, model: nn.Module) -> None:
        if not self.distributed:
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.ranks.world_size
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of ``tensor`` over the ranks (in place)."""
        if self.distributed:
            dist.all_reduce(tensor)
        return tensor

    def exchange(self, mine: RankBatch) -> list[RankBatch]:
        """Every rank's RankBatch, in rank order."""
        if not self.distributed:
            return [mine]
        gathered: list[RankBatch | None] = [None] * self.ranks.world_size
        dist.all_gather_object(gathered, mine)
        return gathered

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


def parameter_checksum(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(t.double().sum() for t in model.state_dict().values()))
