"""The policy's action draws: the distribution the learner assumes is the one the inference worker samples."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from sfengine.config import ModelConfig
from sfengine.env.spaces import action_spec_from_space, obs_spec_from_space
from sfengine.models.actor_critic import ActorCritic

DRAWS = 200_000


def make_model(action_space: gym.Space, **model_options) -> ActorCritic:
    obs_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    cfg = ModelConfig(**model_options)
    return ActorCritic(obs_spec_from_space(obs_space), action_spec_from_space(action_space), cfg)


def test_discrete_draws_follow_the_policy_probabilities():
    torch.manual_seed(0)
    model = make_model(gym.spaces.Discrete(4))
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().expand(DRAWS, 4)
    actions, log_probs = model.sample(logits)
    frequencies = torch.bincount(actions, minlength=4).double() / DRAWS
    # Binomial standard error at p = 0.4 and 200k draws is about 0.0011: 0.005 is over 4 sigma.
    assert torch.allclose(frequencies, probs.double(), atol=0.005), frequencies
    assert torch.allclose(log_probs, probs.log()[actions])


def test_discrete_log_probs_of_a_draw_match_the_learner_side():
    torch.manual_seed(1)
    model = make_model(gym.spaces.Discrete(3))
    logits = torch.randn(64, 3)
    actions, log_probs = model.sample(logits)
    recomputed, _ = model.log_prob_entropy(logits, actions)
    assert torch.allclose(log_probs, recomputed)


def test_a_near_certain_action_is_always_drawn():
    model = make_model(gym.spaces.Discrete(5))
    logits = torch.full((10_000, 5), -30.0)
    logits[:, 2] = 30.0
    actions, _ = model.sample(logits)
    assert bool((actions == 2).all())


def test_gaussian_draws_have_the_policy_mean_and_std_and_matching_log_probs():
    torch.manual_seed(2)
    model = make_model(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    with torch.no_grad():
        model.log_std.fill_(np.log(0.5))
    mean = torch.tensor([0.3, -0.2]).expand(DRAWS, 2)
    actions, log_probs = model.sample(mean)
    assert torch.allclose(actions.mean(0), mean[0], atol=0.01)
    assert torch.allclose(actions.std(0), torch.tensor([0.5, 0.5]), atol=0.01)
    recomputed, _ = model.log_prob_entropy(mean[:64], actions[:64])
    assert torch.allclose(log_probs[:64], recomputed, atol=1e-5)


def test_a_bfloat16_inference_copy_acts_like_the_float32_policy():
    torch.manual_seed(3)
    obs_spec = obs_spec_from_space(gym.spaces.Box(0, 255, (84, 84, 3), np.uint8))
    action_spec = action_spec_from_space(gym.spaces.Discrete(4))
    learner = ActorCritic(obs_spec, action_spec, ModelConfig())
    with torch.no_grad():
        # The head starts with gain 0.01: logits of about 0.02, which any copy would match within a small atol.
        # Scaled up, the logits are O(1) and the log-probs of the two copies can be compared relative to their size.
        learner.policy_head.weight.mul_(200.0)
        torch.nn.init.orthogonal_(learner.value_head.weight)  # a trained critic: it starts at exactly 0
    actor = ActorCritic(obs_spec, action_spec, ModelConfig()).for_inference(torch.bfloat16)
    with torch.no_grad():
        for name, tensor in actor.state_dict().items():
            tensor.copy_(learner.state_dict()[name])  # as SharedWeights.pull does
    images = {key: torch.randint(0, 256, (32, 84, 84, 3), dtype=torch.uint8) for key in obs_spec.shapes}
    with torch.inference_mode():
        logits, values = learner(images)
        bf16_logits, bf16_values = actor(images)
    assert next(actor.encoders.parameters()).dtype == torch.bfloat16
    # Actions are drawn from float32 logits: only the CNN computes in bf16.
    assert actor.policy_head.weight.dtype == torch.float32 and actor.value_head.weight.dtype == torch.float32
    assert bf16_logits.dtype == torch.float32 and bf16_values.dtype == torch.float32
    assert logits.std() > 0.5  # the comparison below is about O(1) numbers
    log_probs, bf16_log_probs = torch.log_softmax(logits, -1), torch.log_softmax(bf16_logits, -1)
    # bf16 rounding of the CNN moves these log-probs by under 1% here; PPO's ratio feels errors of a few percent.
    assert torch.allclose(bf16_log_probs, log_probs, rtol=0.03, atol=1e-3), (bf16_log_probs - log_probs).abs().max()
    # Values cross zero, so their error is measured against the size of the whole vector.
    assert (bf16_values - values).norm() < 0.03 * values.norm()


def state_dependent_model(initial_log_std: float = 0.0) -> ActorCritic:
    return make_model(
        gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        continuous_log_std="state_dependent",
        initial_log_std=initial_log_std,
    )


def test_state_dependent_std_starts_at_initial_log_std_for_every_state():
    torch.manual_seed(4)
    model = state_dependent_model(initial_log_std=-1.0)
    # A free log-std parameter would be dead weight here: in the state dict, in checkpoints and in every publish.
    assert "log_std" not in dict(model.named_parameters())
    with torch.no_grad():
        params, _ = model({"obs": torch.rand(256, 4) * 2 - 1})
    actions = model.sample(params.repeat_interleave(2000, 0))[0].view(256, 2000, 2)
    # The first policy explores with the std the user asked for, exp(-1) = 0.37, not the head's default of 1.
    assert torch.allclose(actions.std(1), torch.full((256, 2), np.exp(-1.0)), rtol=0.1)


def test_state_dependent_std_depends_on_the_state_and_matches_a_normal():
    torch.manual_seed(5)
    model = state_dependent_model()
    with torch.no_grad():
        model.policy_head.weight.mul_(150.0)  # a trained head: the std now varies visibly with the state
        params, _ = model({"obs": torch.rand(64, 4) * 2 - 1})
    mean, log_std = params.chunk(2, dim=-1)  # the head's layout: mean, then log-std, per action dimension
    assert -5.0 < log_std.min() and log_std.max() < 2.0  # inside the clamp, so the Normal below is the policy
    assert log_std.std(0).min() > 0.1  # different states, different stds
    normal = torch.distributions.Normal(mean, log_std.exp())
    actions, sampled_log_probs = model.sample(params)
    log_probs, entropy = model.log_prob_entropy(params, actions)
    expected = normal.log_prob(actions).sum(-1)
    assert torch.allclose(sampled_log_probs, expected, atol=1e-5)
    assert torch.allclose(log_probs, expected, atol=1e-5)
    assert torch.allclose(entropy, normal.entropy().sum(-1), atol=1e-5)
    # The draws themselves follow each state's own std (two states, many draws each).
    two_states = params[torch.stack([log_std[:, 0].argmin(), log_std[:, 0].argmax()])]
    draws = model.sample(two_states.repeat_interleave(DRAWS // 2, 0))[0].view(2, DRAWS // 2, 2)
    assert torch.allclose(draws.std(1), two_states.chunk(2, dim=-1)[1].exp(), rtol=0.02)


def test_return_statistics_are_the_moments_of_every_return_seen():
    model = make_model(gym.spaces.Discrete(2))
    generator = torch.Generator().manual_seed(5)
    batches = [300.0 + 40.0 * torch.randn(8, 16, generator=generator) for _ in range(3)]
    for returns in batches:
        model.update_return_normalizer(returns)
    seen = torch.cat([b.reshape(-1) for b in batches]).double()
    stats = model.return_normalizer.stats
    assert float(stats.mean) == pytest.approx(float(seen.mean()), rel=1e-5)
    assert float(stats.var) == pytest.approx(float(seen.var(correction=0)), rel=1e-4)
    # In the critic's units those returns have zero mean and unit std, whatever their own scale.
    normalized = model.normalized_values(seen.float())
    assert float(normalized.mean()) == pytest.approx(0.0, abs=1e-3)
    assert float(normalized.std(correction=0)) == pytest.approx(1.0, abs=1e-3)


def test_moving_the_return_statistics_leaves_every_value_prediction_unchanged():
    torch.manual_seed(6)
    model = make_model(gym.spaces.Discrete(2))
    obs = {"obs": torch.randn(32, 4)}
    model.update_return_normalizer(torch.randn(64))  # the first update sets the units of the untrained head
    for returns in (torch.full((64,), 1000.0) + torch.randn(64), 0.01 * torch.rand(64), torch.randn(64) - 50.0):
        with torch.no_grad():
            before = model(obs)[1]
        model.update_return_normalizer(returns)
        with torch.no_grad():
            torch.testing.assert_close(model(obs)[1], before, rtol=1e-4, atol=1e-4)


def test_an_untrained_critic_predicts_exactly_zero_so_the_first_returns_are_the_rewards_alone():
    # With O(1) initial outputs the first batches' returns would carry the critic's noise into the return
    # statistics, which keep all history: rewards of 0.01 would then be learned in units ten times too large.
    torch.manual_seed(8)
    for actor_critic in ("shared", "separate"):
        model = make_model(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), actor_critic=actor_critic)
        with torch.no_grad():
            assert bool((model({"obs": 3 * torch.randn(64, 4)})[1] == 0).all())


def test_constant_returns_keep_the_critic_units_finite():
    # A sparse task before its first success: every return is 0, so their std is 0.
    model = make_model(gym.spaces.Discrete(2))
    model.update_return_normalizer(torch.zeros(256))
    assert float(model.normalized_values(torch.ones(1))) <= 1.0 / model.return_normalizer.MIN_STD


def test_without_return_normalisation_values_are_the_heads_output():
    model = make_model(gym.spaces.Discrete(2), normalize_returns=False)
    model.update_return_normalizer(torch.full((8,), 100.0))  # nothing to update
    obs = {"obs": torch.randn(5, 4)}
    with torch.no_grad():
        features = model.encoders["obs"](model.normalizers["obs"](obs["obs"]))
        torch.testing.assert_close(model(obs)[1], model.value_head(features).squeeze(-1))
    assert model.normalized_values(torch.tensor([3.0])) == 3.0


def test_separate_critic_has_encoders_of_its_own_and_its_loss_leaves_the_policy_untouched():
    torch.manual_seed(7)
    model = make_model(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), actor_critic="separate")
    shared = make_model(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    assert model.value_encoders is not None and shared.value_encoders is None
    obs = {"obs": torch.randn(16, 4)}
    model(obs)[1].pow(2).sum().backward()
    # The value loss reaches only the critic: no gradient in the policy's encoder or head.
    assert all(p.grad is None for p in [*model.encoders.parameters(), *model.policy_head.parameters()])
    assert all(p.grad is not None for p in model.value_encoders.parameters())
    shared(obs)[1].pow(2).sum().backward()
    assert all(p.grad is not None for p in shared.encoders.parameters())


@pytest.mark.parametrize(
    "action_space, options",
    [
        (gym.spaces.Discrete(3), {}),
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), {"actor_critic": "separate"}),
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), {"continuous_log_std": "state_dependent"}),
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), {"policy_head": "flow"}),
    ],
)
def test_the_actor_alone_gives_the_policy_parameters_of_the_full_forward_and_runs_no_critic(action_space, options):
    torch.manual_seed(8)
    model = make_model(action_space, **options)
    obs = {"obs": torch.randn(16, 4)}
    assert torch.equal(model.policy_params(obs), model(obs)[0])
    critic_calls = []
    model.value_head.register_forward_hook(lambda *_: critic_calls.append(1))
    model.policy_params(obs)  # what --kl_coeff's reference runs: the critic stays idle
    assert not critic_calls
    model(obs)
    assert critic_calls  # the full forward runs it


def test_vector_keys_share_one_mlp_so_the_policy_can_combine_them():
    # The mean action has to be the product of two keys' values. Features computed per key and joined only in the
    # linear head can express f(a) + g(b) at best, which for independent uniform a, b explains none of a*b's
    # variance (1/9); one MLP over both keys fits it.
    torch.manual_seed(3)
    obs_space = gym.spaces.Dict(
        {"a": gym.spaces.Box(-1.0, 1.0, (1,), np.float32), "b": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)}
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    model = ActorCritic(
        obs_spec_from_space(obs_space), action_spec_from_space(action_space), ModelConfig(normalize_input=False)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(1500):
        obs = {key: torch.rand(256, 1) * 2 - 1 for key in ("a", "b")}
        mean, _ = model(obs)
        loss = (mean.squeeze(-1) - obs["a"].squeeze(-1) * obs["b"].squeeze(-1)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.3 / 9, loss.item()


def test_the_vector_normaliser_keeps_the_moments_of_the_keys_side_by_side():
    obs_space = gym.spaces.Dict(
        {"b": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "a": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)}
    )
    model = ActorCritic(obs_spec_from_space(obs_space), action_spec_from_space(gym.spaces.Discrete(2)), ModelConfig())
    obs = {"a": torch.randn(1000, 1) + 5.0, "b": torch.randn(1000, 2) * 3.0}
    model.update_normalizers(obs)
    normalizer = model.normalizers["a+b"]  # keys in sorted order
    assert torch.allclose(normalizer.mean, torch.cat([obs["a"], obs["b"]], 1).mean(0), atol=1e-4)
    assert torch.allclose(normalizer.var, torch.cat([obs["a"], obs["b"]], 1).var(0, unbiased=False), atol=1e-3)
