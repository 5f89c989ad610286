"""sfengine's SAC (its ``SquashedGaussianActor`` and ``SACTrainer``, any of its options) in the serial loop the
peers run: one env, uniformly random actions for the first ``--learning_starts`` env steps, then one gradient step
after each env step, acting with the policy of the step before. No rollout workers, no inference worker, no
batches: what it learns against ``benchmarks.learning``'s sfengine runs separates the trainer and its defaults
from the engine's data flow (16 envs, a policy that acts some training batches behind the learner, the gradient
steps a batch owes taken together).

    python -m benchmarks.sac_serial --env=Hopper-v5 --seed=3 --env_steps=300000 --out=run.json -- --critic_layer_norm=False

``--num_envs=16`` steps 16 envs in turn, still a gradient step after each env step and acting with the newest
policy: the engine's number of envs without its lag or its bursts. ``--rollout=32`` as well steps the envs together
for 32 steps, then hands the learner the batch of trajectories as the engine does and takes its gradient steps
together: the engine's batches and bursts without its lag.

The record is ``benchmarks.peer_record``'s (the system ``sfengine-serial``), so ``benchmarks.learning`` and the
plots read it beside the others. Each transition enters the replay as a one-step trajectory: a termination cuts
the bootstrap, a time limit bootstraps from the episode's own last observation, as in the engine.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

from benchmarks.peer_record import EpisodeLog
from sfengine.algorithms.sac.actor import SquashedGaussianActor
from sfengine.algorithms.sac.trainer import SACTrainer
from sfengine.config import parse_config
from sfengine.engine.buffers import TrajectoryBuffers
from sfengine.env.spaces import ActionSpec, ObsSpec

SYSTEM = "sfengine-serial"


def set_up(env_id: str, seed: int, options: list[str], num_envs: int, rollout: int):
    """The run's config, its envs and their action space, sfengine's actor and trainer, and the batch that carries
    ``rollout`` steps of every env to the trainer (one env and one step in the serial loop proper)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    cfg = parse_config(["--algo=sac", f"--env={env_id}", f"--rollout={rollout}", f"--seed={seed}", *options])
    envs = [gym.make(env_id) for _ in range(num_envs)]
    envs[0].action_space.seed(seed)
    space = envs[0].action_space
    obs_spec = ObsSpec({"obs": envs[0].observation_space.shape}, {"obs": torch.float32})
    action_spec = ActionSpec(False, dim=space.shape[0], low=tuple(space.low.tolist()), high=tuple(space.high.tolist()))
    model = SquashedGaussianActor.build(cfg, obs_spec, action_spec)
    rows = num_envs if rollout > 1 else 1
    batch = TrajectoryBuffers.allocate(rows, rollout, obs_spec, action_spec, shared=False, final_obs=True)
    batch.chunk_steps[:] = 1
    batch.outcomes[:] = 0.0
    return cfg, envs, space, model, SACTrainer(model, cfg), batch


def train(env_id: str, seed: int, env_steps: int, out: str, options: list[str], num_envs: int = 1) -> dict:
    cfg, envs, space, model, trainer, step = set_up(env_id, seed, options, num_envs, 1)
    log = EpisodeLog(SYSTEM, env_id, seed)
    observations = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    returns = [0.0] * num_envs
    for t in range(env_steps):
        i = t % num_envs
        env, obs = envs[i], observations[i]
        if t < cfg.algorithm_options.learning_starts:
            action = space.sample()
        else:
            with torch.inference_mode():
                params = model.policy_params({"obs": torch.as_tensor(obs, dtype=torch.float32)[None]})
                action = model.sample(params)[0][0].numpy()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        step.obs["obs"][0, 0] = torch.as_tensor(obs)
        step.obs["obs"][0, 1] = torch.as_tensor(next_obs)
        step.final_obs["obs"][0, 0] = torch.as_tensor(next_obs)
        step.actions[0, 0] = torch.as_tensor(action)
        step.rewards[0, 0] = float(reward)
        step.terminated[0, 0] = bool(terminated)
        step.truncated[0, 0] = bool(truncated) and not terminated
        trainer.train(step, 0, t + 1)
        returns[i] += float(reward)
        observations[i] = next_obs
        if terminated or truncated:
            log.episode(t + 1, returns[i])
            observations[i], _ = env.reset()
            returns[i] = 0.0
    return log.write(out, env_steps, {"sfengine_options": options, "num_envs": num_envs})


def train_in_batches(env_id: str, seed: int, env_steps: int, out: str, options: list[str], num_envs: int, rollout: int):
    """The envs step together; every ``rollout`` steps their trajectories go to the learner as one batch."""
    cfg, envs, space, model, trainer, batch = set_up(env_id, seed, options, num_envs, rollout)
    log = EpisodeLog(SYSTEM, env_id, seed)
    observations = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = [0.0] * num_envs
    t = 0
    while t < env_steps:
        batch.terminated[:] = False
        batch.truncated[:] = False
        for k in range(rollout):
            batch.obs["obs"][:, k] = torch.as_tensor(observations)
            if t < cfg.algorithm_options.learning_starts:
                actions = np.stack([space.sample() for _ in envs])
            else:
                with torch.inference_mode():
                    actions = model.sample(model.policy_params({"obs": batch.obs["obs"][:, k]}))[0].numpy()
            for i, env in enumerate(envs):
                next_obs, reward, terminated, truncated, _ = env.step(actions[i])
                t += 1
                batch.actions[i, k] = torch.as_tensor(actions[i])
                batch.rewards[i, k] = float(reward)
                batch.final_obs["obs"][i, k] = torch.as_tensor(next_obs)
                batch.terminated[i, k] = bool(terminated)
                batch.truncated[i, k] = bool(truncated) and not terminated
                returns[i] += float(reward)
                if terminated or truncated:
                    log.episode(t, returns[i])
                    next_obs, _ = env.reset()
                    returns[i] = 0.0
                observations[i] = next_obs
        batch.obs["obs"][:, rollout] = torch.as_tensor(observations)
        trainer.train(batch, 0, t)
    return log.write(out, env_steps, {"sfengine_options": options, "num_envs": num_envs, "rollout": rollout})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--env_steps", type=int, default=300_000)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--num_envs", type=int, default=1, help="envs stepped in turn (the engine runs 16)")
    parser.add_argument("--rollout", type=int, default=1, help="above 1: the envs' trajectories go in batches")
    parser.add_argument("--out", required=True)
    parser.add_argument("options", nargs="*", help="sfengine options after --, as for sfengine.train")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.rollout > 1:
        record = train_in_batches(
            args.env, args.seed, args.env_steps, args.out, args.options, args.num_envs, args.rollout
        )
    else:
        record = train(args.env, args.seed, args.env_steps, args.out, args.options, args.num_envs)
    print(f"{SYSTEM} {args.env} seed {args.seed}: return {record['final_return']:.1f} in {record['wall_sec']:.0f} s")


if __name__ == "__main__":
    main()
