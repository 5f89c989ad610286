"""What SAC and TD3 share: the replay fed by each training batch, the replay ratio, the critic ensemble with its
targets and optimiser, and the state a checkpoint keeps. A subclass says what the critics learn towards
(``target_value``: the value of the next observation) and how the actor learns (``actor_step``).

    train(batch)  --> the batch's trajectories into the replay --> owed += replay_ratio x its env steps
                  --> int(owed) gradient steps: critic step, every --actor_delay steps the actor's, target update

With several ranks each learns from its own replay and averages its gradients with the others': the env steps
that set ``owed`` and the start of learning are the ranks' mean, so every rank takes the same gradient steps, and
``env_steps_seen`` (the learning rate's schedule) counts the whole run's.

The actor is the run's model, trained with the base ``Trainer``'s optimiser (its gradient averaged over the ranks,
clipped, skipped when not finite); the critics get the same treatment with their own optimiser. With image
observations the model's CNNs belong to the critics' side: their loss and optimiser train them, and the actor reads
the features of each minibatch's (randomly shifted) images as the critic step computed them, detached.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator

import torch
from torch import Tensor

from sfengine.algorithms.offpolicy import graphs
from sfengine.algorithms.offpolicy.critics import CriticEnsemble, soft_update_
from sfengine.algorithms.offpolicy.replay import NStep, Replay, each_tensor
from sfengine.algorithms.offpolicy.residual import base_copy, base_identity
from sfengine.config import Config
from sfengine.demos.fit import read_run_demos
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.engine.distributed import LearnerGroup
from sfengine.learning.trainer import Trainer, adam, clip_and_step, load_optimizer_state
from sfengine.models.actor_critic import ActorCritic

log = logging.getLogger(__name__)

ROUND_DRAW_BYTES = 64 * 2**20  # a round's minibatches are drawn at most this much at a time (see ``minibatches``)

ACTOR_STATS = (
    "actor_loss",
    "entropy",
    "grad_norm",
    "residual_size",
    "residual_to_base",
    "bc_distance",
    "actor_saturated",
)


class OffPolicyTrainer(Trainer):
    def __init__(self, model: ActorCritic, cfg: Config, group: LearnerGroup | None = None):
        super().__init__(model, cfg, group)
        self.options = options = cfg.algorithm_options
        self.device = next(model.parameters()).device
        self.critics = CriticEnsemble.of_options(options, model.critic_feature_dim + model.action_spec.dim).to(
            self.device
        )
        self.group.broadcast_model(self.critics)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        # Image observations: the model's CNNs learn with the critics, from their loss and by their optimiser; the
        # actor reads their features detached (``critic_step`` computes them once a step for both).
        images = model.image_parameters()
        self.critic_side = torch.nn.ModuleList([self.critics, *(model.encoders[key] for key in model.image_keys)])
        self.critic_optimizer = adam(self.critic_side.parameters(), options.critic_learning_rate, cfg)
        if images:
            own = {id(param) for param in images}
            policy = [param for param in model.parameters() if id(param) not in own]
            self.optimizer = adam(policy, cfg.learner.learning_rate, cfg)
        # --image_shift in pixels, per image key (none where it rounds to 0).
        shifts = {key: round(options.image_shift * min(model.obs_spec.shapes[key][:2])) for key in model.image_keys}
        self.image_shift = {key: pixels for key, pixels in shifts.items() if pixels > 0}
        self.gamma = cfg.learner.gamma
        # A drawn transition's size: its observation and next observation, action, return, discount and step count.
        obs_bytes = sum(
            math.prod(shape) * model.obs_spec.dtypes[key].itemsize for key, shape in model.obs_spec.shapes.items()
        )
        self.transition_bytes = 2 * obs_bytes + 4 * model.action_spec.dim + 24
        self.replay = Replay(options.replay_size, cfg.sampler.rollout, model.obs_spec, model.action_spec)
        # --demos: a replay of their own, never overwritten; --demo_ratio of each minibatch comes from it.
        self.demos = None
        self.demo_samples = 0
        if cfg.learner.demos and options.demo_ratio > 0:
            self.demos = Replay.of_demos(
                read_run_demos(cfg), model.obs_spec, model.action_spec, self.learner_rewards, self.gamma
            )
            self.demo_samples = round(options.demo_ratio * cfg.learner.batch_size)
        # The replay's draws and the target subsets: a stream of this rank's own, kept in checkpoints.
        self.generator = torch.Generator().manual_seed(cfg.env.seed * 7919 + 17 + self.group.ranks.rank)
        self.owed = 0.0  # gradient steps owed, carried over between batches
        self.critic_steps = 0
        self.env_steps_seen = 0
        self.learning_from = -1  # env_steps_seen when the first gradient step was owed (-1: not yet)
        self.target_stats: dict[str, Tensor] = {}  # what target_value reports of the step it is part of
        self.graphed: graphs.GraphedUpdate | None = None  # --cuda_graphs, where the run can (use_cuda_graphs)
        self.start_checked = False

    # ---------------------------------------------------------------- what a subclass writes

    def target_value(self, next_obs: dict[str, Tensor], next_features: Tensor) -> Tensor:
        """V(s') the critics bootstrap from, [N], computed without gradients; ``next_features``: the critics' (and
        the policy's) features of ``next_obs``."""
        raise NotImplementedError

    def actor_step(self, b: NStep, features: Tensor) -> dict[str, Tensor]:
        """One update of the actor (and what moves with it) on minibatch ``b``, whose observations' features the
        critics computed (``features``, detached); its statistics, left on the device."""
        raise NotImplementedError

    def round_stats(self) -> dict[str, float]:
        """Statistics of the trainer's own state after a round (SAC: the temperature)."""
        return {}

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    # ---------------------------------------------------------------- one round: a batch of new data

    def train(self, batch: TrajectoryBuffers, learner_version: int, env_steps: int) -> dict[str, float]:
        if not self.start_checked:
            self.start_checked = True
            if (warning := self.no_learning_warning()) and self.group.ranks.rank == 0:
                log.warning(warning)
            if self.options.cuda_graphs:
                self.use_cuda_graphs()
        if self.demos is not None and self.env_steps_seen == 0:
            # The demonstrations' observations count in the input statistics from the start (once: not on resume).
            rows, t = self.demos.starts // self.demos.horizon, self.demos.starts % self.demos.horizon
            self.model.update_normalizers({key: obs[rows, t] for key, obs in self.demos.obs.items()}, self.group.sum)
        self.replay.insert(batch, self.learner_rewards(batch.rewards[:, :-1]))
        new_steps, replay_steps = self.agreed_counts(batch.sampled_env_steps())
        self.env_steps_seen += new_steps
        self.model.update_normalizers(
            {key: obs[:, :-1].flatten(0, 1) for key, obs in batch.obs.items()}, self.group.sum
        )
        # The new data's mean reward an entry (an action, or a chunk's discounted sum): how the acting policy does
        # before its first episodes end (HalfCheetah's 16 envs end none in their first 16k env steps).
        taken = batch.chunk_steps[:, :-1] > 0
        stats = {
            "replay_fill": self.replay.size / self.replay.capacity,
            "reward_mean": float(batch.rewards[:, :-1][taken].mean()),
        }
        if self.demos is not None:
            stats["demo_share"] = self.demo_samples / self.cfg.learner.batch_size
        if self.replay.finals_dropped:  # truncations more often than the replay keeps last observations for
            stats["replay_finals_dropped"] = float(self.replay.finals_dropped)
        world = self.group.ranks.world_size
        if replay_steps < self.options.learning_starts * world or self.nothing_to_learn_from():
            return stats | {"gradient_steps": 0.0}
        if self.learning_from < 0:
            self.learning_from = self.env_steps_seen - new_steps
            if hasattr(self.model, "acts_uniformly"):
                self.model.acts_uniformly.zero_()  # the agent acts with its policy from the next weights on
        self.owed += self.options.replay_ratio * new_steps / world
        steps = int(self.owed)
        self.owed -= steps
        sums: dict[str, Tensor | float] = {}
        for minibatch in self.minibatches(steps):
            for name, value in self.step(minibatch).items():
                sums[name] = sums.get(name, 0.0) + value
            if self.heartbeat is not None:
                self.heartbeat()  # critic-only steps (the warm-up, a delayed actor) included
        sums = read_back(sums)
        actor_steps = max(1.0, sums.pop("actor_steps", 0.0))
        for name, value in sums.items():
            stats[name] = value / (actor_steps if name in ACTOR_STATS else max(1, steps))
        # The replay ratio achieved since the learning started: gradient steps per env step (the target, exactly,
        # up to the fraction carried to the next batch).
        achieved = self.critic_steps * world / max(1, self.env_steps_seen - self.learning_from)
        return stats | self.round_stats() | {"gradient_steps": float(steps), "replay_ratio_achieved": achieved}

    def no_learning_warning(self) -> str | None:
        """Why this run will stop before it learns, if it will: before its first gradient step (its replay, empty
        at the start and after a resume without --save_replay, cannot reach --learning_starts within
        --train_for_env_steps), or before the actor's first (--critic_warmup_updates takes every step left)."""
        options, world = self.options, self.group.ranks.world_size
        missing = max(options.learning_starts - self.replay.inserted_steps, 0) * world
        left = self.cfg.run.train_for_env_steps - self.env_steps_seen
        stop = f"--train_for_env_steps={self.cfg.run.train_for_env_steps}"
        if missing > max(left, 0):  # (a run may stop just after the batch that reaches it: no warning then)
            held = f"holds {self.replay.inserted_steps} env steps"
            if self.env_steps_seen:
                held += " (a resumed run refills it unless --save_replay kept it)"
            return (
                f"no gradient step before the run stops: the replay {held}, "
                f"--learning_starts={options.learning_starts} must be in before the first, and {max(left, 0)} env "
                f"steps are left to {stop}; raise "
                "--train_for_env_steps or lower --learning_starts"
            )
        # This rank's gradient steps by the end: --replay_ratio of the env steps after --learning_starts, shared
        # by the ranks.
        steps = self.critic_steps + int(options.replay_ratio * max(left - missing, 0) / world)
        if options.critic_warmup_updates and steps <= options.critic_warmup_updates:
            return (
                f"the actor will not move before the run stops: --critic_warmup_updates={options.critic_warmup_updates}"
                f" gradient steps train the critics alone first, and the run takes about {steps} in all by {stop} "
                f"(--replay_ratio={options.replay_ratio:g}); raise --train_for_env_steps or lower "
                "--critic_warmup_updates"
            )
        return None

    def nothing_to_learn_from(self) -> bool:
        """Every env step in some rank's replay failed (an env that returns NaN from the start): no rank learns this
        round (each gradient step all-reduces), and the run's check of non-finite env steps stops it with a line
        that names the env, where a draw from such a replay would end the learner with a traceback."""
        empty = self.replay.stored_steps > 0 and self.replay.good_steps() == 0
        if not self.group.distributed:
            return empty
        return bool(self.group.sum(torch.tensor([float(empty)], device=self.device)).item() > 0)

    def agreed_counts(self, new_steps: int) -> tuple[int, int]:
        """This round's new env steps and the env steps the replays hold, both summed over the ranks. Every rank
        decides from these when learning starts and how many gradient steps it owes, so all take the same number
        (each step all-reduces its gradients): their own counts differ where episodes end inside action chunks."""
        if not self.group.distributed:
            return new_steps, self.replay.inserted_steps
        counts = torch.tensor([new_steps, self.replay.inserted_steps], dtype=torch.float64, device=self.device)
        new_total, replay_total = self.group.sum(counts).tolist()
        return round(new_total), round(replay_total)

    def learner_rewards(self, rewards: Tensor) -> Tensor:
        """Rewards as the learner sees them: scaled by --reward_scale, clipped to --reward_clip."""
        rewards = rewards * self.cfg.learner.reward_scale
        if self.cfg.learner.reward_clip > 0:
            rewards = rewards.clamp(-self.cfg.learner.reward_clip, self.cfg.learner.reward_clip)
        return rewards

    def step(self, minibatch: NStep | None = None) -> dict[str, Tensor | float]:
        """One gradient step on ``minibatch`` (default: one drawn now): the critics, every --actor_delay steps the
        actor, then the targets; its statistics, as tensors on the learner's device where they are computed there
        (``train`` reads a round's at once)."""
        minibatch = self.sample() if minibatch is None else minibatch
        self.critic_steps += 1
        warm = self.critic_steps > self.options.critic_warmup_updates
        with_actor = warm and self.critic_steps % self.options.actor_delay == 0
        if with_actor:
            self.set_learning_rate(self.env_steps_seen)
        stats = (self.graphed or self.update)(minibatch, with_actor)
        return stats | {"actor_steps": 1.0} if with_actor else stats

    def update(self, b: NStep, with_actor: bool) -> dict[str, Tensor]:
        """The arithmetic of a gradient step on ``b``: what a CUDA graph records (``graphs``)."""
        stats, features = self.critic_step(b)
        if with_actor:
            stats |= self.actor_step(b, features.detach())
            self.after_actor_step()
        soft_update_(self.target_critics, self.critics, self.options.tau)
        return stats

    def use_cuda_graphs(self) -> None:
        """--cuda_graphs: replay the gradient step from CUDA graphs (``graphs``), its optimisers made capturable;
        a run that cannot says why (``graphs.blocker``) and takes its steps as they are."""
        why = graphs.blocker(self.cfg, self.model, self.device, self.group.ranks.world_size)
        if why is not None:
            if self.group.ranks.rank == 0:
                log.warning("--cuda_graphs: the gradient step stays as it is: %s", why)
            return
        for optimizer in self.optimizers():
            for group in optimizer.param_groups:
                group["capturable"] = True
        self.graphed = graphs.GraphedUpdate(self.update)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimiser a gradient step steps."""
        return [self.critic_optimizer, self.optimizer]

    def after_actor_step(self) -> None:
        """What follows the actor's step (TD3: its target actor's update)."""

    def minibatches(self, steps: int) -> Iterator[NStep]:
        """A round's ``steps`` minibatches, drawn several at a time (as many as fit in ROUND_DRAW_BYTES), each
        draw one gather from the replay and one copy to the device. Drawn one at a time, a minibatch's gather was
        about 600 small operations of a residual TD3 step's 1,500 on LIBERO's state (profiled on the CPU): on a GPU
        the learner's one thread spends most of a step issuing operations. The replay does not change within a
        round, so drawing its minibatches together changes none of their distributions."""
        size = self.cfg.learner.batch_size
        per_draw = max(1, min(steps, ROUND_DRAW_BYTES // (size * self.transition_bytes)))
        for first in range(0, steps, per_draw):
            count = min(per_draw, steps - first)
            drawn = self.sample(count)
            for k in range(count):
                yield each_tensor(drawn, lambda t, k=k: t[k * size : (k + 1) * size])

    def sample(self, minibatches: int = 1) -> NStep:
        """``minibatches`` minibatches of --batch_size transitions one after the other: --demo_ratio of each from
        the demonstrations, first."""
        online = self.cfg.learner.batch_size - self.demo_samples
        n, gamma = self.options.n_step, self.gamma
        sampled = self.replay.sample(online * minibatches, n, gamma, self.generator)
        if self.demos is not None:
            demos = self.demos.sample(self.demo_samples * minibatches, n, gamma, self.generator)
            sampled = interleave(demos, sampled, minibatches)
        if self.device.type != "cpu":
            sampled = each_tensor(sampled, lambda t: t.to(self.device, non_blocking=True))
        if self.image_shift:
            shift = lambda obs: {  # noqa: E731
                key: random_shift(value, self.image_shift[key], self.generator) if key in self.image_shift else value
                for key, value in obs.items()
            }
            sampled = sampled._replace(obs=shift(sampled.obs), next_obs=shift(sampled.next_obs))
        return sampled

    def features(self, obs: dict[str, Tensor]) -> Tensor:
        """What the critics read of an observation: the model's normalised vector input and its CNN features of the
        images (with gradients to the CNNs: the critic step trains them)."""
        return self.model.critic_features(obs)

    def critic_step(self, b: NStep) -> tuple[dict[str, Tensor | float], Tensor]:
        """One update of the critics (and the CNNs of image observations); its statistics and the features of
        ``b.obs`` it computed."""
        with torch.no_grad():
            target = b.returns + b.discounts * self.target_value(b.next_obs, self.features(b.next_obs))
        features = self.features(b.obs)
        q = self.critics(features, self.model.unit_actions(b.actions))
        td = q - target
        loss = td.pow(2).mean(1).sum()  # each member's own mean squared error
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.group.average_gradients(self.critic_side)
        norm, skipped = clip_and_step(
            self.critic_optimizer, self.critic_side.parameters(), self.cfg.learner.max_grad_norm
        )
        return {
            "critic_loss": loss.detach() / self.critics.members,
            "q_mean": q.detach().mean(),
            "td_error": td.detach().abs().mean(),
            "target_mean": target.mean(),
            "critic_grad_norm": norm,
            "critic_nonfinite_fraction": skipped,
            **self.target_stats,
        }, features

    def actor_terms(self, b: NStep, params: Tensor, actions: Tensor, q: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """What the actor's loss adds to the critics' verdict on ``actions`` (computed from ``params``, with
        gradients): --residual_penalty on a residual policy's correction, --bc_weight's pull toward the
        minibatch's demonstrations (its first rows); and their statistics."""
        extra, stats = q.new_zeros(()), {}
        if hasattr(self.model, "residual_fraction"):
            fraction = self.model.residual_fraction(params, actions)  # [N, dim], of the correction's bound
            base = self.model.unit_actions(self.model.split(params)[1]).detach()
            correction = self.model.unit_actions(actions) - base
            stats["residual_size"] = fraction.detach().mean()
            stats["residual_to_base"] = correction.detach().norm(dim=-1).mean() / base.norm(dim=-1).mean()
            if self.options.residual_penalty > 0:
                extra = extra + self.options.residual_penalty * fraction.pow(2).sum(-1).mean()
        if self.options.bc_weight > 0 and self.demo_samples:
            k = self.demo_samples
            gap = (self.model.unit_actions(actions[:k]) - self.model.unit_actions(b.actions[:k])).pow(2).sum(-1).mean()
            extra = extra + self.options.bc_weight * q.detach().abs().mean() * gap
            stats["bc_distance"] = gap.detach()
        return extra, stats

    def actor_q(self, features: Tensor, actions: Tensor) -> Tensor:
        """The ensemble's mean (or, ``--actor_q=min``, minimum) Q of the actor's actions in the observations of
        ``features`` (detached), with gradients to the actions only."""
        self.critics.requires_grad_(False)
        try:
            q = self.critics(features, self.model.unit_actions(actions))
            return q.min(0).values if self.options.actor_q == "min" else q.mean(0)
        finally:
            self.critics.requires_grad_(True)

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict:
        state = {
            "critics": self.critics.state_dict(),
            "target_critics": self.target_critics.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "critic_steps": self.critic_steps,
            "owed": self.owed,
            "env_steps_seen": self.env_steps_seen,
            "learning_from": self.learning_from,
            "generator": self.generator.get_state(),
            "residual_over": base_identity(self.model),  # the base's weights are the model's own ``base.*``
            "residual_base": base_copy(self.model, self.options.residual_over),
            **self.extra_state(),
        }
        if self.options.save_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.critics.load_state_dict(state["critics"])
        self.target_critics.load_state_dict(state["target_critics"])
        load_optimizer_state(self.critic_optimizer, state["critic_optimizer"])
        self.critic_steps = int(state["critic_steps"])
        self.owed = float(state["owed"])
        self.env_steps_seen = int(state["env_steps_seen"])
        self.learning_from = int(state["learning_from"])
        self.generator.set_state(state["generator"])
        self.load_extra_state(state)
        if "replay" in state and self.options.save_replay:  # --save_replay=false on resume: refilled instead
            self.replay.load_state_dict(state["replay"])


def random_shift(images: Tensor, pad: int, generator: torch.Generator | None = None) -> Tensor:
    """Each image of ``images`` [N, H, W, C] moved by its own random whole-pixel shift of up to ``pad`` pixels in
    each direction, its edge pixels repeated into the space it leaves (DrQ's augmentation: pad, then crop at random;
    the critics then value what the images show, not where it lies to the pixel). The offsets are drawn on the CPU
    from ``generator`` (the trainer's stream, kept in its checkpoints)."""
    n, height, width = images.shape[:3]
    offsets = torch.randint(0, 2 * pad + 1, (2, n, 1), generator=generator).to(images.device)
    rows = (torch.arange(height, device=images.device) + offsets[0] - pad).clamp(0, height - 1)  # [N, H]
    cols = (torch.arange(width, device=images.device) + offsets[1] - pad).clamp(0, width - 1)  # [N, W]
    batch = torch.arange(n, device=images.device)[:, None, None]
    return images[batch, rows[:, :, None], cols[:, None, :]]


def read_back(sums: dict[str, Tensor | float]) -> dict[str, float]:
    """``sums`` as floats, their tensors read from the device at once (one wait for a round of steps)."""
    held = [name for name, value in sums.items() if isinstance(value, Tensor)]
    floats = {name: float(value) for name, value in sums.items() if name not in held}
    if not held:
        return floats
    device = sums[held[0]].device
    values = torch.stack([sums[name].float().to(device) for name in held]).tolist()
    return floats | dict(zip(held, values, strict=True))


def interleave(first: NStep, second: NStep, minibatches: int) -> NStep:
    """``minibatches`` minibatches of each of ``first`` and ``second`` (one after the other in each) as
    ``minibatches`` minibatches of both, ``first``'s transitions first in each."""

    def merge(a: Tensor, b: Tensor) -> Tensor:
        return torch.cat([a.unflatten(0, (minibatches, -1)), b.unflatten(0, (minibatches, -1))], 1).flatten(0, 1)

    return NStep(
        *(
            {key: merge(a[key], b[key]) for key in a} if isinstance(a, dict) else merge(a, b)
            for a, b in zip(first, second, strict=True)
        )
    )
