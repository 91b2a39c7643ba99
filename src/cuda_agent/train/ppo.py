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
