"""A user's own model through ``register_model`` and ``--model``: the example in docs/extending.md, run as it stands."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import run_train

EXTENDING = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def readme_example() -> str:
    """The user-model script of docs/extending.md (the python block that starts with ``# train_layernorm.py``)."""
    blocks = re.findall(r"```python\n(.*?)```", EXTENDING.read_text(), flags=re.S)
    (example,) = [block for block in blocks if block.startswith("# train_layernorm.py")]
    return example


@pytest.mark.slow
def test_the_readme_example_trains_its_own_model(tmp_path, train_dir):
    script = tmp_path / "train_layernorm.py"
    script.write_text(readme_example())
    args = ["--model=layernorm_mlp", "--env=CartPole-v1", "--num_workers=2", "--num_envs_per_worker=4"]
    command = [sys.executable, str(script), f"--train_dir={train_dir}", "--experiment=mine", *args]
    result = subprocess.run([*command, "--train_for_env_steps=4096"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (checkpoint,) = sorted((train_dir / "mine" / "checkpoints").glob("checkpoint_*.pt"))[-1:]
    saved = torch.load(checkpoint, weights_only=True)
    # The user's encoder was what the learner trained (a LayerNorm after the first layer), and it trained.
    assert saved["model"]["encoders.obs.1.weight"].shape == (64,)
    assert saved["policy_version"] >= 2
    assert not torch.equal(saved["model"]["encoders.obs.1.weight"], torch.ones(64))


@pytest.mark.slow
def test_an_unregistered_model_is_a_one_line_error(train_dir):
    result = run_train(train_dir, "unknown", "--model=no_such_model", "--env=CartPole-v1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "sfengine.train: error: --model='no_such_model' is not registered (known: actor_critic); call "
        "sfengine.register_model at the top level of your training script"
    ]


ALWAYS_LEFT_SCRIPT = textwrap.dedent(
    """
    import sys

    import torch

    from sfengine import ActorCritic, register_model
    from sfengine.train import main


    class AlwaysLeft(ActorCritic):
        \"\"\"The built-in MLP and heads, with a sample of its own: CartPole's push to the left, every step.\"\"\"

        def sample(self, params):
            log_p = torch.log_softmax(params, dim=-1)
            return torch.zeros(params.shape[0], dtype=torch.int64), log_p[:, 0]


    def make_always_left(cfg, obs_spec, action_spec):
        return AlwaysLeft(obs_spec, action_spec, cfg.model, critic=cfg.needs_critic)


    register_model("always_left", make_always_left)

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_registered_model_acts_with_its_own_sample_under_the_default_options(tmp_path, train_dir):
    # The numpy policy computes the built-in ActorCritic: a subclass's sample would be skipped there, and the
    # samples would come from a policy other than the one PPO trains.
    script = tmp_path / "train_always_left.py"
    script.write_text(ALWAYS_LEFT_SCRIPT)
    args = ["--model=always_left", "--env=CartPole-v1", "--num_workers=1", "--num_envs_per_worker=4"]
    command = [sys.executable, str(script), f"--train_dir={train_dir}", "--experiment=left", *args]
    result = subprocess.run([*command, "--train_for_env_steps=2048"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((train_dir / "left" / "summary.json").read_text())
    # Pushing left every step drops CartPole's pole in 8-10 steps; a random policy keeps it up for about 22.
    assert summary["episode_len_mean"] < 15, summary["episode_len_mean"]


def test_numpy_inference_for_a_registered_model_is_a_one_line_error(tmp_path, train_dir):
    script = tmp_path / "train_always_left.py"
    script.write_text(ALWAYS_LEFT_SCRIPT)
    command = [sys.executable, str(script), f"--train_dir={train_dir}", "--experiment=left", "--model=always_left"]
    result = subprocess.run(
        [*command, "--env=CartPole-v1", "--inference_backend=numpy"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "sfengine.train: error: --inference_backend=numpy cannot run this policy: a registered model (AlwaysLeft) "
        "may compute its own way, which numpy would skip; use --inference_backend=auto"
    ]
