"""The engine's option groups, one dataclass each: what every run has, whatever its env and algorithm. (An env's
or an algorithm's own options are declared beside it: ``sfengine.config.core.declare_options``.)"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sfengine.config.options import option


@dataclass
class EnvConfig:
    env: str = option("CartPole-v1", "environment: a registered sfengine env or any gymnasium id")
    seed: int = option(0, "base random seed; each env gets its own seed derived from it")
    max_episode_steps: int = option(0, "truncate episodes after this many steps (0: the env's own limit)")
    tasks: list[int] = option([], "multi-task envs: train on only these task indices (default: every task)")
    task_group_size: int = option(
        1, "multi-task envs: each (task, init state) is handed out this many times in a row (RLOO/GRPO groups)"
    )
    group_outcome: str = option(
        "return",
        "groups of episodes (rloo, grpo, flow_sar): an episode's outcome is its return, or its success (0/1)",
        ("return", "success"),
    )
    task_sampling: str = option(
        "round_robin",
        "multi-task envs: tasks in turn, or drawn with probability (recent failures + 1); init states always cycle",
        ("round_robin", "curriculum"),
    )
    curriculum_window: int = option(20, "curriculum: recent episodes of each task whose failures weigh its draw")


@dataclass
class SamplerConfig:
    num_workers: int = option(2, "rollout worker processes", auto=True)
    num_envs_per_worker: int = option(8, "environments stepped by each rollout worker", auto=True)
    worker_num_splits: int = option(
        2, "groups of envs per worker; while one group waits for actions the other steps (double buffering)"
    )
    num_inference_workers: int = option(
        1,
        "inference worker processes that batch requests from all rollout workers; 0: each rollout worker runs the "
        "policy itself (no inference process: for small CPU policies on slow envs with a core per rollout worker)",
        auto=True,
    )
    inference_dtype: str = option(
        "float32",
        "precision of the image (CNN) encoders in inference workers; bfloat16 cuts their CPU cost by about 40 "
        "percent where the CPU has native bf16 (AVX512-BF16, AMX). The learner always trains in float32",
        ("float32", "bfloat16"),
    )
    inference_backend: str = option(
        "auto",
        "how inference workers run the policy: numpy for MLP policies over vector observations on CPU (less CPU "
        "per batch than torch at inference batch sizes: benchmarks/README.md), torch for everything else; auto picks",
        ("auto", "torch", "numpy"),
    )
    rollout: int = option(32, "env steps per trajectory handed to the learner")
    serial_mode: bool = option(False, "run every component on one event loop in one process (debugging, tiny machines)")
    async_rl: bool = option(
        True, "collect while the learner trains (policy lag > 0); False: on-policy, samplers wait for each update"
    )


@dataclass
class LearnerConfig:
    batch_size: int = option(1024, "samples per minibatch (one optimiser step)")
    num_batches_per_epoch: int = option(2, "minibatches per epoch; one training batch = batch_size x this")
    num_epochs: int = option(4, "passes over each training batch")
    learning_rate: float = option(1e-3, "Adam learning rate")
    lr_schedule: str = option("constant", "learning-rate schedule over train_for_env_steps", ("constant", "linear"))
    adam_eps: float = option(
        1e-6,
        "Adam epsilon of every optimiser of the run (the policy, critics, temperature); unset, --algo=sac and td3 "
        "take 1e-8",
    )
    gamma: float = option(0.99, "discount factor")
    gae_lambda: float = option(0.95, "GAE lambda")
    entropy_coeff: float = option(0.003, "weight of the entropy bonus")
    max_grad_norm: float = option(4.0, "gradient norm clip (0: off)")
    reward_scale: float = option(
        1.0,
        "multiply rewards by this before learning (stats keep the raw reward); rarely needed with --normalize_returns",
    )
    reward_clip: float = option(0.0, "clip scaled rewards to [-x, x] (0: off)")
    learner_threads: int = option(
        1,
        "torch CPU threads in the learner process (rollout and inference use 1); only on cores nothing else "
        "needs: threads that wait for a busy core make each update several times slower",
    )
    learner_backend: str = option(
        "auto",
        "how the learner runs its minibatch steps: numpy for MLP policies over vector observations on CPU with "
        "--clip_mode=ppo_clip (the same loss and Adam step in less time at small minibatches: benchmarks/README.md), "
        "torch for everything else; auto picks",
        ("auto", "torch", "numpy"),
    )
    device: str = option("cpu", "device of the learner and inference workers", ("cpu", "cuda"))
    demos: str = option(
        "",
        "demonstration files (python -m sfengine.demos writes them; LIBERO's published files), comma-separated: "
        "sfengine.pretrain clones them, --algo=sac and td3 keep them in the replay (--demo_ratio of each minibatch)",
    )
    algo: str = option(
        "ppo",
        "ppo (the policy surrogate of --clip_mode with the advantages of --advantage), flow_sar (a flow-matching "
        "policy, --policy_head=flow, trained by FlowSAR on whole episodes and their success: no critic, no "
        "likelihoods; its options are in the flow_sar group), sac or td3 (off-policy, from a replay: their options "
        "are in the offpolicy group), or a name given to sfengine.register_algorithm",
    )


@dataclass
class ModelConfig:
    model: str = option(
        "actor_critic",
        "the policy model: the built-in actor_critic (CNN and MLP encoders, the heads below), or a name given to "
        "sfengine.register_model (a model of your own, an ActorCritic subclass)",
    )
    hidden_sizes: list[int] = option([64, 64], "MLP encoder layer widths for vector observations")
    activation: str = option("tanh", "activation of the encoders", ("tanh", "relu", "elu"))
    normalize_input: bool = option(True, "running mean/std normalisation of vector observations")
    input_statistics: str = option(
        "running",
        "the normalisation's statistics: running (merged from every training batch) or frozen (kept as they start; "
        "use it with --init_from, so a clone's inputs keep the scale it learnt them in)",
        ("running", "frozen"),
    )
    continuous_log_std: str = option(
        "state_independent",
        "Gaussian head: log-std as a free parameter, or predicted from the state",
        ("state_independent", "state_dependent"),
    )
    initial_log_std: float = option(0.0, "initial log-std of the Gaussian head")
    actor_critic: str = option(
        "shared",
        "shared: one encoder feeds the policy and value heads; separate: the critic has encoders of its own, so a "
        "large value loss cannot take over the policy's features (the reference PPOs' choice for continuous control)",
        ("shared", "separate"),
    )
    normalize_returns: bool = option(
        True,
        "the critic learns returns scaled by their running mean and std, so no env needs a hand-set --reward_scale "
        "(sparse 0/1 successes and returns of thousands alike); the value clip is then in units of that std",
    )
    policy_head: str = option(
        "gaussian",
        "continuous actions: a Gaussian (PPO's likelihoods), or flow: a flow-matching velocity network integrated "
        "by --flow_steps Euler steps from noise (for --algo=flow_sar; no likelihood)",
        ("gaussian", "flow"),
    )
    flow_steps: int = option(10, "flow head: Euler steps from noise (t = 1) to the action chunk (t = 0)")
    flow_hidden_sizes: list[int] = option([128, 128], "flow head: the velocity network's layer widths (SiLU)")
    action_chunk: int = option(
        1,
        "actions the policy emits per inference request (continuous actions): the env steps through the chunk, then "
        "the policy sees the next observation, as VLA policies act (pi0: 5-10). A trajectory entry is one chunk: "
        "--rollout and --batch_size count chunks, rewards inside a chunk are summed with discounting, and gamma "
        "applies per env step",
    )


@dataclass
class RunConfig:
    experiment: str = option("default_experiment", "experiment name; files go to <train_dir>/<experiment>")
    train_dir: str = option("train_dir", "directory that holds experiment directories")
    restart_behavior: str = option(
        "resume",
        "resume: continue from the latest checkpoint; restart: move the old run aside and start over; "
        "overwrite: delete the old run and start over",
        ("resume", "restart", "overwrite"),
    )
    train_for_env_steps: int = option(300_000, "stop after this many env steps (counted across resumes)")
    train_for_seconds: float = option(0.0, "stop after this many seconds of this run (0: no limit)")
    stop_at_return: float = option(
        math.inf, "stop once the mean return of the last --stats_window episodes reaches this (inf: never)"
    )
    stop_at_success: float = option(
        math.inf, "stop once the success rate of the last --stats_window episodes reaches this, 0-1 (inf: never)"
    )
    save_every_sec: float = option(120.0, "seconds between checkpoints")
    keep_checkpoints: int = option(3, "newest checkpoints kept")
    report_every_sec: float = option(5.0, "seconds between status lines")
    hang_timeout_sec: float = option(
        120.0, "a rollout or inference worker silent this long is hung: print its stack and respawn it (0: off)"
    )
    startup_timeout_sec: float = option(
        600.0,
        "a rollout or inference worker still in its start-up (building its envs or model) this long, or 3x the "
        "longest start-up so far if longer, is hung: print its stack and respawn it; a learner still in its start-up "
        "this long stops the run, as does the start's check of one env in the main process (0: off)",
    )
    max_respawns: int = option(
        3,
        "respawns of one rollout or inference worker allowed within --respawn_window_sec; one more stops the run "
        "(0: a dead or hung worker stops the run)",
    )
    respawn_window_sec: float = option(3600.0, "the window --max_respawns counts in")
    stats_window: int = option(100, "episodes averaged for the return, length and success statistics")
    init_from: str = option(
        "",
        "start from the weights and observation statistics of an experiment in --train_dir (its latest checkpoint) "
        "or of a checkpoint file, e.g. a sfengine.pretrain run; the network options come from that run's config.json; "
        "the optimiser, step count, return statistics and task sequence start fresh. An experiment that resumes "
        "from a checkpoint of its own ignores it",
    )


@dataclass
class EvalConfig:
    eval_episodes: int = option(10, "single-task envs: episodes per evaluation, with seeds 0..N-1")
    eval_deterministic: bool = option(True, "evaluate with the action distribution's mode; False: sample actions")
    eval_every_env_steps: int = option(
        0, "training: evaluate the current weights every this many env steps, in a separate process (0: off)"
    )
    eval_episodes_per_task: int = option(
        0,
        "training evaluator, multi-task envs: episodes of each task per evaluation (0: every init state); the "
        "init states cycle across evaluations, so over time every one is seen",
    )
    eval_at_end: bool = option(
        True,
        "training evaluator: also evaluate the final weights once training's workers have stopped, when the run "
        "ends by its step or time limit or a --stop_at target (not after a signal or a failure)",
    )


@dataclass
class DebugConfig:
    """Knobs for measuring and testing the engine, not for training a policy."""

    benchmark: bool = option(False, "sampling only: collect and discard trajectories, no training")
    chaos_kill_every_sec: float = option(
        0.0,
        "fault injection: SIGKILL a random rollout or inference worker this often, to check that a run "
        "survives it (respawns it causes do not count towards --max_respawns; 0: off)",
    )


GROUPS: dict[str, type] = {
    "env": EnvConfig,
    "sampler": SamplerConfig,
    "learner": LearnerConfig,
    "model": ModelConfig,
    "run": RunConfig,
    "eval": EvalConfig,
    "debug": DebugConfig,
}
