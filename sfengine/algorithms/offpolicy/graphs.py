"""The off-policy gradient step as CUDA graphs (``--cuda_graphs``): recorded once, then replayed as one launch.

A step of small networks (two 256-256 critics, minibatches of 256) is about a thousand operations issued one by
one from the learner's one Python thread: on an H200 the LIBERO residual recipe's step took about 9.5 ms, and its
learner, not its 16 cores of simulators, set the pace (benchmarks/README.md, "On a GPU machine"); issuing them is
the likely bound, not yet profiled there. A CUDA graph records the step's kernels once and replays them with one
call.

    minibatch (drawn on the CPU, copied to the GPU) --copy_--> static inputs --graph.replay()--> static statistics
                                                                  the critics' step [, the actor's], the targets'

Two graphs: a critic step alone (the warm-up, TD3's delayed actor) and a critic step with the actor's. Each kind's
first ``WARMUP_STEPS`` steps run as they always do, on a side stream (the run's own steps on their own
minibatches: they create the optimisers' state and pick the kernels), and the next is recorded, then replayed
for its minibatch. Random draws inside a step (TD3's target noise, SAC's actions) come from the GPU's generator,
which a replay advances as a run of eager steps does.

What a graph needs, ``blocker`` checks at start: the learner on a GPU, one rank (no all-reduce in a step), vector
observations (the image shifts draw on the CPU), the base of a residual on the policy's device, the target's
subset of critics the whole ensemble (a random subset is drawn on the CPU), no ``--ibrl``, a constant learning
rate (a graph keeps the rate it was recorded with), and the optimisers made ``capturable``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sfengine.algorithms.offpolicy.replay import NStep, each_tensor

WARMUP_STEPS = 3  # eager steps of each kind before it is recorded


def blocker(cfg, model, device: torch.device, world_size: int) -> str | None:
    """Why this run's gradient step (the learner's, on ``device``) cannot be a CUDA graph, in a few words (None:
    it can)."""
    options = cfg.algorithm_options
    if device.type != "cuda":
        return f"the learner is on {device.type}, not cuda"
    if world_size > 1:
        return f"{world_size} ranks average their gradients inside each step"
    if model.image_keys and options.image_shift > 0:
        return "the image shifts (--image_shift) are drawn on the CPU"
    if options.residual_over and options.residual_base_device not in ("", "cuda", "cuda:0"):
        return f"the base runs on --residual_base_device={options.residual_base_device}"
    if options.critic_subset < options.num_critics:
        return f"the target's random subset of critics (--critic_subset={options.critic_subset}) is drawn on the CPU"
    if options.ibrl:
        return "--ibrl's choice is drawn on the CPU"
    if cfg.learner.lr_schedule != "constant":
        return f"--lr_schedule={cfg.learner.lr_schedule} changes the rate a graph keeps"
    return None


class GraphedUpdate:
    """``update(minibatch, with_actor)`` of a trainer, replayed from CUDA graphs. Its statistics are the graph's
    own output tensors, overwritten by the next replay: the caller reads or adds them before it (stream order
    makes an addition issued before the next replay safe)."""

    def __init__(self, update):
        self.update = update  # update(minibatch: NStep, with_actor: bool) -> dict[str, Tensor]
        self.static: NStep | None = None
        self.graphs: dict[bool, tuple[torch.cuda.CUDAGraph, dict[str, Tensor]]] = {}
        self.eager_steps = {False: 0, True: 0}
        self.side = torch.cuda.Stream()

    def __call__(self, minibatch: NStep, with_actor: bool) -> dict[str, Tensor]:
        if with_actor in self.graphs:
            copy_into(self.static, minibatch)
            graph, outputs = self.graphs[with_actor]
            graph.replay()
            return dict(outputs)
        if self.eager_steps[with_actor] < WARMUP_STEPS:
            self.eager_steps[with_actor] += 1
            return self.on_side_stream(minibatch, with_actor)
        if self.static is None:
            self.static = each_tensor(minibatch, torch.clone)
        copy_into(self.static, minibatch)
        torch.cuda.current_stream().wait_stream(self.side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # (the learner process's other threads)
            outputs = self.update(self.static, with_actor)
        self.graphs[with_actor] = (graph, outputs)
        graph.replay()  # recording ran nothing: this step is the replay's
        return dict(outputs)

    def on_side_stream(self, minibatch: NStep, with_actor: bool) -> dict[str, Tensor]:
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            stats = self.update(minibatch, with_actor)
        torch.cuda.current_stream().wait_stream(self.side)
        return stats


def copy_into(static: NStep, minibatch: NStep) -> None:
    for mine, theirs in zip(static, minibatch, strict=True):
        if isinstance(mine, dict):
            for key, value in mine.items():
                value.copy_(theirs[key])
        else:
            mine.copy_(theirs)
