"""One FlowSAR update on a batch of whole episodes (``--algo=flow_sar``): credit weights from the self-annotation,
then epochs of minibatch steps on the mirror-branch loss, then the EMA step of the reference policy.

The batch is a ``GroupBatch`` (whole episodes with their success, grouped by ``--task_group_size``; groups of one
are allowed: FlowSAR's credit is per episode, not per group). Each step carries what the inference worker's
self-annotation wrote with the reference policy: ``e_i``, and the training point ``(t, eps)`` with ``v_old``. The
math is ``sfengine.algorithms.flow_sar.sar``; the optimiser, the learning-rate schedule and the gradient step are the
shared ``Trainer``'s.
"""

from __future__ import annotations

import copy

import torch

from sfengine.algorithms.flow_sar.sar import credit_weights, ema_decay, ema_update_, flow_sar_loss
from sfengine.config import Config
from sfengine.engine.distributed import LearnerGroup
from sfengine.learning.group_batcher import GroupBatch
from sfengine.learning.trainer import Trainer
from sfengine.models.actor_critic import ActorCritic


class FlowSARTrainer(Trainer):
    def __init__(self, model: ActorCritic, cfg: Config, group: LearnerGroup | None = None):
        super().__init__(model, cfg, group)
        self.reference = copy.deepcopy(model)  # theta_old, published beside the policy (SharedWeights)
        self.reference.requires_grad_(False)
        self.updates = 0

    def state_dict(self) -> dict:
        """What a checkpoint keeps beside the model and the optimiser: the reference and its update count (the
        linear schedule's position)."""
        return {
            "reference": {k: t.detach().cpu() for k, t in self.reference.state_dict().items()},
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.reference.load_state_dict(state["reference"])
        self.updates = int(state["updates"])

    def train(self, batch: GroupBatch, learner_version: int, env_steps: int) -> dict[str, float]:
        cfg, sar = self.cfg.learner, self.cfg.algorithm_options
        self.set_learning_rate(env_steps)
        n = batch.num_steps
        success = batch.outcomes[: batch.num_groups].reshape(-1)  # episode group * G + member
        episodes = batch.episodes[:n]
        weights, labels = credit_weights(
            batch.recon_errors[:n], episodes, success, sar.flow_sar_temperature, sar.flow_sar_w_min, sar.flow_sar_w_max
        )
        actions, times, noise, v_old = batch.actions[:n], batch.flow_times[:n], batch.flow_noise[:n], batch.v_old[:n]
        x_t = (1.0 - times[:, None]) * actions + times[:, None] * noise
        target = noise - actions  # u: the path's velocity
        obs = {key: o[:n] for key, o in batch.obs.items()}
        num_episodes = success.shape[0]
        self.sums = sums = {}  # apply_gradients counts skipped steps in it too
        for _ in range(cfg.num_epochs):
            for idx in torch.randperm(n, device=actions.device).chunk(cfg.num_batches_per_epoch):
                v_theta = self.model.flow_head.velocity(
                    x_t[idx], times[idx], self.model.policy_features({key: o[idx] for key, o in obs.items()})
                )
                # A minibatch holds a share of every episode's steps: its episode count scales with that share, so
                # the minibatch losses average to the whole batch's.
                out = flow_sar_loss(
                    v_theta,
                    v_old[idx],
                    target[idx],
                    times[idx],
                    weights[idx],
                    labels[idx],
                    num_episodes * len(idx) / n,
                    sar.flow_sar_beta,
                    sar.flow_sar_energy_type,
                    sar.flow_sar_loss_variant,
                    sar.flow_sar_kl_coeff,
                )
                self.optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + self.apply_gradients()
                for name, value in out._asdict().items():
                    sums[name] = sums.get(name, 0.0) + float(value.detach())
        self.model.update_normalizers(obs, self.group.sum)
        self.updates += 1
        decay = ema_decay(
            sar.flow_sar_ema_schedule,
            self.updates,
            sar.flow_sar_ema_beta,
            sar.flow_sar_ema_eta_rate,
            sar.flow_sar_ema_eta_max,
        )
        ema_update_(self.reference, self.model, decay)
        for ref, current in zip(self.reference.buffers(), self.model.buffers()):
            ref.copy_(current)  # the observation statistics: the reference sees inputs as the policy does
        num_updates = cfg.num_epochs * cfg.num_batches_per_epoch
        shared = ("grad_norm", "nonfinite_steps")  # named as PPO's
        stats = {name if name in shared else f"flow_sar_{name}": v / num_updates for name, v in sums.items()}
        stats.update(
            flow_sar_weight_mean=float(weights.mean()),
            flow_sar_success_ratio=float(success.mean()),
            flow_sar_recon_error=float(batch.recon_errors[:n].mean()),
            flow_sar_energy_type=float(sar.flow_sar_energy_type == "sde"),
            flow_sar_loss_variant=float(sar.flow_sar_loss_variant == "softplus_kl"),
            flow_sar_ema_decay=decay,
            learning_rate=self.optimizer.param_groups[0]["lr"],
        )
        return stats
