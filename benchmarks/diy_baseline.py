"""The do-it-yourself baseline: what a user writes without an engine. ``gymnasium.vector.AsyncVectorEnv`` steps
``num_workers x num_envs_per_worker`` envs in subprocesses, and one loop alternates: a forward pass for every
env, one vector step, and after ``rollout`` steps a PPO update on the batch. The model, the PPO update
(``sfengine``'s own ``PPOTrainer``) and every size are those of the engine run it is compared with, so only the
architecture differs: here, sampling waits for learning and every step waits for the slowest env.

    python -m benchmarks.diy_baseline --seconds=30 --warmup=5 --env=CartPole-v1 --num_workers=2 \\
        --num_envs_per_worker=8 --rollout=32 --batch_size=1024 --num_batches_per_epoch=1 --num_epochs=1

Prints one JSON line: ``fps`` over ``--seconds`` after ``--warmup`` seconds, learning included. Options this
script does not declare are ``python -m sfengine.train`` options.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from functools import partial

import gymnasium as gym
import numpy as np
import torch

from sfengine.algorithms.ppo.trainer import PPOTrainer
from sfengine.config import Config, parse_config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.registry import env_context, resolve_env_factory
from sfengine.env.spaces import action_spec_from_space, obs_as_dict, obs_spec_from_space
from sfengine.models.actor_critic import ActorCritic
from sfengine.tasks.seeding import rollout_env_seed


def make_env(cfg: Config, index: int) -> gym.Env:
    factory = resolve_env_factory(cfg.env.env)
    return factory(env_context(cfg, 0, index, rollout_env_seed(cfg.env.seed, 0, 0, index)))


def train_loop(cfg: Config, warmup: float, seconds: float) -> dict:
    torch.set_num_threads(1)
    num_envs = cfg.sampler.num_workers * cfg.sampler.num_envs_per_worker
    envs = gym.vector.AsyncVectorEnv(
        [partial(make_env, cfg, i) for i in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    obs_spec = obs_spec_from_space(envs.single_observation_space)
    action_spec = action_spec_from_space(envs.single_action_space)
    model = ActorCritic(obs_spec, action_spec, cfg.model)
    trainer = PPOTrainer(model, cfg)
    rollout = cfg.sampler.rollout
    batch = TrajectoryBuffers.allocate(num_envs, rollout, obs_spec, action_spec, shared=False)
    obs, _ = envs.reset(seed=cfg.env.seed)
    steps = version = 0
    started = time.perf_counter()
    measured_from, counted = started + warmup, 0
    while time.perf_counter() < measured_from + seconds:
        for t in range(rollout + 1):
            for key, value in obs_as_dict(obs).items():
                batch.obs[key][:, t] = torch.as_tensor(value)
            with torch.inference_mode():
                out = model.act({key: o[:, t] for key, o in batch.obs.items()})
            batch.actions[:, t], batch.log_probs[:, t], batch.values[:, t] = out.actions, out.log_probs, out.values
            batch.versions[:, t] = version
            if t == rollout:
                break  # entry T only bootstraps
            obs, rewards, terminated, truncated, _ = envs.step(out.actions.numpy())
            batch.rewards[:, t] = torch.as_tensor(rewards, dtype=torch.float32)
            batch.terminated[:, t] = torch.as_tensor(terminated)
            # A DIY loop rarely bootstraps truncations properly; it costs nothing here either way.
            batch.truncated[:, t] = torch.as_tensor(np.logical_and(truncated, np.logical_not(terminated)))
            steps += num_envs
            if measured_from <= time.perf_counter() < measured_from + seconds:
                counted += num_envs
        trainer.train(batch, version, steps)
        version += 1
    envs.close()
    return {"fps": round(counted / seconds, 1), "env_steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    args, train_args = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = parse_config([*train_args, f"--train_dir={tmp}"])
    print(json.dumps(train_loop(cfg, args.warmup, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
