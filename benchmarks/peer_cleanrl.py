"""The peer "CleanRL ppo_continuous_action": its published algorithm and defaults, rewritten for this benchmark.

The ``cleanrl`` package on PyPI pins gym 0.23-era dependencies that cannot live beside gymnasium 1.x, so the
algorithm is restated here from its documentation, step for step:

- one env, wrapped as CleanRL wraps it: episode statistics on the raw rewards, actions clipped to the box,
  observations normalised by running statistics and clipped to [-10, 10], rewards divided by a running std of
  the discounted return and clipped to [-10, 10];
- separate actor and critic MLPs 64-64 tanh, orthogonal init (gain sqrt 2, actor output 0.01, critic output 1),
  a state-independent log-std starting at 0;
- 2048 steps per update, GAE (gamma 0.99, lambda 0.95) where a truncated episode counts as ended (as in
  CleanRL), 10 epochs of 32 minibatches, advantages normalised per minibatch, clip 0.2 on the ratio and on the
  value, value coefficient 0.5, no entropy bonus, grad-norm clip 0.5, Adam (eps 1e-5) at 3e-4 annealed to 0.

    python -m benchmarks.peer_cleanrl --env=Hopper-v5 --seed=1 --env_steps=1000000 --out=run.json
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from benchmarks.peer_record import EpisodeLog, peer_main

SETTINGS = dict(
    learning_rate=3e-4,
    steps_per_update=2048,
    num_minibatches=32,
    epochs=10,
    gamma=0.99,
    gae_lambda=0.95,
    clip=0.2,
    value_coef=0.5,
    entropy_coef=0.0,
    max_grad_norm=0.5,
    adam_eps=1e-5,
    hidden=64,
)


def wrapped_env(env_id: str, gamma: float) -> gym.Env:
    env = gym.make(env_id)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.ClipAction(env)
    env = gym.wrappers.NormalizeObservation(env)
    env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
    env = gym.wrappers.NormalizeReward(env, gamma=gamma)
    return gym.wrappers.TransformReward(env, lambda reward: float(np.clip(reward, -10, 10)))


def linear(fan_in: int, fan_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(fan_in, fan_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def tanh_mlp(obs_dim: int, hidden: int, out_dim: int, out_gain: float) -> nn.Sequential:
    return nn.Sequential(
        linear(obs_dim, hidden, math.sqrt(2)),
        nn.Tanh(),
        linear(hidden, hidden, math.sqrt(2)),
        nn.Tanh(),
        linear(hidden, out_dim, out_gain),
    )


class SeparateActorCritic(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: int):
        super().__init__()
        self.critic = tanh_mlp(obs_dim, hidden, 1, 1.0)
        self.actor_mean = tanh_mlp(obs_dim, hidden, act_dim, 0.01)
        self.actor_log_std = nn.Parameter(torch.zeros(act_dim))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Normal:
        mean = self.actor_mean(obs)
        return torch.distributions.Normal(mean, self.actor_log_std.expand_as(mean).exp())


def train(env_id: str, seed: int, env_steps: int, out: str) -> dict:
    s = SETTINGS
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.backends.cudnn.deterministic = True
    env = wrapped_env(env_id, s["gamma"])
    env.action_space.seed(seed)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    agent = SeparateActorCritic(obs_dim, act_dim, s["hidden"])
    optimizer = torch.optim.Adam(agent.parameters(), lr=s["learning_rate"], eps=s["adam_eps"])
    n = s["steps_per_update"]
    minibatch = n // s["num_minibatches"]
    num_updates = env_steps // n
    obs_buf = torch.zeros(n, obs_dim)
    act_buf = torch.zeros(n, act_dim)
    logp_buf, rew_buf, done_buf, val_buf = (torch.zeros(n) for _ in range(4))
    log = EpisodeLog("cleanrl", env_id, seed)

    next_obs = torch.as_tensor(env.reset(seed=seed)[0], dtype=torch.float32)
    next_done = 0.0
    global_step = 0
    for update in range(num_updates):
        optimizer.param_groups[0]["lr"] = (1.0 - update / num_updates) * s["learning_rate"]
        for t in range(n):
            global_step += 1
            obs_buf[t], done_buf[t] = next_obs, next_done
            with torch.no_grad():
                dist = agent.distribution(next_obs)
                action = dist.sample()
                logp_buf[t] = dist.log_prob(action).sum()
                val_buf[t] = agent.value(next_obs)
            act_buf[t] = action
            obs, reward, terminated, truncated, info = env.step(action.numpy())
            rew_buf[t] = float(reward)
            next_done = float(terminated or truncated)
            if next_done:
                log.episode(global_step, float(info["episode"]["r"]))
                obs, _ = env.reset()
            next_obs = torch.as_tensor(obs, dtype=torch.float32)

        with torch.no_grad():
            next_value = agent.value(next_obs)
            advantages = torch.zeros(n)
            running = 0.0
            for t in reversed(range(n)):
                after_value, not_done = (
                    (next_value, 1.0 - next_done) if t == n - 1 else (val_buf[t + 1], 1.0 - done_buf[t + 1])
                )
                delta = rew_buf[t] + s["gamma"] * after_value * not_done - val_buf[t]
                running = delta + s["gamma"] * s["gae_lambda"] * not_done * running
                advantages[t] = running
            returns = advantages + val_buf

        for _ in range(s["epochs"]):
            order = torch.randperm(n)
            for start in range(0, n, minibatch):
                idx = order[start : start + minibatch]
                dist = agent.distribution(obs_buf[idx])
                new_logp = dist.log_prob(act_buf[idx]).sum(-1)
                entropy = dist.entropy().sum(-1)
                ratio = (new_logp - logp_buf[idx]).exp()
                adv = advantages[idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - s["clip"], 1 + s["clip"])).mean()
                new_value = agent.value(obs_buf[idx])
                clipped_value = val_buf[idx] + (new_value - val_buf[idx]).clamp(-s["clip"], s["clip"])
                value_loss = (
                    0.5 * torch.max((new_value - returns[idx]) ** 2, (clipped_value - returns[idx]) ** 2).mean()
                )
                loss = policy_loss - s["entropy_coef"] * entropy.mean() + s["value_coef"] * value_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), s["max_grad_norm"])
                optimizer.step()
    return log.write(out, global_step, SETTINGS)


if __name__ == "__main__":
    peer_main("cleanrl", train, __doc__.splitlines()[0])
