"""The learner's math stays on the device of its inputs, so that it runs on a GPU as on the CPU.

A tensor made without ``device=`` lands on the CPU, and a GPU learner then fails half-way through its first update
(FlowSAR's credit weights did, on the first GPU run). The ``meta`` device finds such a tensor on any machine: it has
shapes but no data, and mixing it with a CPU tensor is the same error as mixing a CUDA one. The off-policy
gradient step reads nothing back from its device, so the whole of it (sampling from the replay kept in CPU memory,
the critics' and the actor's steps, the targets' updates) runs on ``meta`` but for the optimiser's own kernel.
"""

from __future__ import annotations

import pytest
import torch

from helpers import registered_base
from sfengine.algorithms import algorithm_for
from sfengine.algorithms.advantages import gae, vtrace
from sfengine.algorithms.flow_sar.sar import credit_weights, flow_sar_loss
from sfengine.algorithms.group_advantages import grpo, rloo
from sfengine.config import parse_config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import ActionSpec, ObsSpec

META = torch.device("meta")
B, T, N, D = 3, 5, 6, 4


def on_meta(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    return [torch.empty(shape, device=META) for shape in shapes]


def test_advantages_keep_to_their_inputs_device():
    rewards, values, terminated, truncated, truncation_values, log_rhos = on_meta(
        (B, T), (B, T + 1), (B, T), (B, T), (B, T), (B, T)
    )
    for advantages, returns in (
        gae(rewards, values, terminated, truncated, truncation_values, 0.99, 0.95),
        vtrace(rewards, values, terminated, truncated, truncation_values, log_rhos, 0.99),
    ):
        assert advantages.device == returns.device == META


@pytest.mark.parametrize("variant", ["softplus_kl", "mse_branch"])
def test_flow_sar_credit_and_loss_keep_to_their_inputs_device(variant):
    errors, success = on_meta((N,), (3,))
    episodes = torch.tensor([0, 0, 1, 1, 2, 2], device=META)
    weights, labels = credit_weights(errors, episodes, success, 0.5, 0.1, 0.9)
    assert weights.device == labels.device == META
    v_theta, v_old, target, t = on_meta((N, D), (N, D), (N, D), (N,))
    assert flow_sar_loss(v_theta, v_old, target, t, weights, labels, 3, 1.0, "sde", variant).loss.device == META


def test_group_advantages_keep_to_their_inputs_device():
    (outcomes,) = on_meta((4, 8))
    assert rloo(outcomes).device == grpo(outcomes).device == META


VECTOR = ObsSpec({"obs": (3,)}, {"obs": torch.float32})
IMAGES = ObsSpec({"image": (12, 12, 1), "position": (2,)}, {"image": torch.uint8, "position": torch.float32})
ACTIONS = ActionSpec(discrete=False, dim=2, low=(-2.0, 0.0), high=(2.0, 1.0))


@pytest.mark.parametrize(
    "obs_spec, args",
    [
        (VECTOR, ["--algo=sac"]),
        (VECTOR, ["--algo=td3", "--num_critics=5", "--critic_subset=2"]),
        (IMAGES, ["--algo=sac", "--image_shift=0.1"]),
        (VECTOR, ["--algo=td3", "--residual_over=meta_base", "--ibrl=true"]),
        (IMAGES, ["--algo=sac", "--residual_over=meta_base", "--residual_base_action=sample"]),
    ],
    ids=["sac", "td3 of 5 critics", "sac from images", "residual td3, ibrl", "residual sac, images"],
)
def test_an_off_policy_gradient_step_keeps_to_the_learners_device(monkeypatch, obs_spec, args):
    cfg = parse_config(["--env=Pendulum-v1", "--rollout=8", "--batch_size=16", "--hidden_sizes=16,16", *args])
    cfg.set("learning_starts", 0)
    algorithm = algorithm_for(cfg)
    with registered_base("meta_base", 0):
        model = algorithm.model(cfg, obs_spec, ACTIONS).to(META)
        trainer = algorithm.trainer(model, cfg)
    batch = TrajectoryBuffers.allocate(4, 8, obs_spec, ACTIONS, shared=False, final_obs=True)
    batch.chunk_steps[:] = 1
    batch.truncated[:, 5] = True
    trainer.replay.insert(batch, batch.rewards[:, :-1])
    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, closure=None: None)  # no fused kernel on meta
    trainer.options.actor_delay = 1
    stats = trainer.step()
    assert {value.device for value in stats.values() if isinstance(value, torch.Tensor)} == {META}
    assert "actor_loss" in stats and all(p.device == META for p in trainer.target_critics.parameters())
