"""The options of the off-policy algorithms (``--algo=sac`` and ``--algo=td3`` share them: the ``offpolicy`` group
of ``--help``). Defaults: the published settings where SAC's and TD3's references agree (Stable-Baselines3, CleanRL,
the TD3 paper: tau 0.005, 256-256 critics), with RLPD's critic recipe (LayerNorm, an ensemble whose target is the
minimum of a random pair) at 2 members by default. Options that only one of them reads say so."""

from __future__ import annotations

from dataclasses import dataclass

from sfengine.config import option


@dataclass
class OffPolicyOptions:
    group = "offpolicy"

    replay_size: int = option(1_000_000, "env steps the replay keeps (the oldest are overwritten)")
    replay_ratio: float = option(
        1.0,
        "gradient steps per env step (the update-to-data ratio): held by the learner, which takes the steps each "
        "batch of new data owes before it accepts the next (sampling waits while it falls behind)",
    )
    learning_starts: int = option(5000, "env steps in the replay before the first gradient step")
    initial_actions: str = option(
        "uniform",
        "how the agent acts until the learner's first gradient step: uniform (uniformly at random in the action "
        "box, as SB3, CleanRL and the TD3 paper fill their replays) or policy (the untrained policy's own actions); "
        "a run with --init_from or --residual_over acts with its policy (its base) from the start",
        ("uniform", "policy"),
    )
    n_step: int = option(1, "steps of reward before the bootstrap (stops at an episode's end)")
    num_critics: int = option(2, "Q critics in the ensemble (one batched network)")
    critic_subset: int = option(2, "the target is the minimum over this many critics drawn at random per minibatch")
    critic_hidden_sizes: list[int] = option([256, 256], "the critics' hidden layer widths")
    critic_layer_norm: bool = option(True, "LayerNorm after each hidden layer of the critics")
    critic_learning_rate: float = option(
        3e-4,
        "Adam learning rate of the critics (and of SAC's temperature); unset, --algo=sac takes 1e-3 (CleanRL's "
        "critic rate: it learned HalfCheetah-v5 and sparse_reach faster than 3e-4, benchmarks/README.md)",
    )
    tau: float = option(0.005, "target critics: Polyak averaging rate per gradient step")
    actor_q: str = option(
        "mean",
        "the Q the actor climbs: the ensemble's mean (REDQ's and RLPD's) or its minimum (SAC's as SB3 and CleanRL "
        "write it, over their 2 critics)",
        ("mean", "min"),
    )
    actor_delay: int = option(
        1, "update the actor (and SAC's temperature) every this many critic steps; unset, --algo=td3 takes 2"
    )
    init_temperature: float = option(
        0.1,
        "sac: the entropy temperature alpha at the start (1, SB3's and CleanRL's start, made sparse_reach's success "
        "a loss: its entropy bonus outpaid the one reward of a success that ends the episode)",
    )
    target_entropy: float = option(
        0.0,
        "sac: the entropy the temperature is learned to hold; 0: -(action dimensions), the usual choice, and for a "
        "residual that less log(1 / --residual_scale) a dimension (the correction's smaller box)",
    )
    learn_temperature: bool = option(True, "sac: learn alpha to --target_entropy; False: keep --init_temperature")
    exploration_noise: float = option(
        0.1, "td3: std of the Gaussian noise added to the actor's action while acting, in half-ranges of the box"
    )
    squash_penalty: float = option(
        0.0,
        "td3: actor loss: this x the mean squared action before its tanh (keeps the actor out of tanh's flat ends, "
        "where its gradient vanishes and a corner of the box can hold it for good; 1e-3 is a common weight)",
    )
    target_noise: float = option(0.2, "td3: std of the noise on the target action (target policy smoothing)")
    target_noise_clip: float = option(0.5, "td3: the target action's noise is clipped to [-this, this]")
    image_shift: float = option(
        0.05,
        "image observations: each image of a minibatch moves at random by up to this fraction of its side (rounded "
        "to whole pixels) in each direction before the critics and the actor read it (DrQ's augmentation: 4 pixels "
        "at 84); 0: as stored",
    )
    demo_ratio: float = option(
        0.5,
        "with --demos: the share of each minibatch drawn from the demonstrations, the rest from the online replay "
        "(0.5: RLPD's symmetric sampling)",
    )
    residual_over: str = option(
        "",
        "learn a bounded correction on top of this frozen policy: a checkpoint of sfengine.pretrain or of a "
        "training run (a file, or an experiment's latest), or a registered model; the base acts, the actor adds "
        "--residual_scale at most, starting at 0",
    )
    residual_scale: float = option(
        0.1, "the correction's bound, in half-ranges of the env's action box, in every dimension"
    )
    residual_base_action: str = option(
        "sample",
        "the base's action under the correction: sample (its distribution, as it was evaluated at its best: a "
        "Gaussian clone's sampled actions succeeded more often than its mean) or mode",
        ("sample", "mode"),
    )
    residual_base_device: str = option(
        "",
        "the device the frozen base runs on, where it differs from the policy's (cuda:1: a large base on a GPU of "
        "its own; cpu); every process that acts or learns keeps a copy there. Default: with the policy",
    )
    ibrl: bool = option(
        False,
        "td3 with --residual_over: the base proposes beside the actor and the critics choose (IBRL's rule): the "
        "agent acts with whichever of the base's action and the corrected one the critics value more, and the "
        "critics bootstrap from the better of the two",
    )
    critic_warmup_updates: int = option(
        0, "gradient steps of the critics alone before the actor's first (a critic of the base first, then the actor)"
    )
    residual_penalty: float = option(
        0.0, "actor loss: this x the mean squared correction, in units of its bound (keeps it small where Q is flat)"
    )
    bc_weight: float = option(
        0.0,
        "with --demos, actor loss: this x mean|Q| x the squared distance of the actor's action from the "
        "demonstrated one on the minibatch's demonstrations (TD3+BC's term; its alpha of 2.5 is 0.4 here); unset, "
        "a run with both --residual_over and --demos takes 0.4",
    )
    cuda_graphs: bool = option(
        False,
        "with --device=cuda, record the gradient step once as CUDA graphs and replay it (one launch a step instead "
        "of about a thousand); one rank, vector observations, a constant rate, the critics' whole ensemble in the "
        "target; a run that cannot says why at start. Not yet measured on a GPU: off by default",
    )
    save_replay: bool = option(
        False,
        "keep the replay in each checkpoint (its size in memory again on disk), so a resumed run goes on with it; "
        "without, a resume refills it and takes no gradient step until --learning_starts env steps are back in "
        "(--save_replay=false on resuming such a run drops the replay it kept, to change --replay_size or --rollout)",
    )
