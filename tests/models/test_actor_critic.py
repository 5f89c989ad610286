"""The policy's action draws: the distribution the learner assumes is the one the inference worker samples."""

import gymnasium as gym
import numpy as np
import torch

from sfengine.config import ModelConfig
from sfengine.models.actor_critic import ActorCritic
from sfengine.spaces import action_spec_from_space, obs_spec_from_space

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
