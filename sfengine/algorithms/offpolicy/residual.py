"""Residual policies over a frozen base (``--residual_over=NAME|PATH``): the base acts, the learned actor adds a
bounded correction.

    base     a = base(s)              frozen: a checkpoint of sfengine.pretrain or of a training run, or a registered
                                      model; --residual_base_action: its sampled action or its mode
    actor    r = actor(s, unit(a))    within +-(--residual_scale) half-ranges of the env's box in every dimension;
                                      its last layer starts at zero, so the first actions are the base's
    acts     clip(a + r) to the env's box

With ``--action_chunk=K`` (the base's own) a decision is a chunk: the base's K actions and a correction of each.
``--residual_base_device`` keeps the base on a device of its own (a large base on a GPU of its own): it stays
there when the policy moves, its inputs go to it and its outputs come back.

The policy is one module (the base is a frozen submodule), so the inference workers run base and correction
together, every checkpoint holds both, and ``sfengine.evaluate`` evaluates the pair. The actor and the critics
read the observation as the base normalises it (its frozen input statistics); the critics judge the action taken,
``a + r``. A policy's params carry the base's action beside the actor's own outputs: ``[actor params, a]``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
from collections.abc import Callable

import torch
from torch import Tensor, nn

from sfengine.config import Config, ConfigError
from sfengine.engine.checkpoint import CheckpointError, find_checkpoint, list_checkpoints, load_checkpoint
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ACTIVATIONS, MODELS, ActorCritic, mlp

log = logging.getLogger("sfengine")


def load_base(cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> ActorCritic:
    """The frozen base ``--residual_over`` names, built for this env's spaces: a registered model (its factory
    brings its weights), or the policy of a checkpoint (a file, or the latest of an experiment) built as its run's
    config.json says. Where that checkpoint is gone, the copy this run's own checkpoints keep (see
    ``base_copy_in_run``). A policy that does not fit the env is a ConfigError."""
    source = cfg.algorithm_options.residual_over
    if source in MODELS:
        base = MODELS[source](cfg, obs_spec, action_spec)
        base.source, base.source_config = f"registered model {source!r}", None
    else:
        from sfengine.config.files import saved_options
        from sfengine.config.parsing import _layered

        saved, weights, where = base_checkpoint(cfg, source)
        base_cfg = _layered([(saved_options(saved, where), where)])
        trained_on = saved.get("env", {}).get("env", "?")
        if base_cfg.model.action_chunk != cfg.model.action_chunk:
            raise ConfigError(
                f"--residual_over={source}: its policy was trained with --action_chunk={base_cfg.model.action_chunk} "
                f"and this run has --action_chunk={cfg.model.action_chunk}: run with the base's"
            )
        try:
            base = ActorCritic.for_config(base_cfg, obs_spec, action_spec)
            base.load_state_dict(weights)
        except (RuntimeError, ConfigError, KeyError) as exc:
            first = str(exc).splitlines()[0]
            raise ConfigError(
                f"--residual_over={source}: its policy (trained on --env={trained_on}) does not fit env "
                f"'{cfg.env.env}' ({first[:200]}); give a base trained on this env and its observations"
            ) from None
        base.source, base.source_config = where, saved
    if base.action_spec.dim != action_spec.dim:
        raise ConfigError(
            f"--residual_over={source}: the base acts {base.action_spec.dim} values a decision, this run "
            f"{action_spec.dim} ({action_spec.chunk} x {action_spec.env_dim}); give a base of this env, with "
            "--action_chunk set to the base's chunk"
        )
    return base.requires_grad_(False).eval()


def base_checkpoint(cfg: Config, source: str) -> tuple[dict, dict, str]:
    """The base's run config (config.json's groups), its policy's weights, and where they come from."""
    try:
        path = find_checkpoint(source, cfg.run.train_dir, "--residual_over")
        state = load_checkpoint(path)
    except CheckpointError as exc:
        copy = base_copy_in_run(cfg, source)
        if copy is None:
            raise ConfigError(str(exc)) from None
        return copy
    saved = path.parent.parent / "config.json"
    try:
        return json.loads(saved.read_text()), state["model"], str(path)
    except (OSError, json.JSONDecodeError):
        raise ConfigError(
            f"--residual_over={source}: {path} has no readable config.json two folders up (its run's), which says "
            "how its policy is built; give a checkpoint inside its run's checkpoints/ folder"
        ) from None


def base_copy_in_run(cfg: Config, source: str) -> tuple[dict, dict, str] | None:
    """A run over a checkpoint keeps a copy of its base: the base's config in the trainer's state (``residual_base``)
    and its weights in the policy's (``base.*``). Where the checkpoint ``source`` names is gone (moved, deleted, or
    this run copied to another machine), resuming or evaluating this run takes the base from its latest checkpoint,
    if that run was over the same ``source``."""
    checkpoints = list_checkpoints(cfg.experiment_dir)
    if not checkpoints:
        return None
    try:
        state = load_checkpoint(checkpoints[-1])
    except CheckpointError:
        return None
    kept = next(
        (part["residual_base"] for part in state.values() if isinstance(part, dict) and "residual_base" in part), None
    )
    if not kept or kept["option"] != source:
        return None
    weights = {name[len("base.") :]: value for name, value in state["model"].items() if name.startswith("base.")}
    said = (source, str(checkpoints[-1]))
    if multiprocessing.parent_process() is None and said not in COPIES_SAID:  # once: not by every component
        COPIES_SAID.add(said)
        log.warning(
            "--residual_over=%s: not found; the base is this run's own copy in %s (first from %s)",
            source,
            checkpoints[-1],
            kept["source"],
        )
    return kept["config"], weights, kept["source"]


COPIES_SAID: set[tuple[str, str]] = set()  # (option, checkpoint) whose copy of the base this process has named


class ResidualPolicy:
    """What a residual actor adds to its actor class (SAC's ``ResidualSAC``, TD3's ``ResidualTD3``): the base, the
    correction's box, and the actor's input (the base-normalised observation and the base's action). A subclass
    builds itself in ``over(cfg, obs_spec, action_spec, base)``."""

    frozen_prefixes = ("base.",)  # the base's weights never change: shared once, not at every publish

    @classmethod
    def over(cls, cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec, base: ActorCritic) -> ResidualPolicy:
        raise NotImplementedError

    def _init_residual(
        self, obs_spec: ObsSpec, action_spec: ActionSpec, cfg, base: ActorCritic, scale: float, base_action: str
    ) -> None:
        low, high = torch.tensor(action_spec.low), torch.tensor(action_spec.high)
        self.obs_spec, self.action_spec = obs_spec, action_spec  # the env's: what the engine and trainer read
        self.base, self.base_mode = base, base_action == "mode"
        self.register_buffer("env_center", (high + low) / 2)
        self.register_buffer("env_half_range", (high - low) / 2)
        # The actor reads the observation as the base normalises it (and its own CNNs' features of the images,
        # which the critics train), beside the base's action in [-1, 1].
        self.normalizers = nn.ModuleDict()
        dim = action_spec.dim
        self.encoders[self.vector_name] = mlp(
            [self.critic_feature_dim + dim, *cfg.hidden_sizes], ACTIVATIONS[cfg.activation]
        )
        for module in self.encoders[self.vector_name].modules():
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, gain=2**0.5)
                nn.init.zeros_(module.bias)
        if self.image_keys:  # the MLP reads the CNN features itself, so the head reads the MLP alone
            head = self.policy_head
            self.policy_head = nn.Linear(cfg.hidden_sizes[-1], head.out_features)
            with torch.no_grad():
                nn.init.orthogonal_(self.policy_head.weight, gain=0.01)
                self.policy_head.bias.copy_(head.bias)
        with torch.no_grad():  # the correction's mean starts at exactly 0: the first actions are the base's
            self.policy_head.weight[:dim] = 0.0
            self.policy_head.bias[:dim] = 0.0

    def place_base(self, device: torch.device) -> None:
        """The base on ``device`` for good: ``.to()`` of the policy leaves it there."""
        self.base_device = device
        self.base.to(device)

    def _apply(self, fn, recurse=True):
        if getattr(self, "base_device", None) is None:
            return super()._apply(fn, recurse)
        base, self._modules["base"] = self._modules["base"], None  # children() skips it; its place is kept
        try:
            return super()._apply(fn, recurse)
        finally:
            self._modules["base"] = base

    def on_base(self, obs: dict[str, Tensor]) -> dict[str, Tensor]:
        if getattr(self, "base_device", None) is None:
            return obs
        # Into CPU memory a non-blocking copy returns before its data is there, and the base on the CPU would read
        # it at once: only a copy to a GPU, which its stream orders before the base's kernels, may return early.
        early = self.base_device.type != "cpu"
        return {key: value.to(self.base_device, non_blocking=early) for key, value in obs.items()}

    @staticmethod
    def residual_spec(action_spec: ActionSpec, scale: float) -> ActionSpec:
        half = [(h - lo) / 2 * scale for lo, h in zip(action_spec.low, action_spec.high, strict=True)]
        return dataclasses.replace(action_spec, low=tuple(-x for x in half), high=tuple(half))

    def base_actions(self, obs: dict[str, Tensor]) -> Tensor:
        obs = self.on_base(obs)
        with torch.no_grad():
            if self.base.flow_head is not None:
                actions = self.base.act(obs, deterministic=self.base_mode).actions
            else:  # the policy alone: a clone's value head is not needed here
                params = self.base.policy_params(obs)
                actions = (self.base.mode if self.base_mode else self.base.sample)(params)[0]
        return self.inside_box(actions.to(self.env_center.device))

    def inside_box(self, actions: Tensor) -> Tensor:
        return torch.maximum(
            torch.minimum(actions, self.env_center + self.env_half_range), self.env_center - self.env_half_range
        )

    def policy_params(self, obs: dict[str, Tensor], features: Tensor | None = None) -> Tensor:
        """``[the actor's params, the base's action]``; ``features``: the observation's ``critic_features``,
        where the learner has them."""
        base = self.base_actions(obs)
        if features is None:
            features = self.critic_features(obs)
        hidden = self.encoders[self.vector_name](torch.cat([features, self.unit_actions(base)], -1))
        return torch.cat([self._policy_params(hidden), base], -1)

    def forward(self, obs: dict[str, Tensor], in_critic_units: bool = False) -> tuple[Tensor, Tensor]:
        params = self.policy_params(obs)
        return params, params.new_zeros(params.shape[0])

    def split(self, params: Tensor) -> tuple[Tensor, Tensor]:
        dim = self.action_spec.dim
        return params[..., :-dim], params[..., -dim:]

    def unit_actions(self, actions: Tensor) -> Tensor:
        return (actions - self.env_center) / self.env_half_range

    def critic_features(self, obs: dict[str, Tensor]) -> Tensor:
        """The vector input as the base normalises it, then the residual's own CNN features of each image."""
        parts = []
        if self.base.vector_keys:
            parts.append(self.base._inputs(self.on_base(obs))[self.base.vector_name].to(self.env_center.device))
        parts += [self.encoders[key](obs[key]) for key in self.image_keys]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    @property
    def critic_feature_dim(self) -> int:
        return self.base.vector_dim + sum(self.encoders[key].out_dim for key in self.image_keys)

    def update_normalizers(self, obs, sum_over_ranks=None, initial: bool = False) -> None:
        """The base's input statistics are frozen with it."""

    def residual_fraction(self, params: Tensor, actions: Tensor) -> Tensor:
        """|a - base| per dimension as a fraction of the correction's bound, [N, dim]."""
        return (actions - self.split(params)[1]).abs() / self.action_half_range


def policy_factory(actor: type[ActorCritic], residual: type[ResidualPolicy]) -> Callable[..., ActorCritic]:
    """An off-policy algorithm's model: its ``actor`` alone, or with ``--residual_over`` the frozen base under a
    ``residual`` correction."""

    def build(cfg: Config, obs_spec: ObsSpec, action_spec: ActionSpec) -> ActorCritic:
        options = cfg.algorithm_options
        if not options.residual_over:
            return actor.build(cfg, obs_spec, action_spec)
        model = residual.over(cfg, obs_spec, action_spec, load_base(cfg, obs_spec, action_spec))
        if options.residual_base_device:
            model.place_base(torch.device(options.residual_base_device))
        return model

    return build


def base_identity(model: ActorCritic) -> str:
    """Where a residual policy's base came from (a checkpoint path, a registered model), or ""."""
    base = getattr(model, "base", None)
    return getattr(base, "source", "") if base is not None else ""


def base_copy(model: ActorCritic, option: str) -> dict | None:
    """What a checkpoint keeps of a base from a checkpoint (the weights are the policy's own ``base.*``): the option
    that named it, where it came from, and its run's config, so that the run resumes and evaluates without it."""
    base = getattr(model, "base", None)
    if base is None or getattr(base, "source_config", None) is None:
        return None
    return {"option": option, "source": base.source, "config": base.source_config}
