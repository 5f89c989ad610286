"""SAC's policy: a Gaussian squashed by tanh into the action box, with its log-density corrected for the squash.

    u ~ N(mean, std),  a = center + half_range * tanh(u)
    log pi(a) = log N(u) - sum_i log(half_range_i (1 - tanh(u_i)^2))

It is the engine's ``ActorCritic`` (its encoders, normalisers and heads; no value head: the critics are the
trainer's) with its own ``sample``, ``mode`` and ``log_prob_entropy``, so the inference workers act with exactly this
distribution (a model that overrides them acts in torch). ``sample`` is differentiable in the mean and the log-std
(the reparameterisation SAC's actor loss needs) when it runs outside ``torch.inference_mode``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sfengine.algorithms.offpolicy.residual import ResidualPolicy
from sfengine.config import Config, ConfigError
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic, PolicyOutput
from sfengine.models.distributions import gaussian_entropy, gaussian_log_prob

EDGE = 1e-6  # how close to the box's edge an action is taken back through atanh


def log_squash_slope(u: Tensor) -> Tensor:
    """log(1 - tanh(u)^2), written as 2 (log 2 - u - softplus(-2u)) so it stays finite for large |u|."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


class SquashedGaussianActor(ActorCritic):
    image_layer_norm = True  # the CNNs are the critics' encoders: bounded features (see critic_features)

    def __init__(self, obs_spec: ObsSpec, action_spec: ActionSpec, cfg, critic: bool = False):
        if action_spec.discrete:
            raise ConfigError("--algo=sac acts in a continuous action box; this env's actions are discrete")
        low, high = torch.tensor(action_spec.low), torch.tensor(action_spec.high)
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ConfigError(
                "--algo=sac squashes its actions into the env's action box, and this env's box is unbounded: give "
                "the env finite action bounds (a gymnasium.wrappers.RescaleAction, for example)"
            )
        super().__init__(obs_spec, action_spec, cfg, critic=False)
        self.register_buffer("action_center", (high + low) / 2)
        self.register_buffer("action_half_range", (high - low) / 2)
        # 1 until the learner's first gradient step under --initial_actions=uniform: the agent then acts uniformly
        # at random. A buffer, so it reaches the acting processes with the weights and stays 0 in a checkpoint.
        self.register_buffer("acts_uniformly", torch.zeros(()))

    @classmethod
    def build(cls, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> SquashedGaussianActor:
        return cls(obs_spec, action_spec, cfg.model).with_initial_actions(cfg)

    def with_initial_actions(self, cfg: Config) -> SquashedGaussianActor:
        """Set the agent to act uniformly at random until learning starts, where --initial_actions asks for it and
        the run starts from no trained weights (--init_from brings some)."""
        self.acts_uniformly.fill_(cfg.algorithm_options.initial_actions == "uniform" and not cfg.run.init_from)
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A checkpoint written before the flag was kept holds a trained policy, which acts as itself.
        state_dict.setdefault(prefix + "acts_uniformly", torch.zeros(()))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def act(self, obs: dict[str, Tensor], deterministic: bool = False) -> PolicyOutput:
        out = super().act(obs, deterministic)
        if deterministic or not self.acts_uniformly:
            return out
        actions = self.action_center + self.action_half_range * (2 * torch.rand_like(out.actions) - 1)
        log_density = -(2 * self.action_half_range).log().sum().expand(out.log_probs.shape)
        return PolicyOutput(actions, log_density, out.values)

    def to_unit(self, actions: Tensor) -> Tensor:
        """Actions in the policy's box -> [-1, 1]."""
        return (actions - self.action_center) / self.action_half_range

    # What the critics read: the env's actions in [-1, 1], and the observation's normalised vector input beside the
    # CNN features of its images. The CNNs learn from the critics' loss alone (DrQ's and SAC-AE's rule: the actor's
    # gradient through them makes image RL unstable), and the actor reads their features as the critics computed
    # them. (A residual policy's own box is its correction's; it reads the vector as its frozen base normalises it.)

    def unit_actions(self, actions: Tensor) -> Tensor:
        return self.to_unit(actions)

    def critic_features(self, obs: dict[str, Tensor]) -> Tensor:
        """[N, critic_feature_dim]: the normalised vector input, then each image key's CNN features."""
        inputs = self._inputs(obs)
        parts = [inputs[self.vector_name]] if self.vector_keys else []
        parts += [self.encoders[key](inputs[key]) for key in self.image_keys]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    @property
    def critic_feature_dim(self) -> int:
        return self.vector_dim + sum(self.encoders[key].out_dim for key in self.image_keys)

    def image_parameters(self) -> list[nn.Parameter]:
        """The CNN encoders' weights: trained with the critics, by their optimiser."""
        return [param for key in self.image_keys for param in self.encoders[key].parameters()]

    def policy_params(self, obs: dict[str, Tensor], features: Tensor | None = None) -> Tensor:
        """The policy's parameters [N, P] for ``obs``, from its ``critic_features`` where they are given (the
        learner's, computed once for the critics and the actor; detached, so the actor's loss leaves the CNNs
        alone). Without images this is the model's own forward pass."""
        if features is None:
            return super().policy_params(obs)
        parts = [self.encoders[self.vector_name](features[:, : self.vector_dim])] if self.vector_keys else []
        if self.image_keys:
            parts.append(features[:, self.vector_dim :])
        return self._policy_params(parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1))

    def _squash(self, u: Tensor) -> tuple[Tensor, Tensor]:
        """The action for pre-squash ``u`` and the log-density correction to subtract."""
        correction = (log_squash_slope(u) + self.action_half_range.log()).sum(-1)
        return self.action_center + self.action_half_range * torch.tanh(u), correction

    def sample(self, params: Tensor) -> tuple[Tensor, Tensor]:
        mean, log_std = self._mean_log_std(params)
        noise = torch.randn_like(mean)
        actions, correction = self._squash(mean + noise * log_std.exp())
        return actions, gaussian_log_prob(noise, log_std) - correction

    def mode(self, params: Tensor) -> tuple[Tensor, Tensor]:
        mean, log_std = self._mean_log_std(params)
        actions, correction = self._squash(mean)
        return actions, gaussian_log_prob(0.0, log_std) - correction

    def log_prob_entropy(self, params: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-density of given actions; the entropy is the unsquashed Gaussian's (a bound, for diagnostics)."""
        mean, log_std = self._mean_log_std(params)
        u = torch.atanh(self.to_unit(actions).clamp(-1 + EDGE, 1 - EDGE))
        _, correction = self._squash(u)
        return gaussian_log_prob((u - mean) / log_std.exp(), log_std) - correction, gaussian_entropy(log_std)


class ResidualSAC(ResidualPolicy, SquashedGaussianActor):
    """A squashed-Gaussian correction (``--algo=sac``); its log-density is the correction's."""

    def __init__(self, obs_spec, action_spec, cfg, base, scale, base_action):
        SquashedGaussianActor.__init__(self, obs_spec, self.residual_spec(action_spec, scale), cfg)
        self._init_residual(obs_spec, action_spec, cfg, base, scale, base_action)

    @classmethod
    def over(cls, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec, base: ActorCritic) -> ResidualSAC:
        options = cfg.algorithm_options
        return cls(obs_spec, action_spec, cfg.model, base, options.residual_scale, options.residual_base_action)

    def sample(self, params: Tensor) -> tuple[Tensor, Tensor]:
        own, base = self.split(params)
        residual, log_probs = SquashedGaussianActor.sample(self, own)
        return self.inside_box(base + residual), log_probs

    def mode(self, params: Tensor) -> tuple[Tensor, Tensor]:
        own, base = self.split(params)
        residual, log_probs = SquashedGaussianActor.mode(self, own)
        return self.inside_box(base + residual), log_probs

    def log_prob_entropy(self, params: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        own, base = self.split(params)
        return SquashedGaussianActor.log_prob_entropy(self, own, actions - base)
