"""One PPO update on a training batch, readable top to bottom: targets, then epochs of minibatch steps.

The batch is ``B`` whole trajectories of ``T`` steps (entry ``T`` is the bootstrap observation). Plumbing
(where the batch came from, where the weights go) lives in the learner worker, the math in ``sfengine.algo``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sfengine.algo import explained_variance, gae, normalize_advantages, ppo_loss, vtrace
from sfengine.buffers import TrajectoryBuffers
from sfengine.config import Config
from sfengine.distributed import LearnerGroup, RankInfo
from sfengine.models.actor_critic import ActorCritic


class PPOTrainer:
    def __init__(self, model: ActorCritic, cfg: Config, group: LearnerGroup | None = None):
        self.model, self.cfg = model, cfg
        self.group = group or LearnerGroup(RankInfo(), torch.device("cpu"))  # the ranks, in a multi-rank run
        self.optimizer = torch.optim.Adam(
            model.parameters(), lr=cfg.learner.learning_rate, eps=cfg.learner.adam_eps, fused=True
        )

    def learning_rate(self, env_steps: int) -> float:
        lr = self.cfg.learner.learning_rate
        if self.cfg.learner.lr_schedule == "linear":
            lr *= max(0.0, 1.0 - env_steps / self.cfg.run.train_for_env_steps)
        return lr

    def train(self, batch: TrajectoryBuffers, learner_version: int, env_steps: int) -> dict[str, float]:
        """Run ``num_epochs`` x ``num_batches_per_epoch`` optimiser steps on ``batch``; return the stats."""
        cfg = self.cfg.learner
        num_traj, horizon = batch.rewards.shape[0], batch.rewards.shape[1] - 1
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(env_steps)

        steps = slice(0, horizon)
        rewards = batch.rewards[:, steps] * cfg.reward_scale
        if cfg.reward_clip > 0:
            rewards = rewards.clamp(-cfg.reward_clip, cfg.reward_clip)
        episode_ends = (batch.terminated[:, steps], batch.truncated[:, steps], batch.truncation_values[:, steps])

        # Flat views of the T real steps: sample i = (trajectory i // T, step i % T).
        flat_obs = {key: obs[:, steps].reshape(num_traj * horizon, *obs.shape[2:]) for key, obs in batch.obs.items()}
        flat_actions = batch.actions[:, steps].reshape(num_traj * horizon, *batch.actions.shape[2:])
        old_log_probs = batch.log_probs[:, steps].reshape(-1)
        old_values = batch.values[:, steps].reshape(-1)

        if not cfg.with_vtrace:
            advantages, returns = gae(rewards, batch.values, *episode_ends, cfg.gamma, cfg.gae_lambda)

        sums: dict[str, float] = {}
        num_minibatches = cfg.num_batches_per_epoch
        # The critic's loss and its clip are in normalised return units (plain units without normalisation).
        normalized = self.model.normalized_values
        for epoch in range(cfg.num_epochs):
            if cfg.with_vtrace:
                advantages, returns = self._vtrace_targets(batch, rewards, episode_ends)
            if epoch == 0:
                # The return statistics include this batch's targets before the critic fits them (a first success
                # after a run of failures is then not thousands of stds away); the value head is rescaled with
                # them, so no prediction moves.
                self.model.update_return_normalizer(returns, self.group.sum)
            flat_advantages, flat_returns = advantages.reshape(-1), returns.reshape(-1)
            order = torch.randperm(num_traj * horizon)
            for idx in order.chunk(num_minibatches):
                params, values = self.model({key: obs[idx] for key, obs in flat_obs.items()})
                log_probs, entropy = self.model.log_prob_entropy(params, flat_actions[idx])
                minibatch_advantages = flat_advantages[idx]
                if cfg.normalize_advantage:
                    minibatch_advantages = normalize_advantages(minibatch_advantages)
                losses = ppo_loss(
                    log_probs,
                    old_log_probs[idx],
                    minibatch_advantages,
                    normalized(values),
                    normalized(old_values[idx]),
                    normalized(flat_returns[idx]),
                    entropy,
                    clip_ratio=cfg.ppo_clip_ratio,
                    value_clip=cfg.ppo_clip_value or None,
                    value_loss_coeff=cfg.value_loss_coeff,
                    entropy_coeff=cfg.entropy_coeff,
                )
                self.optimizer.zero_grad(set_to_none=True)
                losses.loss.backward()
                self.group.average_gradients(self.model)
                grad_norm = self._clip_gradients()
                self.optimizer.step()
                for name, value in losses._asdict().items():
                    sums[name] = sums.get(name, 0.0) + float(value.detach())
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm

        # The observation statistics move only after the update: during it the model sees its inputs as the acting
        # policy saw them, so an on-policy update starts at ratio 1 and its value anchors are the critic's own.
        self.model.update_normalizers({key: obs[:, steps] for key, obs in batch.obs.items()}, self.group.sum)
        num_updates = cfg.num_epochs * num_minibatches
        stats = {name: total / num_updates for name, total in sums.items()}
        lag = (learner_version - batch.versions[:, steps]).float()
        stats.update(
            policy_lag_mean=float(lag.mean()),
            policy_lag_max=float(lag.max()),
            explained_variance=explained_variance(old_values, returns.reshape(-1)),
            learning_rate=self.optimizer.param_groups[0]["lr"],
            value_mean=float(old_values.mean()),
            advantage_mean=float(advantages.mean()),
        )
        if self.model.return_normalizer is not None:
            return_stats = self.model.return_normalizer
            stats.update(return_mean=float(return_stats.stats.mean), return_std=float(return_stats.std()))
        return stats

    def _clip_gradients(self) -> float:
        max_norm = self.cfg.learner.max_grad_norm
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
        return float(norm)

    @torch.no_grad()
    def _vtrace_targets(
        self, batch: TrajectoryBuffers, rewards: Tensor, episode_ends: tuple[Tensor, Tensor, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """V-trace targets from the current policy and critic over all T + 1 entries of each trajectory."""
        cfg = self.cfg.learner
        num_traj, entries = batch.values.shape
        obs = {key: o.reshape(num_traj * entries, *o.shape[2:]) for key, o in batch.obs.items()}
        params, values = self.model(obs)
        actions = batch.actions.reshape(num_traj * entries, *batch.actions.shape[2:])
        log_probs, _ = self.model.log_prob_entropy(params, actions)
        log_rhos = (log_probs.view(num_traj, entries) - batch.log_probs)[:, :-1]
        values = values.view(num_traj, entries)
        value_targets, pg_advantages = vtrace(
            rewards, values, *episode_ends, log_rhos, cfg.gamma, rho_clip=cfg.vtrace_rho, c_clip=cfg.vtrace_c
        )
        return pg_advantages, value_targets
