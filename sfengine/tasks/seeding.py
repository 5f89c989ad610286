"""Every random stream of a run, derived from ``--seed`` in one place, so that a run is reproducible and no two
streams share a seed. Each stream is the base seed times a large prime, plus an offset of its own:

    rollout envs          seed * P + global env index          (global worker x envs per worker + env index)
    training evaluator    seed * P - 1 - env index             (below every rollout env's)
    inference worker i    seed * P + i
    a worker that acts    seed * P + 1000 + worker             (apart from the inference workers')
    task sequence         seed * 7919 + rank                   (curriculum draws: + position, times P)
    single-task groups    GROUP_SEED_OFFSET + seed * P * GROUP_SEEDS_PER_RANK + group   (sfengine.tasks.sequence)
    a component process   torch's, numpy's and random's global streams from SeedSequence(seed, rank, env steps
                          resumed from, crc32(process name), its start count): what a model samples in torch
                          (SAC's and TD3's actions), a respawn a stream of its own (sfengine.engine.event_loop)
                          (an evaluation's: SeedSequence(seed, the policy's version, name, start count))

Changing any of these changes every run's envs, task order and actions: the tests pin the sequences.
"""

from __future__ import annotations

SEED_STRIDE = 1_000_003  # P: a prime above any env count, so streams of neighbouring base seeds never meet
TASK_SEQUENCE_STRIDE = 7919
ACTING_WORKER_OFFSET = 1000


def rollout_env_seed(base_seed: int, global_worker: int, envs_per_worker: int, env_index: int) -> int:
    """A rollout env's seed: distinct across every env of every rank."""
    return base_seed * SEED_STRIDE + global_worker * envs_per_worker + env_index


def evaluator_env_seed(base_seed: int, env_index: int) -> int:
    return base_seed * SEED_STRIDE - 1 - env_index


def inference_seed(base_seed: int, index: int) -> int:
    return base_seed * SEED_STRIDE + index


def acting_worker_seed(base_seed: int, worker: int) -> int:
    """The policy's sampling seed in a rollout worker that acts itself (--num_inference_workers=0)."""
    return base_seed * SEED_STRIDE + ACTING_WORKER_OFFSET + worker


def task_sequence_seed(base_seed: int, rank: int) -> int:
    return base_seed * TASK_SEQUENCE_STRIDE + rank


def curriculum_draw_seed(sequence_seed: int, position: int) -> int:
    """The seed of the curriculum's task draw at ``position``: the same in any process that draws it."""
    return sequence_seed * SEED_STRIDE + position


def component_seed(base_seed: int, rank: int, resumed_from: int) -> tuple[int, ...]:
    """What a training run's component processes seed their global random streams from, with their names; a
    resumed run's differ from its start's, so a resume does not replay the noise the run began with."""
    return (base_seed, rank, resumed_from)


def evaluation_component_seed(base_seed: int, policy_version: int) -> tuple[int, ...]:
    """What an evaluation's component processes seed their global random streams from, with their names."""
    return (base_seed, policy_version)
