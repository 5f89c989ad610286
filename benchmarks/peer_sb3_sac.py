"""The peer "Stable-Baselines3 SAC with the RL Zoo's settings" (stable-baselines3 from PyPI).

The RL Zoo's MuJoCo entry for SAC (``hyperparams/sac.yml``: HalfCheetah, Hopper, Walker2d, Ant) is SB3's defaults
with 10,000 random steps before learning: one env, a replay of 1M steps, minibatches of 256, Adam at 3e-4, 256-256
ReLU networks, two critics, tau 0.005, gamma 0.99, one gradient step per env step, the entropy coefficient learned
to -(action dimensions) from 1.

    python -m benchmarks.peer_sb3_sac --env=Hopper-v5 --seed=1 --env_steps=300000 --out=run.json
"""

from __future__ import annotations

from benchmarks.peer_record import EpisodeLog, peer_main

ZOO_SETTINGS = {"learning_starts": 10_000}


def train(env_id: str, seed: int, env_steps: int, out: str) -> dict:
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    log = EpisodeLog("sb3", env_id, seed)

    class RecordEpisodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # Monitor's record of the finished episode
                    log.episode(self.num_timesteps, info["episode"]["r"])
            return True

    model = SAC(
        "MlpPolicy", make_vec_env(env_id, n_envs=1, seed=seed), seed=seed, device="cpu", verbose=0, **ZOO_SETTINGS
    )
    model.learn(total_timesteps=env_steps, callback=RecordEpisodes())
    return log.write(out, model.num_timesteps, dict(ZOO_SETTINGS, algo="SAC"))


if __name__ == "__main__":
    peer_main("sb3", train, __doc__.splitlines()[0])
