"""TD3's update on the off-policy base: the critics learn the value of the target actor's smoothed action, the
actor the critics' mean Q of its own action, every ``--actor_delay`` critic steps (2), with its target following.

    target   V(s') = min_{M of E} Q'(s', clip(mu'(s') + clip(eps, -c, c)))     eps ~ N(0, --target_noise)
    actor    -mean_e Q_e(s, mu(s))

With ``--ibrl`` (a residual over a frozen base b) the target is the better of the two proposals,
V(s') = max(min_{M of E} Q'(s', smoothed mu'(s')), min_{M of E} Q'(s', b(s'))) with one draw of the M members,
and after every round the policy's ``chooser`` gets the critics' weights, so that it acts by the same rule.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from sfengine.algorithms.offpolicy.critics import soft_update_, subset_min
from sfengine.algorithms.offpolicy.replay import NStep
from sfengine.algorithms.offpolicy.trainer import OffPolicyTrainer
from sfengine.config import Config
from sfengine.engine.distributed import LearnerGroup

from .actor import DeterministicActor

SATURATED = 3.0  # |pre-tanh action| past which tanh's slope is under 1% of its slope at 0


class TD3Trainer(OffPolicyTrainer):
    def __init__(self, model: DeterministicActor, cfg: Config, group: LearnerGroup | None = None):
        super().__init__(model, cfg, group)
        # The target actor holds by reference what no target follows: a residual's frozen base (a copy would double
        # a large base's memory and its soft update), the CNNs (the target reads the online features) and
        # --ibrl's chooser. Its own weights are the rest, which checkpoints keep.
        shared = {name: module for name, module in model.named_children() if name in ("base", "chooser")}
        shared |= {f"encoders.{key}": model.encoders[key] for key in model.image_keys}
        shared = {name: module for name, module in shared.items() if module is not None}
        self.target_shared = tuple(f"{name}." for name in shared)
        self.target_actor = copy.deepcopy(model, memo={id(module): module for module in shared.values()})
        held = {id(p) for module in shared.values() for p in module.parameters()}
        for param in self.target_actor.parameters():
            if id(param) not in held:  # the model's own (the CNNs learn) keep their flag
                param.requires_grad_(False)

    def target_value(self, next_obs: dict[str, Tensor], next_features: Tensor) -> Tensor:
        options = self.options
        # The target actor reads the features the critics read (the online normaliser's and CNNs').
        params = self.target_actor.policy_params(next_obs, next_features)
        target_actions = self.target_actor.action(params)
        smoothed = self.target_actor.noisy(target_actions, options.target_noise, options.target_noise_clip)
        if options.ibrl:
            base = self.target_actor.split(params)[1]
            members = lambda q: subset_min(q, options.critic_subset, self.generator)  # noqa: E731
            value, take_base = self.target_actor.choose(next_features, smoothed, base, self.target_critics, members)[1:]
            self.target_stats["target_base_share"] = take_base.float().mean()
            return value
        next_q = self.target_critics(next_features, self.model.unit_actions(smoothed))
        return subset_min(next_q, options.critic_subset, self.generator)

    def train(self, batch, learner_version: int, env_steps: int) -> dict[str, float]:
        stats = super().train(batch, learner_version, env_steps)
        chooser = getattr(self.model, "chooser", None)
        if chooser is not None:  # --ibrl: the policy acts by the critics it will publish with
            with torch.no_grad():
                for mine, theirs in zip(chooser.parameters(), self.critics.parameters(), strict=True):
                    mine.copy_(theirs)
        return stats

    def actor_step(self, b: NStep, features: Tensor) -> dict[str, Tensor]:
        params = self.model.policy_params(b.obs, features)
        actions = self.model.action(params)
        q = self.actor_q(features, actions)
        extra, stats = self.actor_terms(b, params, actions, q)
        u = self.model.pre_squash(params)
        stats["actor_saturated"] = (u.detach().abs() > SATURATED).float().mean()
        if self.options.squash_penalty > 0:
            extra = extra + self.options.squash_penalty * u.pow(2).mean()
        loss = -q.mean() + extra
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return stats | {"actor_loss": loss.detach(), "grad_norm": self.apply_gradients_on_device()[0]}

    def after_actor_step(self) -> None:
        soft_update_(self.target_actor, self.model, self.options.tau)

    def extra_state(self) -> dict:
        own = self.target_actor.state_dict().items()
        return {"target_actor": {name: t.detach().cpu() for name, t in own if not name.startswith(self.target_shared)}}

    def load_extra_state(self, state: dict) -> None:
        # A checkpoint written before the target shared these modules holds copies of them: the model's are the ones.
        own = {name: t for name, t in state["target_actor"].items() if not name.startswith(self.target_shared)}
        missing, unexpected = self.target_actor.load_state_dict(own, strict=False)
        if unexpected or [name for name in missing if not name.startswith(self.target_shared)]:
            raise RuntimeError(
                f"the checkpoint's TD3 target actor does not fit: missing {missing}, unexpected {unexpected}"
            )
