"""The peer "CleanRL sac_continuous_action": its published algorithm and defaults, restated for this benchmark
(the ``cleanrl`` package cannot live beside gymnasium 1.x; see ``peer_cleanrl``).

- one env with episode statistics; uniformly random actions for the first 5,000 steps, then learning every step;
- two Q networks and their targets, 256-256 ReLU without normalisation; an actor 256-256 ReLU with a mean head and
  a log-std head squashed into [-5, 2] by tanh; actions tanh-squashed into the box, the log-density corrected;
- the critics' target: the smaller target Q of the next action less alpha log pi, cut only by a termination (a
  time limit bootstraps from the episode's last observation); Adam at 1e-3 for the critics, 3e-4 for the actor;
- the actor and the temperature every second step, twice each time (so one actor step per env step on average),
  the actor maximising the smaller of the two Qs less alpha log pi; alpha learned (Adam 1e-3, from 1) to an
  entropy of -(action dimensions); Polyak averaging at 0.005 every step; minibatches of 256, gamma 0.99.

    python -m benchmarks.peer_cleanrl_sac --env=Hopper-v5 --seed=1 --env_steps=300000 --out=run.json
"""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.peer_record import EpisodeLog, peer_main

SETTINGS = dict(
    random_steps=5000,
    batch_size=256,
    gamma=0.99,
    tau=0.005,
    q_lr=1e-3,
    policy_lr=3e-4,
    policy_every=2,
    log_std_range=(-5.0, 2.0),
    hidden=256,
)


def mlp(inputs: int, outputs: int) -> nn.Sequential:
    hidden = SETTINGS["hidden"]
    return nn.Sequential(
        nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, outputs)
    )


class Policy(nn.Module):
    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.dim = len(low)
        self.net = mlp(obs_dim, 2 * self.dim)
        self.register_buffer("center", torch.tensor((high + low) / 2, dtype=torch.float32))
        self.register_buffer("half_range", torch.tensor((high - low) / 2, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action in the box and its log-density."""
        mean, raw = self.net(obs).split(self.dim, -1)
        low, high = SETTINGS["log_std_range"]
        log_std = low + (high - low) * (torch.tanh(raw) + 1) / 2
        u = mean + torch.randn_like(mean) * log_std.exp()
        squashed = torch.tanh(u)
        density = -0.5 * ((u - mean) / log_std.exp()).pow(2) - log_std - 0.5 * np.log(2 * np.pi)
        density = density - torch.log(self.half_range * (1 - squashed.pow(2)) + 1e-6)
        return self.center + self.half_range * squashed, density.sum(-1)


def train(env_id: str, seed: int, env_steps: int, out: str) -> dict:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    env.action_space.seed(seed)
    obs_dim, low, high = env.observation_space.shape[0], env.action_space.low, env.action_space.high
    act_dim = len(low)
    policy = Policy(obs_dim, low, high)
    critics = [mlp(obs_dim + act_dim, 1) for _ in range(2)]
    targets = [mlp(obs_dim + act_dim, 1) for _ in range(2)]
    for target, critic in zip(targets, critics, strict=True):
        target.load_state_dict(critic.state_dict())
    q_optimizer = torch.optim.Adam([p for c in critics for p in c.parameters()], lr=SETTINGS["q_lr"])
    policy_optimizer = torch.optim.Adam(policy.parameters(), lr=SETTINGS["policy_lr"])
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=SETTINGS["q_lr"])
    target_entropy = -float(act_dim)
    size = env_steps
    buffer_obs = np.zeros((size, obs_dim), np.float32)
    buffer_next = np.zeros((size, obs_dim), np.float32)
    buffer_actions = np.zeros((size, act_dim), np.float32)
    buffer_rewards = np.zeros(size, np.float32)
    buffer_terminal = np.zeros(size, np.float32)
    log = EpisodeLog("cleanrl", env_id, seed)

    def q_of(networks, obs, actions):
        inputs = torch.cat([obs, actions], -1)
        return torch.stack([net(inputs).squeeze(-1) for net in networks])

    obs, _ = env.reset(seed=seed)
    for step in range(env_steps):
        if step < SETTINGS["random_steps"]:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = policy(torch.as_tensor(obs, dtype=torch.float32)[None])[0][0].numpy()
        next_obs, reward, terminated, truncated, info = env.step(action)
        buffer_obs[step], buffer_next[step], buffer_actions[step] = obs, next_obs, action
        buffer_rewards[step], buffer_terminal[step] = reward, float(terminated)
        if terminated or truncated:
            log.episode(step + 1, info["episode"]["r"])
            next_obs, _ = env.reset()
        obs = next_obs
        if step < SETTINGS["random_steps"]:
            continue
        index = np.random.randint(0, step + 1, SETTINGS["batch_size"])
        b_obs, b_next = torch.from_numpy(buffer_obs[index]), torch.from_numpy(buffer_next[index])
        b_actions = torch.from_numpy(buffer_actions[index])
        b_rewards, b_terminal = torch.from_numpy(buffer_rewards[index]), torch.from_numpy(buffer_terminal[index])
        alpha = log_alpha.exp().item()
        with torch.no_grad():
            next_actions, next_log_pi = policy(b_next)
            next_v = q_of(targets, b_next, next_actions).min(0).values - alpha * next_log_pi
            target_q = b_rewards + (1 - b_terminal) * SETTINGS["gamma"] * next_v
        q_loss = F.mse_loss(q_of(critics, b_obs, b_actions), target_q.expand(2, -1), reduction="none").mean(1).sum()
        q_optimizer.zero_grad()
        q_loss.backward()
        q_optimizer.step()
        if step % SETTINGS["policy_every"] == 0:
            for _ in range(SETTINGS["policy_every"]):
                actions, log_pi = policy(b_obs)
                policy_loss = (log_alpha.exp().detach() * log_pi - q_of(critics, b_obs, actions).min(0).values).mean()
                policy_optimizer.zero_grad()
                policy_loss.backward()
                policy_optimizer.step()
                with torch.no_grad():
                    _, log_pi = policy(b_obs)
                alpha_loss = -(log_alpha.exp() * (log_pi + target_entropy)).mean()
                alpha_optimizer.zero_grad()
                alpha_loss.backward()
                alpha_optimizer.step()
        with torch.no_grad():
            for target, critic in zip(targets, critics, strict=True):
                for t, p in zip(target.parameters(), critic.parameters(), strict=True):
                    t.mul_(1 - SETTINGS["tau"]).add_(p, alpha=SETTINGS["tau"])
    return log.write(out, env_steps, SETTINGS)


if __name__ == "__main__":
    peer_main("cleanrl", train, __doc__.splitlines()[0])
