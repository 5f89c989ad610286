"""--kl_coeff through the engine: the reference is the --init_from policy, checkpoints keep it, a resume takes it back."""

from __future__ import annotations

import pytest
import torch

from helpers import run_train
from sfengine.engine.checkpoint import load_latest_checkpoint
from sfengine.models.actor_critic import is_critic_key
from sfengine.reporting.events import read_scalars


def policy_tensors(state: dict) -> dict:
    return {name: t for name, t in state.items() if not is_critic_key(name)}


@pytest.mark.slow
def test_a_fine_tuning_run_keeps_its_clone_as_the_kl_reference_across_a_resume(tmp_path):
    train_dir = tmp_path / "train_dir"
    common = ["--env=CartPole-v1", "--num_workers=1", "--learner_backend=auto"]
    clone = run_train(train_dir, "clone", *common, "--train_for_env_steps=2000")
    assert clone.returncode == 0, clone.stderr[-3000:]
    clone_policy = policy_tensors(load_latest_checkpoint(train_dir / "clone")["model"])

    for steps in (2000, 4000):  # the second run resumes the first
        args = ["--init_from=clone", "--kl_coeff=0.5", f"--train_for_env_steps={steps}"]
        result = run_train(train_dir, "tuned", *common, *args)
        assert result.returncode == 0, result.stderr[-3000:]
        saved = load_latest_checkpoint(train_dir / "tuned")
        assert saved["env_steps"] >= steps
        reference = policy_tensors(saved["ppo"]["kl_reference"])
        assert reference.keys() == clone_policy.keys()
        assert all(torch.equal(reference[name], clone_policy[name]) for name in clone_policy)
        # The policy itself has moved away from the clone, so the reference is not merely the current weights.
        assert not all(torch.equal(saved["model"][name], clone_policy[name]) for name in clone_policy)
    # The penalty was in the loss (CartPole's MLP would train in numpy, which has no penalty: the learner chose torch).
    penalties = [point.value for point in read_scalars(train_dir / "tuned")["train/kl_to_reference"]]
    assert penalties and all(value >= 0 for value in penalties) and max(penalties) > 0
