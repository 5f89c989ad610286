"""The peer "Stable-Baselines3 PPO with the RL Zoo's tuned hyperparameters" (stable-baselines3 from PyPI).

The hyperparameters are the RL Baselines3 Zoo's tuned entries for the MuJoCo envs (``hyperparams/ppo.yml``,
HalfCheetah and Hopper; the zoo tuned them on v3 and uses the same values for v4). ``normalize: true`` in the zoo
means ``VecNormalize`` of observations and rewards with the algorithm's gamma, which is what runs here.

    python -m benchmarks.peer_sb3 --env=Hopper-v5 --seed=1 --env_steps=1000000 --out=run.json
"""

from __future__ import annotations

from torch import nn

from benchmarks.peer_record import EpisodeLog, peer_main

ZOO_NETWORK = dict(log_std_init=-2, ortho_init=False, activation_fn="relu", net_arch=dict(pi=[256, 256], vf=[256, 256]))
ZOO_HYPERPARAMETERS = {
    "HalfCheetah": dict(
        n_steps=512,
        batch_size=64,
        gamma=0.98,
        learning_rate=2.0633e-05,
        ent_coef=0.000401762,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.92,
        max_grad_norm=0.8,
        vf_coef=0.58096,
    ),
    "Hopper": dict(
        n_steps=512,
        batch_size=32,
        gamma=0.999,
        learning_rate=9.80828e-05,
        ent_coef=0.00229519,
        clip_range=0.2,
        n_epochs=5,
        gae_lambda=0.99,
        max_grad_norm=0.7,
        vf_coef=0.835671,
    ),
}


def train(env_id: str, seed: int, env_steps: int, out: str) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    family = env_id.split("-")[0]
    if family not in ZOO_HYPERPARAMETERS:
        raise SystemExit(f"--env={env_id}: the zoo's tuned settings here cover {sorted(ZOO_HYPERPARAMETERS)}")
    hyper = ZOO_HYPERPARAMETERS[family]
    log = EpisodeLog("sb3", env_id, seed)

    class RecordEpisodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # Monitor's record of the finished episode, raw rewards
                    log.episode(self.num_timesteps, info["episode"]["r"])
            return True

    venv = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed), gamma=hyper["gamma"])
    network = dict(ZOO_NETWORK, activation_fn=nn.ReLU)
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu", policy_kwargs=network, verbose=0, **hyper)
    model.learn(total_timesteps=env_steps, callback=RecordEpisodes())
    return log.write(out, model.num_timesteps, dict(hyper, **ZOO_NETWORK))


if __name__ == "__main__":
    peer_main("sb3", train, __doc__.splitlines()[0])
