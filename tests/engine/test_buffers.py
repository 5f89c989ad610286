import multiprocessing

import pytest
import torch

from sfengine.config import Config
from sfengine.engine.buffers import SharedBuffers, SharedWeights, TrajectoryBuffers, buffers_per_worker
from sfengine.env.spaces import ActionSpec, ObsSpec
from sfengine.models.actor_critic import ActorCritic

OBS = ObsSpec(shapes={"image": (8, 8, 3), "state": (5,)}, dtypes={"image": torch.uint8, "state": torch.float32})
DISCRETE = ActionSpec(discrete=True, num_actions=3)


def small_config(**sampler) -> Config:
    cfg = Config()
    cfg.sampler.num_workers, cfg.sampler.num_envs_per_worker, cfg.sampler.worker_num_splits = 2, 4, 2
    cfg.sampler.rollout = 8
    cfg.learner.batch_size, cfg.learner.num_batches_per_epoch = 64, 1
    for name, value in sampler.items():
        setattr(cfg.sampler, name, value)
    return cfg


def test_trajectory_buffers_have_rollout_plus_one_entries_and_keep_image_dtype():
    cfg = small_config()
    buffers = SharedBuffers.allocate(cfg, OBS, DISCRETE)
    traj = buffers.trajectories
    num = buffers.buffers_per_worker * 2
    assert traj.obs["image"].shape == (num, 9, 8, 8, 3) and traj.obs["image"].dtype == torch.uint8
    assert traj.obs["state"].shape == (num, 9, 5)
    assert traj.actions.shape == (num, 9) and traj.actions.dtype == torch.int64
    assert all(t.is_shared() for t in traj.tensors().values())
    assert buffers.splits.buffer_ids.shape == (4, 2)  # 2 workers x 2 splits, 2 envs per split


def test_each_worker_owns_a_disjoint_block_of_buffer_ids():
    buffers = SharedBuffers.allocate(small_config(), OBS, DISCRETE)
    ids0, ids1 = buffers.worker_buffer_ids(0), buffers.worker_buffer_ids(1)
    assert not set(ids0) & set(ids1)
    assert all(buffers.owner_of(i) == 0 for i in ids0) and all(buffers.owner_of(i) == 1 for i in ids1)


def test_free_list_covers_current_rollouts_plus_two_training_batches():
    # 8 envs in all; a training batch is 64 samples = 8 trajectories of 8 steps = one round of every env.
    cfg = small_config()
    per_worker = buffers_per_worker(cfg)
    total = per_worker * cfg.sampler.num_workers
    envs = cfg.sampler.num_workers * cfg.sampler.num_envs_per_worker
    assert total >= envs + 2 * cfg.trajectories_per_training_batch
    # A batch larger than one round of all envs needs proportionally more buffers.
    cfg.learner.batch_size = 256
    assert buffers_per_worker(cfg) * 2 >= envs + 2 * cfg.trajectories_per_training_batch


def test_copy_rows_gathers_whole_trajectories():
    source = TrajectoryBuffers.allocate(6, 4, OBS, DISCRETE, shared=True)
    for i in range(6):
        source.rewards[i] = i
        source.obs["image"][i] = i
    batch = TrajectoryBuffers.allocate(2, 4, OBS, DISCRETE, shared=False)
    batch.copy_rows_(source, torch.tensor([4, 1]))
    assert batch.rewards[:, 0].tolist() == [4.0, 1.0]
    assert batch.obs["image"][0].unique().tolist() == [4]


def _read_weights_in_child(weights: SharedWeights, queue) -> None:
    queue.put((int(weights.version[0]), float(weights.tensors["value_head.bias"][0])))


def test_published_weights_and_version_reach_a_spawned_process():
    ctx = multiprocessing.get_context("spawn")
    model = ActorCritic(OBS, DISCRETE, Config().model)
    weights = SharedWeights.allocate(model)
    with torch.no_grad():
        model.value_head.bias.fill_(3.5)
    weights.publish(model, version=7)
    queue = ctx.Queue()
    child = ctx.Process(target=_read_weights_in_child, args=(weights, queue))
    child.start()
    assert queue.get(timeout=60) == (7, 3.5)
    child.join(30)
    # And the pull side: a fresh model takes the published weights.
    other = ActorCritic(OBS, DISCRETE, Config().model)
    assert weights.pull(other) == 7
    assert float(other.value_head.bias.detach()[0]) == 3.5


def _publish_alternating(weights: SharedWeights, model: ActorCritic, times: int) -> None:
    for version in range(1, times + 1):
        with torch.no_grad():
            for t in model.state_dict().values():
                t.fill_(version)
        weights.publish(model, version)


@pytest.mark.slow
def test_a_pull_during_publishes_never_mixes_two_versions():
    # Every publish fills every tensor with its version number: a pull that copied half of one publish and half
    # of the next would hold two different values, or a version that does not match them. (300 publishes: a pull
    # that skips its sequence check, or a publish that does not end its write, fails within them.)
    ctx = multiprocessing.get_context("spawn")
    model = ActorCritic(OBS, DISCRETE, Config().model)
    with torch.no_grad():
        for t in model.state_dict().values():
            t.zero_()  # version 0
    weights = SharedWeights.allocate(model)
    publisher = ctx.Process(target=_publish_alternating, args=(weights, model, 300))
    publisher.start()
    reader = ActorCritic(OBS, DISCRETE, Config().model)
    pulls = set()
    while publisher.is_alive() or not pulls:
        version = weights.pull(reader)
        values = torch.cat([t.flatten().float() for t in reader.state_dict().values()]).unique()
        assert values.tolist() == [float(version)], (version, values[:5])
        pulls.add(version)
    publisher.join(60)
    assert publisher.exitcode == 0
    assert len(pulls) > 10  # the reader really ran while the publisher wrote


class _OverFrozen(torch.nn.Module):
    """A model whose ``base`` never changes in training (as a residual policy's)."""

    frozen_prefixes = ("base.",)

    def __init__(self):
        super().__init__()
        self.base, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)


def test_a_frozen_base_is_shared_once_and_pulled_once_by_each_model():
    learner, actor = _OverFrozen(), _OverFrozen()
    weights = SharedWeights.allocate(learner)
    assert weights.frozen == {"base.weight", "base.bias"}
    base_at_start = learner.base.weight.detach().clone()
    with torch.no_grad():
        for t in learner.state_dict().values():
            t.fill_(2.0)
    weights.publish(learner, version=1)
    # The head is published; the base is not copied again (it never changes in a run).
    assert float(weights.tensors["head.bias"][0]) == 2.0
    assert torch.equal(weights.tensors["base.weight"], base_at_start)
    # A model's first pull takes everything, the base included; its later pulls leave its base alone.
    assert weights.pull(actor) == 1
    assert torch.equal(actor.base.weight, base_at_start) and float(actor.head.bias[0]) == 2.0
    with torch.no_grad():
        actor.base.weight.fill_(7.0)
    weights.pull(actor)
    assert float(actor.base.weight[0, 0]) == 7.0 and float(actor.head.bias[0]) == 2.0
