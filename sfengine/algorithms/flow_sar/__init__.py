"""FlowSAR (``--algo=flow_sar``): self-annotated credit assignment for flow-matching policies
(``--policy_head=flow``), trained on whole episodes and their success, with no critic and no likelihood.

The acting side annotates every step it takes with the reference policy (an EMA of the policy, published beside
it): the reconstruction error ``e_i`` and a training point ``(t, eps, v_old)`` (``annotate``, stored in the
trajectory buffers' annotation fields). The update (``trainer.FlowSARTrainer``) turns the errors into per-step
credit within each episode and fits the mirror branches; the math is ``sfengine.algorithms.flow_sar.sar``. Options: the
``flow_sar`` group, defaults as published.
"""

from __future__ import annotations

from dataclasses import dataclass

from sfengine.algorithms import GROUPS, Algorithm, imported_on_call, register_algorithm
from sfengine.config import Config, ConfigError, option


@dataclass
class FlowSAROptions:
    """FlowSAR's options. Defaults are the published ones."""

    group = "flow_sar"

    flow_sar_beta: float = option(1.0, "mirror branches' trust region: v+- = (1 -+ beta) v_old +- beta v_theta")
    flow_sar_temperature: float = option(0.5, "credit weights' softmax temperature (smaller: more extreme weights)")
    flow_sar_tau_mid: float = option(0.5, "self-annotation: the noise level a chunk is reconstructed from")
    flow_sar_ema_schedule: str = option(
        "linear",
        "the reference policy's EMA: fixed (retention --flow_sar_ema_beta) or linear (retention "
        "min(--flow_sar_ema_eta_rate x update, --flow_sar_ema_eta_max): close tracking first, more held back later)",
        ("fixed", "linear"),
    )
    flow_sar_ema_beta: float = option(0.995, "fixed EMA: the reference keeps this share of itself per update")
    flow_sar_ema_eta_rate: float = option(0.001, "linear EMA: growth of the retention per update")
    flow_sar_ema_eta_max: float = option(0.5, "linear EMA: the retention's ceiling")
    flow_sar_energy_type: str = option(
        "mse", "branch energies ||v+- - u||^2 (mse, the ODE view) or scaled by 1/(2t) (sde)", ("mse", "sde")
    )
    flow_sar_loss_variant: str = option(
        "softplus_kl",
        "mse_branch: w [R E+ + (1 - R) E-]; softplus_kl: w softplus(y (E+ - E-) / 2) + kl_coeff ||v_theta - v_old||^2",
        ("mse_branch", "softplus_kl"),
    )
    flow_sar_kl_coeff: float = option(1.0, "softplus_kl: weight of the penalty ||v_theta - v_old||^2")
    flow_sar_t_min: float = option(0.2, "training: the flow time t is drawn from U[t_min, t_max]")
    flow_sar_t_max: float = option(0.8, "training: the flow time's upper bound")
    flow_sar_w_min: float = option(0.0, "credit weights are clipped to [w_min, w_max], then renormalised (0: no floor)")
    flow_sar_w_max: float = option(1.0, "the credit weights' ceiling (1: none)")


def validate(cfg: Config) -> None:
    sar = cfg.algorithm_options
    if cfg.model.policy_head != "flow":
        raise ConfigError("--algo=flow_sar trains a flow-matching policy: add --policy_head=flow")
    if cfg.env.group_outcome != "success":
        raise ConfigError(
            "--algo=flow_sar weighs each episode by its success (R = 0 or 1): add --group_outcome=success (the env "
            "reports info['success'] at an episode's end)"
        )
    if not cfg.sampler.async_rl:
        raise ConfigError("--algo=flow_sar trains on whole episodes, which end at their own times: use --async_rl=true")
    if not 0 < sar.flow_sar_t_min <= sar.flow_sar_t_max <= 1 or not 0 < sar.flow_sar_tau_mid <= 1:
        raise ConfigError("--flow_sar_t_min <= --flow_sar_t_max and --flow_sar_tau_mid must lie in (0, 1]")
    if sar.flow_sar_temperature <= 0 or not 0 <= sar.flow_sar_w_min < sar.flow_sar_w_max:
        raise ConfigError("--flow_sar_temperature must be positive and 0 <= --flow_sar_w_min < --flow_sar_w_max")


def annotate(cfg: Config, reference, obs, actions):
    """The acting side's self-annotation of the steps it just took (the buffers' ANNOTATION_FIELDS, in order)."""
    from sfengine.algorithms.flow_sar.sar import self_annotate  # torch: imported where a policy acts

    sar = cfg.algorithm_options
    return self_annotate(reference, obs, actions, sar.flow_sar_tau_mid, sar.flow_sar_t_min, sar.flow_sar_t_max)


register_algorithm(
    "flow_sar",
    Algorithm(
        trainer=imported_on_call("sfengine.algorithms.flow_sar.trainer:FlowSARTrainer"),
        options=FlowSAROptions,
        validate=validate,
        critic=False,
        batch=GROUPS,
        annotate=annotate,
        title="FlowSAR",
        describe=lambda cfg: f"FlowSAR credit, no critic, groups of {cfg.env.task_group_size}",
    ),
)
