"""PPO's pieces as pure tensor functions, with verl's definitions.

All tensors are [B, T] over the response tokens, with `mask` 1 on the model's tokens:

* `gae`: the reward sits on the episode's last model token; the recursion runs over model tokens
  only (an observation between two turns is skipped, not a step: verl's multi-turn GAE), with
  discount `gamma` and trace `lam`; returns = advantages + values. Advantages are whitened over the
  batch's model tokens.
* `policy_loss`: the clipped surrogate max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), with dual clip
  (constant `clip_c`) for negative advantages, averaged over model tokens ("token-mean").
* `value_loss`: 0.5 max((V-R)^2, (clip(V, V_old +- eps_v) - R)^2), token-mean.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level rewards [B, T]: each episode's scalar reward on its last model token."""
    out = torch.zeros_like(mask, dtype=torch.float32)
    pos = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), pos, torch.full_like(pos, -1)).max(dim=1).values
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards[rows].float()
    return out


@torch.no_grad()
def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0, whiten: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both [B, T] and zero where the mask is 0."""
    B, T = mask.shape
    adv = torch.zeros(B, T, dtype=torch.float32, device=mask.device)
    next_value = torch.zeros(B, device=mask.device)
    running = torch.zeros(B, device=mask.device)
    m = mask.float()
    for t in reversed(range(T)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        new_running = delta + gamma * lam * running
        # observation tokens leave the recursion untouched
        running = m[:, t] * new_running + (1 - m[:, t]) * running
        next_value = m[:, t] * values[:, t] + (1 - m[:, t]) * next_value
        adv[:, t] = running * m[:, t]
    returns = (adv + values) * m
    if whiten:
        adv = masked_whiten(adv, m)
    return adv, returns


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.2, clip_c: float = 3.0) -> tuple[torch.Tensor, dict]:
    m = mask.float()
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    clipped = torch.maximum(loss1, loss2)
    dual = torch.minimum(clipped, -advantages * clip_c)   # bounds the loss of a negative advantage
    losses = torch.where(advantages < 0, dual, clipped)
    loss = masked_mean(losses, m)
    stats = {"pg_clipfrac": float(masked_mean((loss2 > loss1).float().detach(), m)),
             "ppo_kl": float(masked_mean(-log_ratio.detach(), m))}
    return loss, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float = 0.5) -> tuple[torch.Tensor, dict]:
    m = mask.float()
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    losses = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    loss = 0.5 * masked_mean(losses, m)
    return loss, {"vf_clipfrac": float(masked_mean(((clipped - returns) ** 2 > (values - returns) ** 2).float(), m))}


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Monte-Carlo return of each model token (the critic's pre-training target): gamma to the
    number of model tokens after it, times the episode's reward."""
    m = mask.float()
    after = m.flip(1).cumsum(1).flip(1) - m   # model tokens strictly after t
    return (rewards.float()[:, None] * gamma ** after) * m


# ---------------------------------------------------------------------------------------------
# Outcome-reward estimators without a critic (one scalar per episode, spread over its model tokens)


def group_ids(keys: list[str]) -> torch.Tensor:
    """Integer group of each episode: equal keys (the task id within one step) share a group."""
    index: dict[str, int] = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def _group_stats(rewards: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per episode: its group's size, mean reward and (unbiased, torch.std's) standard deviation."""
    n_groups = int(groups.max()) + 1 if groups.numel() else 0
    r = rewards.double()
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, torch.ones_like(r))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, r) / count
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, (r - mean[groups]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return count[groups], mean[groups], std[groups]


def grpo_advantages(rewards: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor, norm_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """GRPO's outcome advantage per token [B, T]: (r - mean of the group) / (std of the group + eps),
    or without the division when `norm_std` is off (Dr. GRPO). A group of one episode has no
    baseline: its advantage is its reward unchanged (verl's convention: mean 0, std 1)."""
    count, mean, std = _group_stats(rewards, groups)
    single = count < 2
    centred = torch.where(single, rewards.double(), rewards.double() - mean)
    scale = torch.where(single, torch.ones_like(std), std + eps) if norm_std else torch.ones_like(std)
    return (centred / scale).float()[:, None] * mask.float()


def rloo_advantages(rewards: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """RLOO per token [B, T]: r minus the mean reward of the other episodes of its group, which is
    n/(n-1) (r - mean of the group). A group of one keeps its reward (no other episode to compare)."""
    count, mean, _ = _group_stats(rewards, groups)
    r = rewards.double()
    loo = torch.where(count < 2, r, (r - mean) * count / (count - 1).clamp(min=1))
    return loo.float()[:, None] * mask.float()


# ---------------------------------------------------------------------------------------------
# Regularisers: KL to a frozen reference, entropy


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled token (Schulman's estimators, as verl):
    k1 = logp - ref_logp (unbiased, high variance, can be negative); k3 = exp(ref - logp) -
    (ref - logp) - 1 (unbiased, never negative, low variance). Clamped to [-10, 10] like verl's, so a
    token the reference finds near-impossible cannot dominate the loss."""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        d = (ref_logp - logp).clamp(-20.0, 20.0)
        return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}: use k1 or k3")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis; -inf logits (a restricted vocabulary) count 0."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    return -(p * logp.masked_fill(torch.isinf(logp), 0.0)).sum(-1)
