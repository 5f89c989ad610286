"""FlowSAR through the real engine (``--algo=flow_sar --policy_head=flow``): the inference workers self-annotate every
step with the reference policy the learner publishes, and the learner's batches carry exactly that annotation.

A user script wraps the trainer: for every batch it checks the stored ``v_old`` against the velocity of the
reference policy of the version that acted (kept by the script after every update), and records the result.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap

import pytest
import torch

from helpers import reached_target, read_summary, run_train, train_command
from sfengine.algorithms.flow_sar.sar import self_annotate
from sfengine.config import ConfigError, ModelConfig, parse_config
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic
from sfengine.reporting.events import read_scalars

FLOW_SAR = ["--algo=flow_sar", "--policy_head=flow", "--group_outcome=success", "--task_group_size=1"]
CHECKING_SCRIPT = textwrap.dedent(
    """
    import copy
    import json
    import sys

    import torch

    from sfengine.algorithms.flow_sar import trainer as flow_sar_trainer
    from sfengine.train import main

    real, references = flow_sar_trainer.FlowSARTrainer.train, {{}}


    def checking(self, batch, learner_version, env_steps):
        if not references:  # the reference the run started with: version 0's, or on resume the checkpoint's
            references[learner_version] = copy.deepcopy(self.reference)
        n = batch.num_steps
        versions, worst, checked = batch.versions[:n], 0.0, 0
        with torch.no_grad():
            for version in versions.unique().tolist():
                if version not in references:
                    continue  # acted by a version this script did not see published (cannot happen in order)
                rows = (versions == version).nonzero().flatten()
                reference = references[version]
                actions, times, noise = batch.actions[rows], batch.flow_times[rows], batch.flow_noise[rows]
                x_t = (1 - times[:, None]) * actions + times[:, None] * noise
                obs = {{key: o[rows] for key, o in batch.obs.items()}}
                expected = reference.flow_head.velocity(x_t, times, reference.policy_features(obs))
                worst = max(worst, float((expected - batch.v_old[rows]).abs().max()))
                checked += len(rows)
        record = {{
            "checked": checked, "steps": n, "worst": worst,
            "times": [float(batch.flow_times[:n].min()), float(batch.flow_times[:n].max())],
            "errors_min": float(batch.recon_errors[:n].min()), "version": learner_version,
        }}
        stats = real(self, batch, learner_version, env_steps)
        references[learner_version + 1] = copy.deepcopy(self.reference)  # published with the next version
        with open({log!r}, "a") as f:
            f.write(json.dumps(record) + "\\n")
        return stats


    # Top level: spawned processes import this module too, so the learner process checks as well.
    flow_sar_trainer.FlowSARTrainer.train = checking

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_every_step_is_annotated_by_the_reference_of_the_version_that_acted(tmp_path, train_dir):
    log, script = tmp_path / "checks.jsonl", tmp_path / "check_annotations.py"
    script.write_text(CHECKING_SCRIPT.format(log=str(log)))
    args = [*FLOW_SAR, "--env=sparse_reach", "--action_chunk=2", "--train_for_env_steps=12000"]
    command = train_command(train_dir, "flow_sar", *args, "--flow_sar_ema_schedule=fixed", "--flow_sar_ema_beta=0.5")
    command[1:3] = [str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) >= 3, records  # batches of about 4000 env steps (2048 chunks of 2)
    assert sum(r["checked"] for r in records) == sum(r["steps"] for r in records)  # every step's version was seen
    assert max(r["worst"] for r in records) < 1e-4, records
    assert all(0.2 <= r["times"][0] and r["times"][1] <= 0.8 for r in records)  # t ~ U[t_min, t_max]
    assert all(r["errors_min"] >= 0.0 for r in records)
    assert "FlowSAR credit, no critic" in result.stdout
    # Resumed, the reference goes on from the checkpoint's: the first batches are annotated by it, and the EMA's
    # update count continues (one per policy version).
    log.unlink()
    result = subprocess.run([*command, "--train_for_env_steps=24000"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = [json.loads(line) for line in log.read_text().splitlines()]
    assert resumed and resumed[0]["version"] == records[-1]["version"] + 1
    assert sum(r["checked"] for r in resumed) == sum(r["steps"] for r in resumed)
    assert max(r["worst"] for r in resumed) < 1e-4, resumed
    checkpoint = max((train_dir / "flow_sar" / "checkpoints").glob("checkpoint_*.pt"))
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["flow_sar"]["updates"] == saved["policy_version"] > resumed[0]["version"]


def test_self_annotation_is_the_reference_reconstruction_and_velocity():
    obs_spec = ObsSpec({"obs": (3,)}, {"obs": torch.float32})
    action_spec = ActionSpec(False, dim=4, low=(-1.0,) * 4, high=(1.0,) * 4, chunk=2)
    torch.manual_seed(0)
    reference = ActorCritic(obs_spec, action_spec, ModelConfig(policy_head="flow"), critic=False)
    with torch.no_grad():
        reference.flow_head.net[-1].weight.normal_()  # a velocity of O(1), not the near-zero start
    obs, actions = {"obs": torch.randn(5, 3)}, torch.randn(5, 4)
    torch.manual_seed(1)
    annotation = self_annotate(reference, obs, actions, tau_mid=0.5, t_min=0.2, t_max=0.8)
    # The same draws, in the documented order: the reconstruction's noise, then t, then the training point's noise.
    torch.manual_seed(1)
    tau_noise, times, noise = torch.randn(5, 4), 0.2 + 0.6 * torch.rand(5), torch.randn(5, 4)
    with torch.no_grad():
        features = reference.policy_features(obs)
        x_mid = 0.5 * actions + 0.5 * tau_noise
        reconstructed = x_mid - 0.5 * reference.flow_head.velocity(x_mid, torch.full((5,), 0.5), features)
        x_t = (1 - times[:, None]) * actions + times[:, None] * noise
        v_old = reference.flow_head.velocity(x_t, times, features)
    assert torch.allclose(annotation.errors, (actions - reconstructed).pow(2).sum(-1), atol=1e-6)
    assert torch.allclose(annotation.times, times) and torch.allclose(annotation.noise, noise)
    assert torch.allclose(annotation.v_old, v_old, atol=1e-6)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algo=flow_sar", "--group_outcome=success"], "--algo=flow_sar trains a flow-matching policy"),
        (["--policy_head=flow"], "--policy_head=flow has no likelihood"),
        (["--algo=flow_sar", "--policy_head=flow"], "add --group_outcome=success"),
        (
            [*FLOW_SAR, "--advantage=rloo"],
            "--advantage (in the command line) is an option of --algo=ppo, not of --algo=flow_sar",
        ),
        ([*FLOW_SAR, "--flow_sar_t_min=0.9", "--flow_sar_t_max=0.5"], "--flow_sar_t_min <= --flow_sar_t_max"),
    ],
)
def test_flow_options_that_cannot_train_are_config_errors(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(args)


def test_a_flow_policy_on_a_discrete_env_is_a_one_line_error(train_dir):
    result = run_train(train_dir, "discrete", *FLOW_SAR, "--env=CartPole-v1")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_flow_sar_raises_the_success_rate_of_a_sparse_reach_policy(train_dir):
    # sparse_reach: reward 1 on success (which ends the episode), 40-step episodes. The untrained flow policy (its
    # chunks are close to N(0, I) noise) succeeds 0.2-0.33 of the time at the first report; with these settings
    # seeds 1-3 reached 0.85-0.89 by 34-46k steps (then wandered between 0.57 and 0.98), the default seed 0.68 by
    # 80k. In a fresh clone's whole suite (2026-11-26) the default seed, with the lag of a loaded machine, was at
    # 0.47 at 100k and still rising, where alone it passes in 6 of 6 runs. Asserted: 0.6 within 150k.
    args = ["--cfg=flow_sar", "--env=sparse_reach", "--train_for_env_steps=150000", "--stop_at_success=0.6"]
    result = run_train(train_dir, "reach", *args)  # the from-scratch preset
    assert result.returncode == 0, result.stderr[-3000:]
    success = [p.value for p in read_scalars(train_dir / "reach")["episodes/success_rate"]]
    assert success[0] < 0.5, success
    assert reached_target(read_summary(train_dir, "reach"), "stop_at_success=0.6"), success
