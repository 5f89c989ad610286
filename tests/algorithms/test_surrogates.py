"""Every clip mode against values and gradients worked out by hand, in and out of the clip range, for both signs
of the advantage; and the ratio diagnostics on a hand-made batch."""

import math

import pytest
import torch

from sfengine.algo import SurrogateParams, policy_surrogate, ppo_loss
from sfengine.algorithms.ppo.loss import per_sample_gradients
from sfengine.algorithms.ppo.surrogates import ratio_diagnostics


def surrogate(mode: str, ratios: list[float], advantages: list[float], **params):
    """Per-sample losses and d loss_i / d log pi_i for samples with these ratios (old log-probs 0)."""
    log_probs = torch.tensor(ratios, dtype=torch.float64).log().requires_grad_()
    result = policy_surrogate(
        mode, log_probs.exp(), torch.tensor(advantages, dtype=torch.float64), log_probs, SurrogateParams(**params)
    )
    (grads,) = torch.autograd.grad(result.loss.sum(), log_probs)
    return result.loss.detach().tolist(), grads.tolist(), result


# Ratios and advantages shared by the modes: above the range with A > 0 and A < 0, below it with A > 0 and A < 0,
# and inside it.
RATIOS = [1.5, 1.5, 0.5, 0.5, 1.1]
ADVANTAGES = [1.0, -1.0, 1.0, -1.0, 2.0]


def test_ppo_clip_cuts_the_gradient_only_where_the_ratio_left_the_range_helpfully():
    losses, grads, _ = surrogate("ppo_clip", RATIOS, ADVANTAGES)
    # -min(r A, clip(r) A): 1.2 (clipped), -1.5, 0.5, -0.8 (clipped), 2.2; gradient -r A where unclipped
    assert losses == pytest.approx([-1.2, 1.5, -0.5, 0.8, -2.2])
    assert grads == pytest.approx([0.0, 1.5, -0.5, 0.0, -2.2])


@pytest.mark.parametrize("alpha, expected_scale", [(1.0, [1 / 1.5, 1 / 1.5, 0.5, 0.5, 1 / 1.1]), (2.0, None)])
def test_soft_clip_damps_by_the_inverse_ratio_and_never_cuts(alpha, expected_scale):
    losses, grads, _ = surrogate("soft_clip", RATIOS, ADVANTAGES, soft_clip_alpha=alpha)
    scale = expected_scale or [(1 / max(r, 1 / r)) ** 2 for r in RATIOS]
    expected = [-r * a * c for r, a, c in zip(RATIOS, ADVANTAGES, scale)]
    assert losses == pytest.approx(expected)
    # The coefficient is detached: the gradient is -r A c (d r / d log pi = r), never zero.
    assert grads == pytest.approx(expected)
    assert all(g != 0 for g in grads)


def test_sapo_has_ppos_gradient_at_ratio_one_and_a_steeper_gate_for_negative_advantages():
    losses, grads, result = surrogate("sapo", [1.0, 1.0, 3.0, 5.0], [1.0, -1.0, 1.0, 1.0])
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # f(1) = 0.5 * 4 / tau: 2 for tau_pos = 1, 2 / 1.05 for tau_neg = 1.05
    assert losses[:2] == pytest.approx([-2.0, 2 / 1.05])
    # f'(1) = 1 whatever tau: -A, as PPO's -r A at r = 1
    assert grads[:2] == pytest.approx([-1.0, 1.0])
    # r = 3 (tau 1): -4 s A, gradient -4 s (1 - s) r A with s = sigmoid(2)
    s = sigmoid(2.0)
    assert losses[2] == pytest.approx(-4 * s)
    assert grads[2] == pytest.approx(-4 * s * (1 - s) * 3)
    # The gate's slope 4 s (1 - s): 1 at r = 1, 0.42 at r = 3, 0.07 at r = 5 (saturated: below 0.1)
    assert result.saturated.tolist() == [False, False, False, True]


def test_ce_gppo_keeps_ppos_value_and_a_scaled_gradient_where_ppo_clips():
    losses, grads, _ = surrogate("ce_gppo", RATIOS, ADVANTAGES, ce_gppo_beta_low=0.75, ce_gppo_beta_high=0.5)
    # The values are ppo_clip's.
    assert losses == pytest.approx([-1.2, 1.5, -0.5, 0.8, -2.2])
    # Above the range with A > 0: -beta_high (1 + eps) A = -0.6; below it with A < 0: -beta_low (1 - eps) A = 0.6;
    # elsewhere PPO's -r A.
    assert grads == pytest.approx([-0.5 * 1.2, 1.5, -0.5, 0.75 * 0.8, -2.2])


def test_ce_gppo_dual_clip_bounds_negative_advantages_far_above_the_range():
    # A < 0 at r = 2 (under c = 3): PPO's -r A with its gradient; at r = 4: the value c |A| and no gradient. A > 0
    # far above the range keeps its scaled gradient: the dual clip is for A < 0 only.
    losses, grads, _ = surrogate("ce_gppo", [2.0, 4.0, 4.0], [-1.0, -1.0, 1.0])
    assert losses == pytest.approx([2.0, 3.0, -1.2])
    assert grads == pytest.approx([2.0, 0.0, -1.2])
    # Off (0), the r = 4 sample pushes with -r A = 4.
    losses, grads, _ = surrogate("ce_gppo", [4.0], [-1.0], ce_gppo_dual_clip=0.0)
    assert (losses, grads) == (pytest.approx([4.0]), pytest.approx([4.0]))


def test_cispo_weights_log_pi_by_the_clipped_detached_ratio():
    losses, grads, _ = surrogate("cispo", [2.0, 0.5, 1.1], [1.0, -1.0, 2.0])
    # Published default: no lower bound (eps_low 1), upper 1 + 0.28.
    assert losses == pytest.approx([-1.28 * math.log(2.0), 0.5 * math.log(0.5), -1.1 * 2 * math.log(1.1)])
    assert grads == pytest.approx([-1.28, 0.5, -2.2])
    _, grads, _ = surrogate("cispo", [2.0, 0.5], [1.0, -1.0], cispo_eps_low=0.2, cispo_eps_high=0.2)
    assert grads == pytest.approx([-1.2, 0.8])


def test_diagnostics_on_a_hand_made_batch():
    ratios, advantages = [2.0, 0.5, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]
    log_probs = torch.tensor(ratios).log()
    old = torch.zeros(4)
    params = SurrogateParams()
    grads = per_sample_gradients("ppo_clip", log_probs, old, torch.tensor(advantages), params)
    # r = 2 with A > 0 is clipped, and A = 0 gives no gradient either: 2 of 4 dead
    assert grads.tolist() == pytest.approx([0.0, -0.5, -1.0, 0.0])
    result = policy_surrogate("ppo_clip", log_probs.exp(), torch.tensor(advantages), log_probs, params)
    stats = ratio_diagnostics(log_probs.exp(), log_probs, result, grads)
    assert stats["dead_grad_fraction"] == pytest.approx(0.5)
    assert stats["clip_fraction"] == pytest.approx(0.5)  # 2 and 0.5 are outside [0.8, 1.2]
    assert stats["ess"] == pytest.approx(4.5**2 / (4 * (4 + 0.25 + 1 + 1)))  # 0.81
    assert stats["approx_kl"] == pytest.approx(((1 - math.log(2)) + (-0.5 + math.log(2))) / 4)
    assert (stats["ratio_min"], stats["ratio_max"]) == (0.5, 2.0)
    # cispo's range is its own: [0, 1.28], so only r = 2 lies outside; and no sample is cut off except A = 0
    cispo = policy_surrogate("cispo", log_probs.exp(), torch.tensor(advantages), log_probs, params)
    cispo_grads = per_sample_gradients("cispo", log_probs, old, torch.tensor(advantages), params)
    cispo_stats = ratio_diagnostics(log_probs.exp(), log_probs, cispo, cispo_grads)
    assert cispo_stats["clip_fraction"] == pytest.approx(0.25)
    assert cispo_stats["dead_grad_fraction"] == pytest.approx(0.25)


def test_sapo_reports_its_saturated_gates_and_other_modes_do_not():
    common = dict(
        old_log_probs=torch.zeros(2),
        values=None,
        old_values=None,
        value_targets=None,
        entropy=torch.zeros(2),
        clip_ratio=0.2,
        value_clip=None,
        value_loss_coeff=0.5,
        entropy_coeff=0.0,
    )
    log_probs, advantages = torch.tensor([0.0, math.log(5.0)]), torch.tensor([1.0, 1.0])
    sapo = ppo_loss(log_probs, advantages=advantages, clip_mode="sapo", **common)
    assert sapo.diagnostics["sapo_saturated_fraction"] == pytest.approx(0.5)
    assert "sapo_saturated_fraction" not in ppo_loss(log_probs, advantages=advantages, **common).diagnostics


def test_ess_of_ratios_near_one_never_exceeds_one():
    # (sum r)^2 <= N sum r^2 (Cauchy-Schwarz); summed in float32, ratios within 1e-4 of 1 came out above 1 in 28 of
    # these 100 batches.
    generator = torch.Generator().manual_seed(0)
    for _ in range(100):
        ratio = 1 + 1e-4 * torch.randn(512, generator=generator)
        result = policy_surrogate("ppo_clip", ratio, torch.ones(512), ratio.log(), SurrogateParams())
        stats = ratio_diagnostics(ratio, ratio.log(), result, torch.ones(512))
        assert 0 < stats["ess"] <= 1


def extending_clip_mode() -> str:
    """The clip-mode script of docs/extending.md (the python block that starts with ``# train_clip_higher.py``)."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    (example,) = [block for block in blocks if block.startswith("# train_clip_higher.py")]
    return example


def test_the_clip_modes_the_option_check_knows_are_those_with_a_function_and_bring_their_target_kl():
    # The option check reads the names and target KLs without torch (sfengine.algorithms.ppo.options).
    from sfengine.algorithms.ppo.options import SURROGATE_TARGET_KL
    from sfengine.algorithms.ppo.surrogates import SURROGATES

    assert list(SURROGATE_TARGET_KL) == list(SURROGATES) == ["ppo_clip", "soft_clip", "sapo", "ce_gppo", "cispo"]
    assert SURROGATE_TARGET_KL["ppo_clip"] == 0 and {SURROGATE_TARGET_KL[mode] for mode in list(SURROGATES)[1:]} == {
        0.01
    }


def test_the_documented_clip_mode_registers_and_computes_its_own_loss():
    from sfengine.algorithms.ppo.surrogates import SURROGATE_TARGET_KL, SURROGATES

    try:
        exec(compile(extending_clip_mode(), "train_clip_higher.py", "exec"), {"__name__": "train_clip_higher"})
        # Inside the wider range, cut at 1.28 above it, PPO's 0.8 below it (A > 0: the ratio's own term there).
        losses, grads, result = surrogate("clip_higher", [1.25, 1.35, 0.7], [1.0, 1.0, 1.0])
        assert losses == pytest.approx([-1.25, -1.28, -0.7]) and grads == pytest.approx([-1.25, 0.0, -0.7])
        assert (result.low, result.high) == (pytest.approx(0.8), 1.28)
    finally:
        SURROGATES.pop("clip_higher", None)
        SURROGATE_TARGET_KL.pop("clip_higher", None)


@pytest.mark.slow
def test_the_documented_clip_mode_trains_through_the_engine(tmp_path, train_dir):
    import subprocess
    import sys

    script = tmp_path / "train_clip_higher.py"
    script.write_text(extending_clip_mode())
    command = [sys.executable, str(script), "--clip_mode=clip_higher", "--env=CartPole-v1", "--experiment=mine"]
    command += [f"--train_dir={train_dir}", "--train_for_env_steps=8192", "--report_every_sec=1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "clip_higher" in result.stdout  # the start block and the learner line name the run's clip mode
    assert '"clip_mode": "clip_higher"' in (train_dir / "mine" / "config.json").read_text()
