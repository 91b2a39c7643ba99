"""The one-GPU path's trainer side: log-probabilities and values with plain transformers.

`token_logprobs` recomputes the log-probability of each token under the sampling distribution
(softmax of logits / temperature restricted to `allowed`, no top-k/top-p), which is what the PPO
ratio needs; the rollout side (`train.generate.HFPolicy`) returns the same quantity at sampling time
and the gap between the two is reported (`rollout_logprob_gap`), as verl reports its engine/trainer
mismatch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def restrict(logits: torch.Tensor, allowed: list[int] | None) -> torch.Tensor:
    """Logits with every id outside `allowed` at -inf (unchanged when allowed is None)."""
    if allowed is None:
        return logits
    keep = torch.full((logits.shape[-1],), float("-inf"), device=logits.device)
    keep[torch.tensor(allowed, device=logits.device)] = 0.0
    return logits + keep


def pad_batch(seqs: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L] and attention mask."""
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad, dtype=torch.long)
    att = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
    return ids.to(device), att.to(device)


def token_logprobs(model, ids: torch.Tensor, attention: torch.Tensor, temperature: float = 1.0,
                   allowed: list[int] | None = None) -> torch.Tensor:
    """log p(ids[:, t] | ids[:, :t]) for t >= 1, shape [B, L-1] (position t-1 holds token t's), under
    the sampling distribution (temperature, `allowed` ids). Positions whose token is outside
    `allowed` (prompt and observation tokens) get -inf there; callers mask them out."""
    logits = restrict(model(input_ids=ids, attention_mask=attention).logits[:, :-1].float(), allowed) / temperature
    return torch.gather(F.log_softmax(logits, dim=-1), 2, ids[:, 1:, None]).squeeze(-1)


def token_values(critic, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The critic's value before each token t >= 1, shape [B, L-1] (verl's alignment: the value of a
    response token is read at the position that precedes it)."""
    return critic(input_ids=ids, attention_mask=attention).logits[:, :-1, 0].float()
