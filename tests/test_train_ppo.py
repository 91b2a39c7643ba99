"""PPO's pieces (GAE over model tokens only, clipped losses, Monte-Carlo returns) against values
worked out by hand."""

from __future__ import annotations

import torch

from cuda_agent.train import ppo


def test_last_token_reward_sits_on_the_last_model_token():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    r = ppo.last_token_rewards(torch.tensor([2.0, -1.0, 3.0]), mask)
    assert r.tolist() == [[0, 0, 0, 0, 2.0, 0], [-1.0, 0, 0, 0, 0, 0], [0] * 6]


def test_gae_skips_observation_tokens():
    # model tokens at 0, 1, 4; observation tokens 2, 3 carry values that must not enter the recursion
    mask = torch.tensor([[1, 1, 0, 0, 1]])
    values = torch.tensor([[0.5, 0.25, 9.0, 9.0, 1.0]])
    rewards = ppo.last_token_rewards(torch.tensor([2.0]), mask)
    gamma, lam = 0.9, 0.8
    adv, ret = ppo.gae(rewards, values, mask, gamma, lam, whiten=False)
    d4 = 2.0 - 1.0
    d1 = 0 + gamma * 1.0 - 0.25
    d0 = 0 + gamma * 0.25 - 0.5
    a4 = d4
    a1 = d1 + gamma * lam * a4
    a0 = d0 + gamma * lam * a1
    assert torch.allclose(adv, torch.tensor([[a0, a1, 0, 0, a4]]))
    assert torch.allclose(ret, torch.tensor([[a0 + 0.5, a1 + 0.25, 0, 0, a4 + 1.0]]))


def test_gae_with_unit_discount_and_zero_values_is_the_monte_carlo_return():
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]])
    rewards = torch.tensor([3.0, -1.0])
    adv, ret = ppo.gae(ppo.last_token_rewards(rewards, mask), torch.zeros(2, 4), mask, 1.0, 1.0, whiten=False)
    assert torch.equal(ret, ppo.discounted_returns(rewards, mask, 1.0))
    assert ret.tolist() == [[3, 0, 3, 3], [-1, -1, 0, 0]]


def test_whitened_advantages_have_zero_mean_and_unit_variance_over_model_tokens():
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 1]])
    adv, _ = ppo.gae(ppo.last_token_rewards(torch.tensor([1.0, -1.0]), mask), torch.rand(2, 4), mask, 1.0, 0.95)
    m = mask.float()
    assert abs(float(ppo.masked_mean(adv, m))) < 1e-5
    assert abs(float(ppo.masked_mean(adv ** 2, m)) - 1.0) < 1e-3
    assert float((adv * (1 - m)).abs().sum()) == 0.0


def test_discounted_returns_count_model_tokens_only():
    mask = torch.tensor([[1, 0, 0, 1, 1]])
    ret = ppo.discounted_returns(torch.tensor([2.0]), mask, 0.5)
    assert ret.tolist() == [[0.5, 0, 0, 1.0, 2.0]]


def test_policy_loss_clips_and_its_gradient_raises_good_tokens():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.5, 0.9, 0.1]])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1]])
    loss, stats = ppo.policy_loss(logp, old, adv, mask, 0.2, 0.2, 3.0)
    # token 0: ratio 1 -> -1; token 1: ratio 1.8 clipped to 1.2 -> -1.2; token 2: ratio 0.2, A<0:
    # max(0.2, 0.8) = 0.8, dual clip min(0.8, 3) = 0.8
    assert abs(float(loss.detach()) - (-1.0 - 1.2 + 0.8) / 3) < 1e-5
    assert abs(stats["pg_clipfrac"] - 2 / 3) < 1e-6
    loss.backward()
    g = logp.grad[0]
    assert g[0] < 0 and g[1] == 0 and g[2] == 0   # descent raises token 0; clipped tokens get none


def test_policy_loss_ignores_masked_tokens():
    old = torch.zeros(1, 3)
    logp = torch.tensor([[0.0, 5.0, 0.0]], requires_grad=True)
    loss, _ = ppo.policy_loss(logp, old, torch.tensor([[1.0, 100.0, 1.0]]), torch.tensor([[1, 0, 1]]))
    assert abs(float(loss.detach()) + 1.0) < 1e-6
    loss.backward()
    assert logp.grad[0, 1] == 0


def test_value_loss_is_clipped_around_the_old_values():
    values = torch.tensor([[2.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[1.0, 1.0]])
    loss, _ = ppo.value_loss(values, old, ret, torch.tensor([[1, 1]]), clip=0.5)
    # token 0: max((2-1)^2, (0.5-1)^2) = 1; token 1: max(1, 1) = 1; 0.5 * mean = 0.5
    assert abs(float(loss) - 0.5) < 1e-6
