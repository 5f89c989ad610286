"""``--cuda_graphs``: which runs can record their gradient step as CUDA graphs, and a run that cannot says why and
learns as it always does. The graphs themselves run on a GPU (tests/gpu: the recorded step agrees with the eager
one, and SAC learns sparse_reach with them)."""

from __future__ import annotations

import logging

import pytest
import torch

from helpers import registered_base
from sfengine.algorithms import algorithm_for
from sfengine.algorithms.offpolicy.graphs import blocker
from sfengine.config import parse_config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import ActionSpec, ObsSpec

VECTOR = ObsSpec({"obs": (3,)}, {"obs": torch.float32})
IMAGES = ObsSpec({"image": (12, 12, 1), "position": (2,)}, {"image": torch.uint8, "position": torch.float32})
ACTIONS = ActionSpec(discrete=False, dim=2, low=(-2.0, 0.0), high=(2.0, 1.0))
CUDA = torch.device("cuda")


def why_not(*args: str, obs_spec: ObsSpec = VECTOR, device: torch.device = CUDA, ranks: int = 1) -> str | None:
    cfg = parse_config(["--env=Pendulum-v1", "--hidden_sizes=16,16", "--cuda_graphs=true", *args])
    with registered_base("graph_base", 0):
        model = algorithm_for(cfg).model(cfg, obs_spec, ACTIONS)
    return blocker(cfg, model, device, ranks)


@pytest.mark.parametrize(
    "args",
    [
        ["--algo=sac"],
        ["--algo=td3"],
        ["--algo=td3", "--residual_over=graph_base", "--num_critics=4", "--critic_subset=4"],
        ["--algo=sac", "--image_shift=0"],  # images left unshifted
    ],
    ids=["sac", "td3", "residual td3 of 4 critics", "sac from unshifted images"],
)
def test_a_single_rank_run_on_a_gpu_can_record_its_step(args):
    assert why_not(*args, obs_spec=IMAGES if "--image_shift=0" in args else VECTOR) is None


@pytest.mark.parametrize(
    "args, kwargs, reason",
    [
        (["--algo=sac"], {"device": torch.device("cpu")}, "the learner is on cpu"),
        (["--algo=sac"], {"ranks": 2}, "2 ranks average their gradients"),
        (["--algo=sac"], {"obs_spec": IMAGES}, "image shifts"),
        (["--algo=td3", "--residual_over=graph_base", "--residual_base_device=cpu"], {}, "--residual_base_device=cpu"),
        (["--algo=td3", "--num_critics=5"], {}, "--critic_subset=2"),
        (["--algo=td3", "--residual_over=graph_base", "--ibrl=true"], {}, "--ibrl"),
        (["--algo=sac", "--lr_schedule=linear"], {}, "--lr_schedule=linear"),
    ],
    ids=["cpu", "ranks", "images", "cpu base", "critic subset", "ibrl", "schedule"],
)
def test_a_run_that_cannot_record_its_step_is_told_why(args, kwargs, reason):
    assert reason in why_not(*args, **kwargs)


def test_on_the_cpu_a_run_with_cuda_graphs_says_why_not_and_takes_its_steps_as_always(caplog):
    cfg = parse_config(["--algo=td3", "--env=Pendulum-v1", "--rollout=8", "--batch_size=16", "--cuda_graphs=true"])
    cfg.set("learning_starts", 0)
    algorithm = algorithm_for(cfg)
    trainer = algorithm.trainer(algorithm.model(cfg, VECTOR, ACTIONS), cfg)
    batch = TrajectoryBuffers.allocate(4, 8, VECTOR, ACTIONS, shared=False, final_obs=True)
    batch.chunk_steps[:] = 1
    with caplog.at_level(logging.WARNING):
        stats = trainer.train(batch, 0, 0)
    assert "--cuda_graphs: the gradient step stays as it is: the learner is on cpu" in caplog.text
    assert trainer.graphed is None and stats["gradient_steps"] == 32
    assert all(not group["capturable"] for group in trainer.critic_optimizer.param_groups)
