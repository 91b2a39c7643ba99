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


# ---------------------------------------------------------------------------------------------
# GRPO, RLOO, KL estimators, entropy, warm-up: hand-computed


def test_grpo_normalises_within_each_group_and_spreads_over_model_tokens():
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0, 5.0])
    groups = ppo.group_ids(["a", "a", "b", "b", "c"])
    mask = torch.tensor([[1, 0, 1]] * 5)
    adv = ppo.grpo_advantages(rewards, groups, mask, eps=0.0)
    # group a: mean 2, unbiased std sqrt(2): -1/sqrt2, +1/sqrt2; group b: equal rewards -> 0 / (0 + eps=0)
    # would be nan, so use a tiny eps below; group c: one episode keeps its reward (verl: mean 0, std 1)
    s2 = 2 ** 0.5
    assert torch.allclose(adv[0], torch.tensor([-1 / s2, 0, -1 / s2]))
    assert torch.allclose(adv[1], torch.tensor([1 / s2, 0, 1 / s2]))
    assert torch.equal(adv[4], torch.tensor([5.0, 0, 5.0]))
    adv = ppo.grpo_advantages(rewards, groups, mask, eps=1e-6)
    assert torch.equal(adv[2], torch.zeros(3)) and torch.equal(adv[3], torch.zeros(3))
    unnormed = ppo.grpo_advantages(rewards, groups, mask, norm_std=False)
    assert unnormed[:, 0].tolist() == [-1.0, 1.0, 0.0, 0.0, 5.0]


def test_rloo_subtracts_the_mean_of_the_other_episodes():
    rewards = torch.tensor([1.0, 2.0, 6.0, 4.0])
    groups = ppo.group_ids(["t", "t", "t", "u"])
    adv = ppo.rloo_advantages(rewards, groups, torch.ones(4, 2))
    # 1 - (2+6)/2 = -3; 2 - (1+6)/2 = -1.5; 6 - (1+2)/2 = 4.5; a group of one keeps its reward
    assert adv[:, 0].tolist() == [-3.0, -1.5, 4.5, 4.0] and torch.equal(adv[:, 0], adv[:, 1])


def test_kl_estimators_k1_and_k3():
    logp = torch.log(torch.tensor([0.5, 0.25, 0.5]))
    ref = torch.log(torch.tensor([0.25, 0.5, 0.5]))
    import math

    k1 = ppo.kl_penalty(logp, ref, "k1")   # log(p / ref)
    assert torch.allclose(k1, torch.tensor([math.log(2), -math.log(2), 0.0]))
    k3 = ppo.kl_penalty(logp, ref, "k3")
    # r = ref/p: 0.5 -> 0.5 - ln 0.5 - 1; 2 -> 2 - ln 2 - 1; 1 -> 0

    assert torch.allclose(k3, torch.tensor([0.5 + math.log(2) - 1, 2 - math.log(2) - 1, 0.0]))
    assert bool((k3 >= 0).all())
    try:
        ppo.kl_penalty(logp, ref, "k2")
    except ValueError as exc:
        assert "k1 or k3" in str(exc)
    else:
        raise AssertionError("an unknown estimator must be an error")


def test_entropy_of_uniform_and_restricted_distributions():
    import math

    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, float("-inf"), float("-inf")]])
    ent = ppo.entropy_from_logits(logits)
    assert torch.allclose(ent, torch.tensor([math.log(4), math.log(2)]))
    p = torch.tensor([0.7, 0.2, 0.1])
    assert torch.allclose(ppo.entropy_from_logits(p.log()[None]), -(p * p.log()).sum()[None])


def test_warmup_is_linear_then_constant():
    from cuda_agent.train.optim import warmup_lambda

    f = warmup_lambda(4)
    assert [f(k) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_lambda(0)(0) == 1.0
