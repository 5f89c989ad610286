"""The actor-critic model: a CNN per image key and one MLP over all vector keys, concatenated, then a policy head
and a value head.

    obs["image"] (uint8 HxWxC)  --CNN------------------------+
    obs["proprio"] (float D1) --+                             +--concat--> policy head (categorical logits |
    obs["task"] (float D2)    --+--concat--normalise--MLP-----+            Gaussian mean, log-std)
                                                              +--> value head --> x std + mean of the returns

The vector keys share one MLP (as Stable-Baselines3's MultiInputPolicy does), so its first layer can combine
them: a gripper's position with an object's, which per-key encoders could only add up in the linear heads. It
also keeps the inference worker's forward pass at two layers whatever the number of keys. The MLP and its
normaliser are named after the keys they read, joined by ``+`` in sorted order (``"object+proprio+task"``; a
single key's name is the key itself).

With ``--actor_critic=separate`` the value head has encoders of its own (the same architecture), so a large value
loss cannot take over the features the policy reads; the observation normalisers are shared either way.

Continuous actions: the Gaussian is unbounded. The sample and its log-prob are what the learner trains on;
the env receives the sample clipped to the Box bounds (clipping, not tanh squashing, keeps the log-prob exact
and the head simple).

Weights, and the running observation statistics (buffers), travel to inference workers in one state_dict.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from sfengine.config import Config, ConfigError, ModelConfig
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.distributions import LOG_STD_RANGE, gaussian_entropy, gaussian_log_prob
from sfengine.models.flow_head import FlowHead

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


class RunningMeanStd(nn.Module):
    """Running mean and variance of a vector observation, updated by the learner only."""

    def __init__(self, dim: int, clip: float = 10.0):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(1e-4))
        self.clip = clip

    @torch.no_grad()
    def update(self, x: Tensor, sum_over_ranks: Callable[[Tensor], Tensor] | None = None) -> None:
        """Merge the moments of the batch ``x`` [..., dim]. In a multi-rank run, ``sum_over_ranks`` sums the
        batch's count, sum and sum of squares over the ranks, so every rank applies the same update. Rows with a
        NaN or infinite value are left out: one would make the statistics, and every later input, NaN."""
        x = x.reshape(-1, x.shape[-1]).double()
        x = x[torch.isfinite(x).all(1)]
        sums = torch.cat([x.new_tensor([x.shape[0]]), x.sum(0), x.pow(2).sum(0)])
        if sum_over_ranks is not None:
            sums = sum_over_ranks(sums)
        if sums[0] == 0:
            return
        dim = x.shape[1]
        n, batch_mean = sums[0], sums[1 : 1 + dim] / sums[0]
        batch_var = (sums[1 + dim :] / n - batch_mean.pow(2)).clamp_min(0.0)
        count = self.count.double()
        total = count + n
        delta = batch_mean - self.mean.double()
        m2 = self.var.double() * count + batch_var * n + delta.pow(2) * count * n / total
        self.mean.copy_(self.mean.double() + delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: Tensor) -> Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-self.clip, self.clip)


class ReturnNormalizer(nn.Module):
    """Running mean and std of the discounted returns (the value targets), so the critic learns in units of
    their spread whatever the reward's scale: returns of thousands and sparse 0/1 successes alike.

    The value head predicts normalised values; ``denormalize`` turns them into returns, which is what the model
    outputs, the inference workers write and GAE consumes. When the statistics move, ``update`` rescales the value
    head so that its outputs in return units stay exactly what they were (the output-preserving step of PopArt,
    van Hasselt et al. 2016): an update of the statistics never makes the critic's predictions jump. The first
    update is the exception: the untrained head is read in the first returns' units.

    ``mean`` and ``std`` are what TensorBoard shows as ``train/return_mean`` and ``train/return_std``.
    """

    # While every return seen is the same (a sparse task before its first success) the std is 0. The floor only
    # keeps the units finite; any larger one would break the scale invariance for small rewards.
    MIN_STD = 1e-6

    def __init__(self):
        super().__init__()
        self.stats = RunningMeanStd(1, clip=math.inf)

    def std(self) -> Tensor:
        return self.stats.var.sqrt().clamp_min(self.MIN_STD)

    def normalize(self, returns: Tensor) -> Tensor:
        return (returns - self.stats.mean) / self.std()

    def denormalize(self, values: Tensor) -> Tensor:
        return values * self.std() + self.stats.mean

    @torch.no_grad()
    def update(
        self, returns: Tensor, value_head: nn.Linear, sum_over_ranks: Callable[[Tensor], Tensor] | None = None
    ) -> None:
        first = float(self.stats.count) < 1.0  # only the prior so far
        old_mean, old_std = self.stats.mean.clone(), self.std()
        self.stats.update(returns.reshape(-1, 1), sum_over_ranks)
        if first:
            # The untrained head (0 everywhere) says nothing yet: read in the first returns' units, the critic starts
            # at their mean.
            return
        new_mean, new_std = self.stats.mean, self.std()
        # raw = w.x * std + mean must stay the same: w' = w * old_std / new_std, b' = (b * old_std + old_mean -
        # new_mean) / new_std.
        value_head.weight.mul_(old_std / new_std)
        value_head.bias.copy_((value_head.bias * old_std + old_mean - new_mean) / new_std)


def mlp(sizes: list[int], activation: type[nn.Module]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(fan_in, fan_out), activation()]
    return nn.Sequential(*layers)


class CNNEncoder(nn.Module):
    """uint8 H x W x C image -> feature vector. Normalises to [0, 1] on the consumer side. ``layer_norm``: the
    features leave through LayerNorm and tanh instead of the activation (the off-policy critics' encoders, as
    DrQ's: bounded features keep the critics' values from running away)."""

    def __init__(
        self, shape: tuple[int, int, int], activation: type[nn.Module], out_dim: int = 256, layer_norm: bool = False
    ):
        super().__init__()
        height, width, channels = shape
        # Large images: the classic 8/4/3 stack. Small ones: padded 3x3 convs, which fit any size.
        if min(height, width) >= 64:
            layers = [(32, 8, 4, 0), (64, 4, 2, 0), (64, 3, 1, 0)]
        else:
            layers = [(32, 3, 2, 1), (64, 3, 2, 1), (64, 3, 1, 1)]
        convs: list[nn.Module] = []
        in_channels = channels
        for out_channels, kernel, stride, padding in layers:
            convs += [nn.Conv2d(in_channels, out_channels, kernel, stride, padding), activation()]
            in_channels = out_channels
        self.convs = nn.Sequential(*convs, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, channels, height, width)).shape[1]
        ending = [nn.LayerNorm(out_dim), nn.Tanh()] if layer_norm else [activation()]
        self.out = nn.Sequential(nn.Linear(flat, out_dim), *ending)
        self.out_dim = out_dim

    def forward(self, image: Tensor) -> Tensor:
        # The permuted view of an N x H x W x C batch is already channels-last in memory, the layout oneDNN's
        # CPU convolutions prefer; the encoder computes in its weights' dtype (see ``ActorCritic.for_inference``).
        x = image.permute(0, 3, 1, 2).to(self.out[0].weight.dtype) / 255.0
        return self.out(self.convs(x)).float()


ModelFactory = Callable[[Config, ObsSpec, ActionSpec], "ActorCritic"]
MODELS: dict[str, ModelFactory] = {}  # --model=name -> factory; "actor_critic", the default, is the class itself


def register_model(name: str, factory: ModelFactory) -> None:
    """Make ``factory(cfg, obs_spec, action_spec)`` the model of ``--model=name``. It returns an ``ActorCritic``
    (typically a subclass with encoders of the user's own, or loaded with pretrained weights). Register at the top
    level of the script that calls ``sfengine.train.main``: the engine's spawned processes import that script
    too, and each builds its copy of the model through the factory."""
    if name == DEFAULT_MODEL:
        raise ValueError(f"register_model: {DEFAULT_MODEL!r} is the built-in model; choose another name")
    MODELS[name] = factory


DEFAULT_MODEL = "actor_critic"
# The critic's modules: the value head, its own encoders (--actor_critic=separate) and the return statistics. The
# rest is the policy, a shared encoder and the observation normalisers included.
CRITIC_MODULES = ("value_head", "value_encoders", "return_normalizer")


def is_critic_key(name: str) -> bool:
    """Whether a parameter or buffer name of an ActorCritic's state dict belongs to the critic."""
    return name.split(".", 1)[0] in CRITIC_MODULES


class PolicyOutput(NamedTuple):
    actions: Tensor  # [N] int64 or [N, A] float
    log_probs: Tensor  # [N]
    values: Tensor  # [N]


class ActorCritic(nn.Module):
    """``critic=False`` (critic-free advantages, ``--advantage=rloo|grpo``): no value head, and values are 0."""

    image_layer_norm = False  # a subclass's CNNs may end in LayerNorm and tanh (``CNNEncoder``'s ``layer_norm``)

    def __init__(self, obs_spec: ObsSpec, action_spec: ActionSpec, cfg: ModelConfig, critic: bool = True):
        super().__init__()
        self.obs_spec, self.action_spec = obs_spec, action_spec
        activation = ACTIVATIONS[cfg.activation]
        self.vector_keys = sorted(key for key in obs_spec.shapes if not obs_spec.is_image(key))
        self.image_keys = sorted(key for key in obs_spec.shapes if obs_spec.is_image(key))
        self.vector_name = "+".join(self.vector_keys)
        self.vector_dim = sum(obs_spec.shapes[key][0] for key in self.vector_keys)
        self.input_names = ([self.vector_name] if self.vector_keys else []) + self.image_keys
        self.normalizers = nn.ModuleDict()
        if cfg.normalize_input and self.vector_keys:
            self.normalizers[self.vector_name] = RunningMeanStd(self.vector_dim)
        self.frozen_statistics = cfg.input_statistics == "frozen"
        self.encoders, features = self._build_encoders(cfg, activation)
        # Separate: the critic's own encoders. Shared: the value head reads the policy's features.
        separate = critic and cfg.actor_critic == "separate"
        self.value_encoders = self._build_encoders(cfg, activation)[0] if separate else None
        self.value_head = nn.Linear(features, 1) if critic else None
        self.return_normalizer = ReturnNormalizer() if critic and cfg.normalize_returns else None
        self.state_dependent_std = not action_spec.discrete and cfg.continuous_log_std == "state_dependent"
        # --policy_head=flow: a flow-matching head generates the action chunk (no likelihood: FlowSAR trains it).
        self.flow_head = None
        if action_spec.discrete:
            self.policy_head = nn.Linear(features, action_spec.num_actions)
        elif cfg.policy_head == "flow":
            self.policy_head = None
            self.flow_head = FlowHead(features, action_spec.dim, cfg.flow_hidden_sizes, cfg.flow_steps)
        elif self.state_dependent_std:
            self.policy_head = nn.Linear(features, 2 * action_spec.dim)  # mean, then log-std
        else:
            self.policy_head = nn.Linear(features, action_spec.dim)
            self.log_std = nn.Parameter(torch.full((action_spec.dim,), cfg.initial_log_std))
        self._init_weights(cfg.initial_log_std)

    @classmethod
    def for_config(cls, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> ActorCritic:
        """The run's model (``--model``: the built-in one, or a registered one): without a critic when its
        advantages need none. Every process builds its copy here, so a registered model acts and learns alike."""
        if cfg.model.model == DEFAULT_MODEL:
            from sfengine.algorithms import algorithm_for

            own_model = algorithm_for(cfg).model  # an algorithm's own policy (SAC's squashed Gaussian), if any
            if own_model is not None:
                return own_model(cfg, obs_spec, action_spec)
            return cls(obs_spec, action_spec, cfg.model, critic=cfg.needs_critic)
        factory = MODELS.get(cfg.model.model)
        if factory is None:
            raise ConfigError(
                f"--model={cfg.model.model!r} is not registered (known: {', '.join([DEFAULT_MODEL, *MODELS])}); "
                "call sfengine.register_model at the top level of your training script"
            )
        model = factory(cfg, obs_spec, action_spec)
        if not isinstance(model, ActorCritic):
            raise TypeError(
                f"register_model({cfg.model.model!r}, ...): the factory returned a {type(model).__name__}; return an "
                "ActorCritic or a subclass of it (the engine calls its encode, act and loss methods)"
            )
        return model

    def _build_encoders(self, cfg: ModelConfig, activation: type[nn.Module]) -> tuple[nn.ModuleDict, int]:
        """One MLP for the vector keys and a CNN per image key, and the width of their concatenated features."""
        encoders, features = nn.ModuleDict(), 0
        if self.vector_keys:
            encoders[self.vector_name] = mlp([self.vector_dim, *cfg.hidden_sizes], activation)
            features += cfg.hidden_sizes[-1]
        for key in self.image_keys:
            encoders[key] = CNNEncoder(self.obs_spec.shapes[key], activation, layer_norm=self.image_layer_norm)
            features += encoders[key].out_dim
        return encoders, features

    def _init_weights(self, initial_log_std: float) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(module.weight, gain=math.sqrt(2))
                nn.init.zeros_(module.bias)
        # Small policy output: a near-uniform first policy, or a Gaussian whose log-std is initial_log_std in every
        # state (state-dependent: through the log-std half of the head's bias, its weights start near zero), or a
        # flow whose velocities start near zero, so its first chunks are close to the N(0, I) noise they start from.
        output = self.policy_head if self.flow_head is None else self.flow_head.net[-1]
        nn.init.orthogonal_(output.weight, gain=0.01)
        # The critic starts at exactly 0 in every state: an untrained critic's O(1) outputs would otherwise enter the
        # first batches' returns, swamp small rewards and, through the return statistics, which keep all history,
        # leave the critic's units wrong for the rest of the run.
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
        if self.state_dependent_std:
            with torch.no_grad():
                self.policy_head.bias[self.action_spec.dim :] = initial_log_std

    def policy_parameters(self) -> list[nn.Parameter]:
        """Every parameter but the critic's: the policy head (and log-std or flow head) and the encoders it reads,
        which with ``--actor_critic=shared`` feed the value head too."""
        return [param for name, param in self.named_parameters() if not is_critic_key(name)]

    def load_initial_state(self, saved: dict[str, Tensor]) -> bool:
        """Start from another run's weights (``--init_from``): the policy and the observation statistics must fit
        exactly, or ValueError names the first difference. The critic (value head and its own encoders) is taken
        when every one of its tensors fits, and otherwise stays as initialised (a checkpoint of a critic-free or
        differently built critic); the return statistics always start fresh. Returns whether the critic was taken."""
        own = self.state_dict()
        policy = [name for name in own if not is_critic_key(name)]
        critic = [name for name in own if is_critic_key(name) and not name.startswith("return_normalizer.")]
        unexpected = sorted(name for name in saved if not is_critic_key(name) and name not in own)
        if unexpected:
            raise ValueError(f"the checkpoint has {unexpected[0]}, which this model lacks")
        for name in policy:
            if name not in saved:
                raise ValueError(f"the checkpoint lacks {name}")
            if saved[name].shape != own[name].shape:
                raise ValueError(f"{name} is {tuple(saved[name].shape)} there, {tuple(own[name].shape)} here")
        take_critic = bool(critic) and all(name in saved and saved[name].shape == own[name].shape for name in critic)
        self.load_state_dict({name: saved[name] for name in policy + (critic if take_critic else [])}, strict=False)
        return take_critic

    def for_inference(self, dtype: torch.dtype) -> ActorCritic:
        """Make this copy an inference copy whose CNN encoders compute in ``dtype`` (bfloat16 cuts their CPU
        cost on CPUs with native bf16). Everything else stays float32: the normalisers and the small MLPs and
        heads, so vector inputs keep their precision and actions are drawn from float32 logits. The log-probs
        written for the learner are those of this copy, the policy that acted, so PPO's ratio and V-trace stay
        exact; the copy differs from the learner's float32 policy by bf16 rounding, like a tiny policy lag.
        ``load_state_dict`` and ``copy_`` of float32 weights into it cast them."""
        for encoders in (self.encoders, self.value_encoders or {}):
            for encoder in encoders.values():
                if isinstance(encoder, CNNEncoder):
                    encoder.to(dtype=dtype, memory_format=torch.channels_last)
        return self

    def update_normalizers(
        self, obs: dict[str, Tensor], sum_over_ranks: Callable[[Tensor], Tensor] | None = None, initial: bool = False
    ) -> None:
        """Merge a batch's vector observations (dict of [..., dim] tensors) into the running statistics. With
        ``--input_statistics=frozen`` only the ``initial`` ones (a clone's, set by sfengine.pretrain) are taken."""
        if self.normalizers and (initial or not self.frozen_statistics):
            self.normalizers[self.vector_name].update(self._vector(obs), sum_over_ranks)

    def _vector(self, obs: dict[str, Tensor]) -> Tensor:
        """The vector keys of ``obs`` side by side, [..., vector_dim]."""
        if len(self.vector_keys) == 1:
            return obs[self.vector_keys[0]]
        return torch.cat([obs[key] for key in self.vector_keys], dim=-1)

    def update_return_normalizer(
        self, returns: Tensor, sum_over_ranks: Callable[[Tensor], Tensor] | None = None
    ) -> None:
        if self.return_normalizer is not None:
            self.return_normalizer.update(returns, self.value_head, sum_over_ranks)

    def normalized_values(self, values: Tensor) -> Tensor:
        """Values or returns in the units the critic learns in (unchanged without return normalisation)."""
        return values if self.return_normalizer is None else self.return_normalizer.normalize(values)

    def forward(self, obs: dict[str, Tensor], in_critic_units: bool = False) -> tuple[Tensor, Tensor]:
        """obs: dict of [N, ...] tensors -> (policy parameters [N, P], values [N] in return units, or in the units
        the critic learns in with ``in_critic_units``: what the learner's value loss compares). With the flow head
        the policy parameters are the features the velocity network is conditioned on."""
        inputs = self._inputs(obs)
        features = self._encode(self.encoders, inputs)
        params = self._policy_params(features)
        if self.value_head is None:
            return params, features.new_zeros(features.shape[0])
        value_features = features if self.value_encoders is None else self._encode(self.value_encoders, inputs)
        return params, self._values(value_features, in_critic_units)

    def policy_params(self, obs: dict[str, Tensor]) -> Tensor:
        """The actor alone: the policy parameters [N, P] that ``forward`` returns, without running the critic."""
        return self._policy_params(self.policy_features(obs))

    def _policy_params(self, features: Tensor) -> Tensor:
        return features if self.flow_head is not None else self.policy_head(features)

    def policy_features(self, obs: dict[str, Tensor]) -> Tensor:
        """The actor's encoder features [N, F]: what the flow head is conditioned on."""
        return self._encode(self.encoders, self._inputs(obs))

    def values(self, obs: dict[str, Tensor]) -> Tensor:
        """The critic alone: obs dict of [N, ...] tensors -> values [N] in return units. With separate trunks the
        actor is not run (the learner's per-epoch targets need only this)."""
        inputs = self._inputs(obs)
        encoders = self.encoders if self.value_encoders is None else self.value_encoders
        return self._values(self._encode(encoders, inputs), in_critic_units=False)

    def _inputs(self, obs: dict[str, Tensor]) -> dict[str, Tensor]:
        """The encoders' inputs: image keys as they are, the vector keys side by side and normalised."""
        inputs = {key: obs[key] for key in self.image_keys}
        if self.vector_keys:
            vector = self._vector(obs)
            inputs[self.vector_name] = self.normalizers[self.vector_name](vector) if self.normalizers else vector
        return inputs

    def _values(self, value_features: Tensor, in_critic_units: bool) -> Tensor:
        values = self.value_head(value_features).squeeze(-1)
        if self.return_normalizer is not None and not in_critic_units:
            values = self.return_normalizer.denormalize(values)
        return values

    def _encode(self, encoders: nn.ModuleDict, inputs: dict[str, Tensor]) -> Tensor:
        parts = [encoders[name](inputs[name]) for name in self.input_names]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def _mean_log_std(self, params: Tensor) -> tuple[Tensor, Tensor]:
        if self.state_dependent_std:
            mean, log_std = params.chunk(2, dim=-1)
            return mean, log_std.clamp(*LOG_STD_RANGE)
        return params, self.log_std.clamp(*LOG_STD_RANGE).expand_as(params)

    def sample(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """Draw actions and their log-probs. Written with plain ops: torch.distributions validation
        costs more than the whole forward pass at inference batch sizes.

        Discrete actions use the Gumbel-max draw: argmax(log p + G) with G = -log(E), E ~ Exp(1), is a draw from
        Categorical(p), and at inference batch sizes it costs less than ``torch.multinomial``, which was the
        largest single cost of the inference worker on a cheap env."""
        if self.action_spec.discrete:
            log_p = torch.log_softmax(params, dim=-1)
            draws = torch.empty_like(log_p).exponential_().clamp_min_(torch.finfo(log_p.dtype).tiny)
            actions = (log_p - draws.log()).argmax(-1)
            return actions, log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        mean, log_std = self._mean_log_std(params)
        noise = torch.randn_like(mean)
        actions = mean + noise * log_std.exp()
        return actions, gaussian_log_prob(noise, log_std)

    def log_prob_entropy(self, params: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-prob of given actions and the policy entropy, both [N]."""
        if self.action_spec.discrete:
            log_p = torch.log_softmax(params, dim=-1)
            entropy = -(log_p.exp() * log_p).sum(-1)
            return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), entropy
        mean, log_std = self._mean_log_std(params)
        z = (actions - mean) / log_std.exp()
        return gaussian_log_prob(z, log_std), gaussian_entropy(log_std)

    def mode(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """The most likely actions (the Gaussian's mean, the categorical's argmax) and their log-probs."""
        if self.action_spec.discrete:
            log_p = torch.log_softmax(params, dim=-1)
            log_probs, actions = log_p.max(-1)
            return actions, log_probs
        mean, log_std = self._mean_log_std(params)
        return mean, gaussian_log_prob(0.0, log_std)

    def act(self, obs: dict[str, Tensor], deterministic: bool = False) -> PolicyOutput:
        """Sample actions for a batch (``deterministic``: take the mode, as evaluation does). Call it under
        ``torch.inference_mode()`` (a no_grad decorator here would cost a fifth of the whole call at inference
        batch sizes)."""
        params, values = self(obs)
        if self.flow_head is not None:
            actions = self.flow_head.mode(params) if deterministic else self.flow_head.sample(params)
            return PolicyOutput(actions, values.new_zeros(values.shape[0]), values)  # a flow has no log-prob
        actions, log_probs = self.mode(params) if deterministic else self.sample(params)
        return PolicyOutput(actions, log_probs, values)
