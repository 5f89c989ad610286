"""A user's own model through ``register_model`` and ``--model``: the README's example, run as it stands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

from helpers import run_train

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    """The README's user-model script (the python block that starts with ``# train_layernorm.py``)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (example,) = [block for block in blocks if block.startswith("# train_layernorm.py")]
    return example


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


def test_an_unregistered_model_is_a_one_line_error(train_dir):
    result = run_train(train_dir, "unknown", "--model=no_such_model", "--env=CartPole-v1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "sfengine.train: error: --model='no_such_model' is not registered (known: actor_critic); call "
        "sfengine.register_model at the top level of your training script"
    ]
