"""SAC's update: every training batch of new trajectories goes into the replay, then the learner takes the gradient
steps it owes (``--replay_ratio`` x the batch's env steps, the fraction carried over) on minibatches drawn from the
replay. A step: the critics to the n-step soft target, every ``--actor_delay`` steps the actor and the temperature,
then the target critics by Polyak averaging.

    target   y = R_n + gamma^n [min_{M of E} Q'(s', a') - alpha log pi(a'|s')],  a' ~ pi(s')   (0 past a termination)
    critics  mean over members of (Q_e(s, a) - y)^2
    actor    alpha log pi(a|s) - mean_e Q_e(s, a),  a ~ pi(s) reparameterised
    alpha    -log alpha (log pi(a|s) + target entropy)

The actor is the run's model (``SquashedGaussianActor``), trained with the base ``Trainer``'s optimiser; the critics,
their targets, the temperature and the replay are this trainer's, and its ``state_dict`` holds them (the replay only
with ``--save_replay``).
"""

from __future__ import annotations

import copy
import math

import torch

from sfengine.algorithms.offpolicy.critics import CriticEnsemble, soft_update_, subset_min
from sfengine.algorithms.offpolicy.replay import NStep, Replay
from sfengine.config import Config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.engine.distributed import LearnerGroup
from sfengine.learning.trainer import Trainer

from .actor import SquashedGaussianActor


class SACTrainer(Trainer):
    def __init__(self, model: SquashedGaussianActor, cfg: Config, group: LearnerGroup | None = None):
        super().__init__(model, cfg, group)
        self.options = options = cfg.algorithm_options
        self.device = next(model.parameters()).device
        action_dim = model.action_spec.dim
        self.critics = CriticEnsemble(
            options.num_critics,
            model.vector_dim + action_dim,
            options.critic_hidden_sizes,
            options.critic_layer_norm,
        ).to(self.device)
        self.group.broadcast_model(self.critics)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.critic_optimizer = torch.optim.Adam(self.critics.parameters(), lr=options.critic_learning_rate)
        self.log_alpha = torch.tensor(math.log(options.init_temperature), device=self.device, requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=options.critic_learning_rate)
        self.target_entropy = options.target_entropy or -float(action_dim)
        self.gamma = cfg.learner.gamma
        self.replay = Replay(options.replay_size, cfg.sampler.rollout, model.obs_spec, model.action_spec)
        self.generator = torch.Generator().manual_seed(cfg.env.seed * 7919 + 17 + group_rank(self.group))
        self.owed = 0.0  # gradient steps owed, carried over between batches
        self.critic_steps = 0
        self.env_steps_seen = 0

    # ---------------------------------------------------------------- one round

    def train(self, batch: TrajectoryBuffers, learner_version: int, env_steps: int) -> dict[str, float]:
        lrn = self.cfg.learner
        rewards = batch.rewards[:, :-1] * lrn.reward_scale
        if lrn.reward_clip > 0:
            rewards = rewards.clamp(-lrn.reward_clip, lrn.reward_clip)
        self.replay.insert(batch, rewards)
        new_steps = batch.sampled_env_steps()
        self.env_steps_seen += new_steps
        self.model.update_normalizers(
            {key: obs[:, :-1].flatten(0, 1) for key, obs in batch.obs.items()}, self.group.sum
        )
        stats = {"replay_fill": self.replay.size / self.replay.capacity}
        if self.replay.inserted_steps < self.options.learning_starts:
            return stats | {"gradient_steps": 0.0}
        self.owed += self.options.replay_ratio * new_steps
        steps = int(self.owed)
        self.owed -= steps
        sums: dict[str, float] = {}
        for _ in range(steps):
            for name, value in self.step().items():
                sums[name] = sums.get(name, 0.0) + value
        counts = {"critic": steps, "actor": max(1, sums.pop("actor_steps", 0.0))}
        for name, value in sums.items():
            stats[name] = value / (counts["actor"] if name in ACTOR_STATS else max(1, counts["critic"]))
        stats["gradient_steps"] = float(steps)
        stats["temperature"] = float(self.log_alpha.detach().exp())
        return stats

    # ---------------------------------------------------------------- one gradient step

    def step(self) -> dict[str, float]:
        minibatch = self._sample()
        stats = self._critic_step(minibatch)
        self.critic_steps += 1
        if self.critic_steps % self.options.actor_delay == 0:
            stats |= self._actor_step(minibatch)
            stats["actor_steps"] = 1.0
        soft_update_(self.target_critics, self.critics, self.options.tau)
        return stats

    def _sample(self) -> NStep:
        sampled = self.replay.sample(self.cfg.learner.batch_size, self.options.n_step, self.gamma, self.generator)
        if self.device.type == "cpu":
            return sampled
        move = lambda x: {k: v.to(self.device, non_blocking=True) for k, v in x.items()}  # noqa: E731
        return NStep(
            move(sampled.obs),
            sampled.actions.to(self.device),
            sampled.returns.to(self.device),
            move(sampled.next_obs),
            sampled.discounts.to(self.device),
            sampled.steps.to(self.device),
        )

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model._inputs(obs)[self.model.vector_name]

    def _critic_step(self, b: NStep) -> dict[str, float]:
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_params = self.model.policy_params(b.next_obs)
            next_actions, next_log_probs = self.model.sample(next_params)
            next_features = self._features(b.next_obs)
            next_q = self.target_critics(next_features, self.model.to_unit(next_actions))
            soft_value = subset_min(next_q, self.options.critic_subset, self.generator) - alpha * next_log_probs
            target = b.returns + b.discounts * soft_value
        q = self.critics(self._features(b.obs), self.model.to_unit(b.actions))
        td = q - target
        loss = td.pow(2).mean(1).sum()  # each member's own mean squared error
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.group.average_gradients(self.critics)
        norm = torch.nn.utils.clip_grad_norm_(self.critics.parameters(), self._max_norm())
        if math.isfinite(float(norm)):
            self.critic_optimizer.step()
        return {
            "critic_loss": float(loss.detach()) / self.critics.members,
            "q_mean": float(q.detach().mean()),
            "td_error": float(td.detach().abs().mean()),
            "target_mean": float(target.mean()),
            "critic_grad_norm": float(norm),
        }

    def _actor_step(self, b: NStep) -> dict[str, float]:
        self.set_learning_rate(self.env_steps_seen)
        params = self.model.policy_params(b.obs)
        actions, log_probs = self.model.sample(params)
        self.critics.requires_grad_(False)
        q = self.critics(self._features(b.obs).detach(), self.model.to_unit(actions)).mean(0)
        self.critics.requires_grad_(True)
        alpha = self.log_alpha.detach().exp()
        loss = (alpha * log_probs - q).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = self.apply_gradients()
        stats = {
            "actor_loss": float(loss.detach()),
            "entropy": float(-log_probs.detach().mean()),
            "grad_norm": grad_norm,
        }
        if self.options.learn_temperature:
            alpha_loss = -(self.log_alpha * (log_probs.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            if self.group.distributed:
                self.log_alpha.grad.copy_(self.group.sum(self.log_alpha.grad.clone()) / self.group.ranks.world_size)
            self.alpha_optimizer.step()
        return stats

    def _max_norm(self) -> float:
        return self.cfg.learner.max_grad_norm if self.cfg.learner.max_grad_norm > 0 else math.inf

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict:
        state = {
            "critics": self.critics.state_dict(),
            "target_critics": self.target_critics.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "log_alpha": self.log_alpha.detach().cpu(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
            "critic_steps": self.critic_steps,
            "owed": self.owed,
            "env_steps_seen": self.env_steps_seen,
            "generator": self.generator.get_state(),  # the replay's draws and the target subsets go on as they were
        }
        if self.options.save_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.critics.load_state_dict(state["critics"])
        self.target_critics.load_state_dict(state["target_critics"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.critic_steps = int(state["critic_steps"])
        self.owed = float(state["owed"])
        self.env_steps_seen = int(state["env_steps_seen"])
        self.generator.set_state(state["generator"])
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])


ACTOR_STATS = ("actor_loss", "entropy", "grad_norm")


def group_rank(group: LearnerGroup) -> int:
    return group.ranks.rank
