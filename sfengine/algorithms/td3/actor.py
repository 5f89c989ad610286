"""TD3's policy: a deterministic action squashed into the box, ``center + half_range * tanh(mu(s))``, acted with
Gaussian exploration noise (``--exploration_noise`` half-ranges, clipped to the box); evaluation and the update use
the noiseless action. No likelihood: the log-probs it reports are 0.

With ``--residual_over`` and ``--ibrl`` the policy carries a copy of the trainer's critics (``chooser``, published
with the weights) and acts as IBRL does: of the base's action and the corrected one, the one the critics' mean Q
values more.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sfengine.algorithms.offpolicy.critics import CriticEnsemble
from sfengine.algorithms.offpolicy.residual import ResidualPolicy
from sfengine.algorithms.sac.actor import SquashedGaussianActor
from sfengine.config import Config
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic, PolicyOutput


class DeterministicActor(SquashedGaussianActor):
    def __init__(self, obs_spec: ObsSpec, action_spec: ActionSpec, cfg, exploration_noise: float):
        super().__init__(obs_spec, action_spec, cfg)
        self.exploration_noise = exploration_noise

    @classmethod
    def build(cls, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> DeterministicActor:
        return cls(obs_spec, action_spec, cfg.model, cfg.algorithm_options.exploration_noise).with_initial_actions(cfg)

    def action(self, params: Tensor) -> Tensor:
        """The noiseless action (differentiable in the weights)."""
        mean, _ = self._mean_log_std(params)
        return self.action_center + self.action_half_range * torch.tanh(mean)

    def pre_squash(self, params: Tensor) -> Tensor:
        """The action before its tanh: past about 3 in a dimension the actor's gradient there all but vanishes."""
        return self._mean_log_std(params)[0]

    def noisy(self, actions: Tensor, std: float, clip: float | None = None) -> Tensor:
        """``actions`` plus Gaussian noise of ``std`` half-ranges (each draw clipped to +-``clip`` half-ranges),
        kept inside the box."""
        noise = torch.randn_like(actions) * std
        if clip is not None:
            noise = noise.clamp(-clip, clip)
        low, high = self.action_center - self.action_half_range, self.action_center + self.action_half_range
        return torch.maximum(torch.minimum(actions + noise * self.action_half_range, high), low)

    def sample(self, params: Tensor) -> tuple[Tensor, Tensor]:
        actions = self.noisy(self.action(params), self.exploration_noise)
        return actions, actions.new_zeros(actions.shape[0])

    def mode(self, params: Tensor) -> tuple[Tensor, Tensor]:
        actions = self.action(params)
        return actions, actions.new_zeros(actions.shape[0])


class ResidualTD3(ResidualPolicy, DeterministicActor):
    """A deterministic correction (``--algo=td3``), acted and smoothed with noise in half-ranges of its own bound."""

    def __init__(self, obs_spec, action_spec, cfg, base, scale, base_action, exploration_noise, chooser_options=None):
        DeterministicActor.__init__(self, obs_spec, self.residual_spec(action_spec, scale), cfg, exploration_noise)
        self._init_residual(obs_spec, action_spec, cfg, base, scale, base_action)
        # --ibrl: the critics' copy that picks between the base's action and the corrected one (never trained here).
        self.chooser = None
        if chooser_options is not None:
            width = self.critic_feature_dim + action_spec.dim
            self.chooser = CriticEnsemble.of_options(chooser_options, width).requires_grad_(False)

    @classmethod
    def over(cls, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec, base: ActorCritic) -> ResidualTD3:
        options = cfg.algorithm_options
        args = (options.residual_scale, options.residual_base_action, options.exploration_noise)
        return cls(obs_spec, action_spec, cfg.model, base, *args, options if options.ibrl else None)

    def action(self, params: Tensor) -> Tensor:
        own, base = self.split(params)
        return self.inside_box(base + DeterministicActor.action(self, own))

    def pre_squash(self, params: Tensor) -> Tensor:
        return self._mean_log_std(self.split(params)[0])[0]  # the correction's own

    def noisy(self, actions: Tensor, std: float, clip: float | None = None) -> Tensor:
        noise = torch.randn_like(actions) * std
        if clip is not None:
            noise = noise.clamp(-clip, clip)
        return self.inside_box(actions + noise * self.action_half_range)

    def act(self, obs: dict[str, Tensor], deterministic: bool = False) -> PolicyOutput:
        if self.chooser is None:
            return super().act(obs, deterministic)
        params, values = self(obs)
        actions = (self.mode if deterministic else self.sample)(params)[0]
        actions = self.choose(self.critic_features(obs), actions, self.split(params)[1], self.chooser)[0]
        return PolicyOutput(actions, values.new_zeros(values.shape[0]), values)

    def choose(self, features: Tensor, proposed: Tensor, base: Tensor, critics: CriticEnsemble, reduce=None):
        """IBRL's choice per row between the actor's ``proposed`` action and the ``base``'s: the one whose value
        (the ensemble's mean Q, or ``reduce`` of the members' [E, 2N] values) is larger. Returns the chosen actions,
        their values and whether the base was chosen, each per row."""
        n = proposed.shape[0]
        both = torch.cat([proposed, base])
        q = critics(features.repeat(2, 1), self.unit_actions(both))
        value = (q.mean(0) if reduce is None else reduce(q)).view(2, n)
        take_base = value[1] > value[0]
        return torch.where(take_base.unsqueeze(-1), base, proposed), value.max(0).values, take_base
