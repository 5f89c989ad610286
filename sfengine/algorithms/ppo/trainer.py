"""One PPO update on a training batch, readable top to bottom: advantages, then epochs of minibatch steps.

With a critic (``--advantage=gae|vtrace``) the batch is ``B`` whole trajectories of ``T`` steps (entry ``T`` is the
bootstrap observation). Without one (``rloo|grpo``) it is a ``GroupBatch``: the steps of whole groups of episodes
and each episode's outcome. Both end in the same minibatch step and the same policy surrogate (``--clip_mode``).
Plumbing (where the batch came from, where the weights go) lives in the learner worker, the math in
``sfengine.algorithms.advantages``, ``.group_advantages`` and ``ppo.loss``.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor

from sfengine.algorithms.advantages import gae, vtrace
from sfengine.algorithms.group_advantages import GROUP_ADVANTAGES, episode_step_weights
from sfengine.algorithms.ppo.loss import PPOLoss, explained_variance, kl_penalty, normalize_advantages, ppo_loss
from sfengine.algorithms.ppo.options import PPOOptions, SurrogateParams
from sfengine.config import Config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.engine.distributed import LearnerGroup
from sfengine.learning.group_batcher import GroupBatch
from sfengine.learning.trainer import StepStats, TorchStep, Trainer
from sfengine.models.actor_critic import ActorCritic
from sfengine.numpy_backend.step import NumpyStep, choose_learner_backend


class PPOTrainer(Trainer):
    def __init__(self, model: ActorCritic, cfg: Config, group: LearnerGroup | None = None):
        super().__init__(model, cfg, group)
        # One trajectory entry per decision: with --action_chunk=K, K env steps (each discounted by gamma) apart.
        self.gamma = cfg.learner.gamma**cfg.model.action_chunk
        self.options = options = cfg.options_group(PPOOptions.group)
        self.clip_mode = options.clip_mode
        mode_params = {name: getattr(options, name) for name in SurrogateParams._fields if name != "clip_ratio"}
        self.surrogate_params = SurrogateParams(clip_ratio=options.ppo_clip_ratio, **mode_params)
        # --kl_coeff: the policy as the run started (its --init_from clone), frozen with its own observation
        # statistics, so it stays the function it was; a resumed run takes it from the checkpoint (load_state_dict).
        self.kl_reference = copy.deepcopy(model).requires_grad_(False) if options.kl_coeff > 0 else None
        # --learner_backend: who takes the minibatch steps. numpy: the same step without torch's per-op overhead
        # (sfengine.numpy_backend.step), which holds the weights while it runs and gives them back at end().
        numpy = choose_learner_backend(cfg, model) == "numpy"
        self.backend = NumpyStep(model, self.optimizer, cfg, self.group) if numpy else TorchStep(self.torch_step)

    def state_dict(self) -> dict:
        """What a checkpoint keeps beside the model and the optimiser: the KL penalty's reference, if any."""
        if self.kl_reference is None:
            return {}
        return {"kl_reference": {k: t.detach().cpu() for k, t in self.kl_reference.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        if self.kl_reference is not None and "kl_reference" in state:
            self.kl_reference.load_state_dict(state["kl_reference"])

    def train(self, batch: TrajectoryBuffers | GroupBatch, learner_version: int, env_steps: int) -> dict[str, float]:
        """Run ``num_epochs`` x ``num_batches_per_epoch`` optimiser steps on ``batch``; return the stats."""
        self.set_learning_rate(env_steps)
        self.sums, self.ratio_range = {}, [math.inf, -math.inf]
        self.train_policy = True
        self.steps_taken, self.stopped_at_target_kl = 0, False
        if isinstance(batch, GroupBatch):
            stats = self._train_on_groups(batch)
        else:
            # Critic warm-up: the learner's version counts the batches trained (on resume too). The policy's
            # parameters get no gradient, so Adam leaves them bit-identical, and the observation statistics wait.
            warming_up = learner_version < self.options.critic_warmup_batches
            for param in self.model.policy_parameters():
                param.requires_grad_(not warming_up)
            self.train_policy = not warming_up
            stats = self._train_with_critic(batch, update_normalizers=not warming_up)
            stats["critic_warmup"] = float(warming_up)
        stats.update({name: total / max(self.steps_taken, 1) for name, total in self.sums.items()})
        stats["target_kl_stop"] = float(self.stopped_at_target_kl)
        stats.update(
            ratio_min=self.ratio_range[0],
            ratio_max=self.ratio_range[1],
            learning_rate=self.optimizer.param_groups[0]["lr"],
        )
        return stats

    def _train_with_critic(self, batch: TrajectoryBuffers, update_normalizers: bool = True) -> dict[str, float]:
        """GAE or V-trace advantages from the critic, over ``B`` trajectories of ``T`` steps."""
        cfg = self.cfg.learner
        num_traj, horizon = batch.rewards.shape[0], batch.rewards.shape[1] - 1
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

        with_vtrace = self.options.advantage == "vtrace"
        # Targets that follow the critic as it learns: V-trace always, GAE with --recompute_advantages.
        per_epoch_targets = with_vtrace or self.options.recompute_advantages
        for epoch in range(cfg.num_epochs):
            if self.stopped_at_target_kl:
                break
            if per_epoch_targets:
                self._end_backend_steps()  # the targets come from the torch model
            if with_vtrace:
                advantages, returns = self._vtrace_targets(batch, rewards, episode_ends)
            elif per_epoch_targets:
                # The current critic, not the acting one: in asynchronous runs the values the acting policy wrote are
                # several versions old, and within an update the critic moves every epoch.
                values = self._current_values(batch)
                advantages, returns = gae(rewards, values, *episode_ends, self.gamma, cfg.gae_lambda)
            elif epoch == 0:
                advantages, returns = gae(rewards, batch.values, *episode_ends, self.gamma, cfg.gae_lambda)
            if epoch == 0:
                # The return statistics include this batch's targets before the critic fits them (a first success
                # after a run of failures is then not thousands of stds away); the value head is rescaled with
                # them, so no prediction moves.
                self.model.update_return_normalizer(returns, self.group.sum)
            # The critic's loss and its clip are in normalised return units (plain units without normalisation).
            # The statistics are fixed for the rest of the update, so the anchors and targets convert once.
            if epoch == 0 or per_epoch_targets:
                normalized = self.model.normalized_values
                value_anchors = (normalized(old_values), normalized(returns.reshape(-1)))
            # One shuffle per epoch; the minibatches are its consecutive slices. The small per-sample tensors are
            # gathered once per epoch (the slices are then views), the observations, which may be images, per
            # minibatch.
            order = torch.randperm(num_traj * horizon)
            shuffled = (flat_actions[order], old_log_probs[order], advantages.reshape(-1)[order])
            shuffled_anchors = tuple(anchor[order] for anchor in value_anchors)
            size = -(-len(order) // cfg.num_batches_per_epoch)  # as order.chunk() splits it
            for start in range(0, len(order), size):
                if self.stopped_at_target_kl:
                    break
                part = slice(start, start + size)
                actions, minibatch_old_log_probs, minibatch_advantages = (t[part] for t in shuffled)
                if self.options.normalize_advantage:
                    minibatch_advantages = normalize_advantages(minibatch_advantages)
                self._step(
                    {key: obs[order[part]] for key, obs in flat_obs.items()},
                    actions,
                    minibatch_old_log_probs,
                    minibatch_advantages,
                    tuple(anchor[part] for anchor in shuffled_anchors),
                )

        self._end_backend_steps()
        # The observation statistics move only after the update: during it the model sees its inputs as the acting
        # policy saw them, so an on-policy update starts at ratio 1 and its value anchors are the critic's own.
        if update_normalizers:
            self.model.update_normalizers({key: obs[:, steps] for key, obs in batch.obs.items()}, self.group.sum)
        stats = {"value_mean": float(old_values.mean()), "advantage_mean": float(advantages.mean())}
        explained = explained_variance(old_values, returns.reshape(-1))
        # Undefined while every return is the same (a sparse reward not yet earned, as in LIBERO's first batches):
        # left out, not written as a NaN that TensorBoard's writer reports as if training had diverged.
        if not math.isnan(explained):
            stats["explained_variance"] = explained
        if self.model.return_normalizer is not None:
            return_stats = self.model.return_normalizer
            stats.update(return_mean=float(return_stats.stats.mean), return_std=float(return_stats.std()))
        return stats

    def _train_on_groups(self, batch: GroupBatch) -> dict[str, float]:
        """Critic-free: every step of episode i gets its group advantage A_i (``sfengine.algorithms.group_advantages``).
        The advantages are used as they are, not renormalised per minibatch: that would shift the zero advantage
        of a group with equal outcomes, and a group's own centring is the baseline."""
        cfg = self.cfg.learner
        n = batch.num_steps
        outcomes = batch.outcomes[: batch.num_groups]
        episode_advantages = GROUP_ADVANTAGES[self.options.advantage](outcomes)
        advantages = episode_advantages.reshape(-1)[batch.episodes[:n]]
        if self.options.group_loss_weighting == "episode":
            advantages = advantages * episode_step_weights(batch.episodes[:n])
        obs = {key: o[:n] for key, o in batch.obs.items()}
        actions, old_log_probs = batch.actions[:n], batch.log_probs[:n]
        for _ in range(cfg.num_epochs):
            for idx in torch.randperm(n, device=advantages.device).chunk(cfg.num_batches_per_epoch):
                if self.stopped_at_target_kl:
                    break
                self._step({key: o[idx] for key, o in obs.items()}, actions[idx], old_log_probs[idx], advantages[idx])
        self._end_backend_steps()
        self.model.update_normalizers(obs, self.group.sum)
        return {
            "advantage_abs_mean": float(episode_advantages.abs().mean()),
            "outcome_mean": float(outcomes.mean()),
        }

    def _step(
        self,
        obs: dict[str, Tensor],
        actions: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        value_anchors: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        """One optimiser step on a minibatch. ``value_anchors``: the acting critic's values and the value targets,
        both in the critic's normalised units (None without a critic). With --target_kl, a step whose approximate
        KL passed 1.5 x the target is the update's last."""
        if not self.backend.active:
            self.backend.begin(self.optimizer.param_groups[0]["lr"], self.train_policy)
        result = self.backend(obs, actions, old_log_probs, advantages, value_anchors)
        self._add_step_stats(result.sums(), result.diagnostics)
        if self.heartbeat is not None:
            self.heartbeat()  # the numpy backend's step too, which does not go through apply_gradients

    def torch_step(
        self,
        obs: dict[str, Tensor],
        actions: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        value_anchors: tuple[Tensor, Tensor] | None,
    ) -> StepStats:
        """The torch backend's minibatch step (``TorchStep``): losses, the KL penalty, backward, clipped Adam step."""
        log_probs, losses = self.minibatch_losses(obs, actions, old_log_probs, advantages, value_anchors)
        loss, extra, diagnostics = losses.loss, {}, None
        if self.kl_reference is not None:
            diagnostics = losses.diagnostics  # the surrogate's own: read before the penalty's gradient joins it
            with torch.no_grad():
                reference_log_probs, _ = self.kl_reference.log_prob_entropy(
                    self.kl_reference.policy_params(obs), actions
                )
            kl = kl_penalty(log_probs, reference_log_probs)
            loss = loss + self.options.kl_coeff * kl
            extra["kl_to_reference"] = float(kl.detach())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = self.apply_gradients()  # counts a skipped step in nonfinite_steps itself
        values = [float(getattr(losses, name).detach()) for name in ("policy_loss", "value_loss", "entropy")]
        return StepStats(float(loss.detach()), *values, grad_norm, diagnostics or losses.diagnostics, extra)

    def policy_outputs(self, obs: dict[str, Tensor], actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The model on a minibatch: log-probs of ``actions``, entropies, values in the critic's units (a pure
        function of tensors: the unit ``benchmarks.learner_backend`` hands to ``torch.compile``)."""
        params, values = self.model(obs, in_critic_units=True)
        log_probs, entropy = self.model.log_prob_entropy(params, actions)
        return log_probs, entropy, values

    def minibatch_losses(
        self,
        obs: dict[str, Tensor],
        actions: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        value_anchors: tuple[Tensor, Tensor] | None,
    ) -> tuple[Tensor, PPOLoss]:
        """The model's forward pass and PPO's losses on a minibatch: the new log-probs and the losses."""
        cfg = self.cfg.learner
        log_probs, entropy, values = self.policy_outputs(obs, actions)
        value_terms = (None, None, None) if value_anchors is None else (values, *value_anchors)
        losses = ppo_loss(
            log_probs,
            old_log_probs,
            advantages,
            *value_terms,
            entropy,
            clip_ratio=self.options.ppo_clip_ratio,
            value_clip=self.options.ppo_clip_value or None,
            value_loss_coeff=self.options.value_loss_coeff,
            entropy_coeff=cfg.entropy_coeff,
            clip_mode=self.clip_mode,
            surrogate_params=self.surrogate_params,
        )
        return log_probs, losses

    def _add_step_stats(self, values: dict[str, float], diagnostics: dict[str, float]) -> None:
        """Add one minibatch step's losses and diagnostics to the update's sums (``train`` averages them), and end
        the update at --target_kl."""
        self.steps_taken += 1
        target = self.options.target_kl
        if target > 0:
            # The ranks' mean, so that every rank ends its update at the same step (each step all-reduces).
            kl = self.group.sum(torch.tensor([diagnostics["approx_kl"]], device=self.group.device))
            self.stopped_at_target_kl = float(kl) / self.group.ranks.world_size > 1.5 * target
        sums = self.sums
        for name, value in values.items():
            sums[name] = sums.get(name, 0.0) + value
        diagnostics = dict(diagnostics)
        self.ratio_range[0] = min(self.ratio_range[0], diagnostics.pop("ratio_min"))
        self.ratio_range[1] = max(self.ratio_range[1], diagnostics.pop("ratio_max"))
        for name, value in diagnostics.items():
            sums[name] = sums.get(name, 0.0) + value

    def _end_backend_steps(self) -> None:
        """Put the backend's weights and Adam state back into the torch model before torch reads it."""
        self.backend.end()

    @torch.no_grad()
    def _current_values(self, batch: TrajectoryBuffers) -> Tensor:
        """The current critic's values, in return units, of all T + 1 entries of each trajectory: [B, T + 1]."""
        return self.model.values(self._every_entry(batch)).view(batch.values.shape)

    @staticmethod
    def _every_entry(batch: TrajectoryBuffers) -> dict[str, Tensor]:
        """The observations of all T + 1 entries of each trajectory, flattened: dict of [B * (T + 1), ...]."""
        return {key: o.flatten(0, 1) for key, o in batch.obs.items()}

    @torch.no_grad()
    def _vtrace_targets(
        self, batch: TrajectoryBuffers, rewards: Tensor, episode_ends: tuple[Tensor, Tensor, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """V-trace targets from the current policy and critic over all T + 1 entries of each trajectory."""
        num_traj, entries = batch.values.shape
        params, values = self.model(self._every_entry(batch))
        actions = batch.actions.reshape(num_traj * entries, *batch.actions.shape[2:])
        log_probs, _ = self.model.log_prob_entropy(params, actions)
        log_rhos = (log_probs.view(num_traj, entries) - batch.log_probs)[:, :-1]
        values = values.view(num_traj, entries)
        value_targets, pg_advantages = vtrace(
            rewards,
            values,
            *episode_ends,
            log_rhos,
            self.gamma,
            rho_clip=self.options.vtrace_rho,
            c_clip=self.options.vtrace_c,
        )
        return pg_advantages, value_targets
