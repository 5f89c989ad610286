"""Action chunks (``--action_chunk=K``) through the real engine: the env receives a chunk's actions in order, an
episode may end inside a chunk, and the learner's entries are chunks with their discounted reward sums.

``chunk_probe`` observes the steps taken in its 6-step episodes and pays each step the first component of its
action, so with K = 4 every episode is a chunk of 4 steps and one of 2 that ends it. A user script wraps the
trainer to record every training batch it receives.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from helpers import read_summary, run_train, train_command

CHUNK, GAMMA = 4, 0.5  # a discount far from 1, so a chunk's reward tells the order of its actions
RECORDING_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    import torch

    from sfengine.algorithms.ppo import trainer as ppo_trainer
    from sfengine.train import main

    real = ppo_trainer.PPOTrainer.train


    def recording(self, batch, *args, **kwargs):
        with torch.no_grad():
            final_value = float(self.model.values({{"obs": torch.tensor([[6.0]])}})[0])  # V(the 6th step's obs)
        record = {{name: getattr(batch, name).tolist() for name in (
            "actions", "rewards", "terminated", "truncated", "truncation_values", "chunk_steps")}}
        record.update(obs=batch.obs["obs"][..., 0].tolist(), final_value=final_value)
        with open({log!r}, "a") as f:
            f.write(json.dumps(record) + "\\n")
        return real(self, batch, *args, **kwargs)


    # Top level: spawned processes import this module too, so the learner process records as well.
    ppo_trainer.PPOTrainer.train = recording

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


def run_recorded(tmp_path: Path, train_dir: Path, env: str) -> tuple[list[dict], subprocess.CompletedProcess]:
    log, script = tmp_path / "batches.jsonl", tmp_path / "record_batches.py"
    script.write_text(RECORDING_SCRIPT.format(log=str(log)))
    args = [
        f"--env={env}",
        f"--action_chunk={CHUNK}",
        f"--gamma={GAMMA}",
        "--num_workers=2",
        "--num_envs_per_worker=4",
        "--rollout=8",
        "--batch_size=64",
        "--num_batches_per_epoch=1",
        "--async_rl=false",  # the values written at a truncation come from the weights the learner then holds
        "--train_for_env_steps=3000",
    ]
    command = train_command(train_dir, "chunks", *args)
    command[1:3] = [str(script)]  # the script instead of -m sfengine.train
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in log.read_text().splitlines()], result


def chunk_reward(actions: np.ndarray, steps: int) -> float:
    """What a chunk's first `steps` env steps pay, discounted to its first: sum_j gamma^j clip(a_j[0])."""
    first_components = np.clip(actions.reshape(CHUNK, 2)[:steps, 0], -1.0, 1.0)
    return float(np.sum(first_components * GAMMA ** np.arange(steps)))


@pytest.mark.parametrize("env", ["chunk_probe", "chunk_probe_truncated"])
@pytest.mark.slow
def test_chunks_reach_the_env_in_order_episodes_end_inside_them_and_env_steps_count_their_steps(
    tmp_path, train_dir, env
):
    batches, _ = run_recorded(tmp_path, train_dir, env)
    # Env steps count the chunks' steps (3 per entry on average here, not 1), and episodes their length.
    summary = read_summary(train_dir, "chunks")
    trained_steps = sum(int(np.array(batch["chunk_steps"])[:, :-1].sum()) for batch in batches)
    assert summary["env_steps"] == trained_steps == 3 * 64 * len(batches)
    assert summary["episode_len_mean"] == 6
    assert len(batches) >= 4
    entries = 0
    for batch in batches:
        obs, actions = np.array(batch["obs"]), np.array(batch["actions"])
        assert actions.shape[2] == CHUNK * 2  # one policy output holds the chunk's 4 env actions of 2 dims
        for b in range(obs.shape[0]):
            for t in range(obs.shape[1] - 1):
                entries += 1
                first_of_episode = obs[b, t] == 0
                # Each entry starts a chunk: at the episode's start (step 0) or after its first chunk (step 4).
                assert obs[b, t] in (0, CHUNK), obs[b]
                steps = CHUNK if first_of_episode else 6 - CHUNK
                assert batch["chunk_steps"][b][t] == steps
                assert batch["rewards"][b][t] == pytest.approx(chunk_reward(actions[b, t], steps), abs=1e-5)
                assert obs[b, t + 1] == (CHUNK if first_of_episode else 0)  # the next chunk, or a new episode
                ended = not first_of_episode
                if env == "chunk_probe":
                    assert (batch["terminated"][b][t], batch["truncated"][b][t]) == (ended, False)
                else:
                    assert (batch["terminated"][b][t], batch["truncated"][b][t]) == (False, ended)
                    if ended:
                        # Cut after 2 of the chunk's 4 steps: V(final obs) is gamma^2 away, and the learner
                        # discounts a successor entry by gamma^4, so the value is stored scaled by gamma^-2.
                        expected = batch["final_value"] * GAMMA ** (2 - CHUNK)
                        assert batch["truncation_values"][b][t] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    assert entries >= 4 * 64


def test_a_chunk_needs_continuous_actions(train_dir):
    result = run_train(train_dir, "discrete", "--env=CartPole-v1", "--action_chunk=4")
    assert result.returncode == 2
    assert "--action_chunk=4 needs a continuous (Box) action space" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
