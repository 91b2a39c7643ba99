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
import torch.utils.checkpoint


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


def hidden_states(model, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The backbone's final hidden states [B, L, H] (after its last norm), without the lm_head: one
    forward serves the log-probabilities (`chunked_logprobs`) and a shared value head. A PEFT model's
    decoder is the base model's with the adapters injected in place, so LoRA applies here too."""
    check_plain_lm_head(model)
    # no KV cache: training forwards are one pass (and a cache is incompatible with checkpointing)
    return model.get_decoder()(input_ids=ids, attention_mask=causal_mask_or_none(attention),
                               use_cache=False).last_hidden_state


def causal_mask_or_none(attention: torch.Tensor | None) -> torch.Tensor | None:
    """None for a right-padded batch (every row ones, then zeros): under causal attention a real
    token never sees the pads after it and positions count from 0 either way, so the outputs at real
    positions are the same without the mask, and SDPA/flash run their causal kernel instead of
    reading a materialised [B, 1, L, L] mask (17 GB per episode at 128k tokens). Pad positions'
    outputs differ, and callers mask them out. Any other mask is kept."""
    if attention is None:
        return None
    right_padded = bool((attention.cumprod(dim=1) == attention).all())
    return None if right_padded else attention


def check_plain_lm_head(model) -> None:
    """The chunked path applies `get_output_embeddings()` to hidden states and nothing else; a model
    whose logits are post-processed (Gemma's soft-capping, Cohere's logit scale) would be wrong."""
    conf = getattr(model, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale"):
        if getattr(conf, attr, None) not in (None, 1.0):
            raise ValueError(f"{type(model).__name__} post-processes its logits ({attr}={getattr(conf, attr)}); "
                             "the chunked log-probabilities support plain lm_head models (Qwen2, Llama, Mistral)")


def _chunk_stats(head, h: torch.Tensor, targets: torch.Tensor, temperature: float, keep: torch.Tensor | None
                 ) -> torch.Tensor:
    """[2, n]: log p(target) and entropy of n positions under softmax(restrict(lm_head(h)) / T), in fp32."""
    logits = head(h).float()
    if keep is not None:
        logits = logits + keep
    logp_all = F.log_softmax(logits / temperature, dim=-1)
    logp = torch.gather(logp_all, 1, targets[:, None]).squeeze(1)
    ent = -(logp_all.exp() * logp_all.masked_fill(torch.isinf(logp_all), 0.0)).sum(-1)
    return torch.stack([logp, ent])


def chunked_logprobs(model, hidden: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None = None, *,
                     temperature: float = 1.0, allowed: list[int] | None = None, chunk: int = 1024
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(ids[:, t] | ids[:, :t]), entropy of that distribution), both [B, L-1] fp32 (position
    t-1 holds token t's), from the backbone's `hidden` [B, L, H], under the sampling distribution
    (temperature, `allowed` ids: other ids' logp is -inf).

    Only positions with `mask` 1 are computed (others are 0); they go through lm_head and
    log_softmax `chunk` positions at a time, so the fp32 logits never exceed [chunk, V] instead of
    [B, L, V] (at 32k tokens and Qwen's 152k vocabulary that is 18.6 GiB per copy, ~3 copies with
    autograd). With autograd on, each chunk runs under torch.utils.checkpoint: its logits are
    recomputed in backward rather than kept, so peak memory stays ~chunk x V x 4 bytes x 3."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, not {chunk}")
    B, L = ids.shape
    h = hidden[:, :-1]
    targets = ids[:, 1:]
    sel = torch.ones(B, L - 1, dtype=torch.bool, device=ids.device) if mask is None else mask.bool()
    h_sel, t_sel = h[sel], targets[sel]
    head = model.get_output_embeddings()
    keep = None
    if allowed is not None:
        keep = torch.full((head.weight.shape[0],), float("-inf"), device=ids.device)
        keep[torch.tensor(allowed, device=ids.device)] = 0.0
    grad = torch.is_grad_enabled() and h_sel.requires_grad
    parts = []
    for i in range(0, h_sel.shape[0], chunk):
        args = (head, h_sel[i:i + chunk], t_sel[i:i + chunk], temperature, keep)
        parts.append(torch.utils.checkpoint.checkpoint(_chunk_stats, *args, use_reentrant=False) if grad
                     else _chunk_stats(*args))
    stats = torch.cat(parts, dim=1) if parts else torch.zeros(2, 0, device=ids.device)
    zeros = torch.zeros(B, L - 1, device=ids.device, dtype=torch.float32)
    return zeros.masked_scatter(sel, stats[0]), zeros.masked_scatter(sel, stats[1])


def token_logprobs(model, ids: torch.Tensor, attention: torch.Tensor, temperature: float = 1.0,
                   allowed: list[int] | None = None, mask: torch.Tensor | None = None,
                   chunk: int = 1024) -> torch.Tensor:
    """log p(ids[:, t] | ids[:, :t]) for t >= 1, shape [B, L-1] (position t-1 holds token t's), under
    the sampling distribution (temperature, `allowed` ids). Positions whose token is outside
    `allowed` (prompt and observation tokens) get -inf there, positions with `mask` 0 get 0; callers
    mask them out. Chunked: see `chunked_logprobs`."""
    return chunked_logprobs(model, hidden_states(model, ids, attention), ids, mask, temperature=temperature,
                            allowed=allowed, chunk=chunk)[0]


def naive_token_logprobs(model, ids: torch.Tensor, attention: torch.Tensor, temperature: float = 1.0,
                         allowed: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy) [B, L-1] from the full [B, L, V] fp32 logits: the reference the chunked
    path is tested against (and what the trainer did before it); memory-hungry, tests only."""
    logits = restrict(model(input_ids=ids, attention_mask=attention).logits[:, :-1].float(), allowed) / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    ent = -(logp_all.exp() * logp_all.masked_fill(torch.isinf(logp_all), 0.0)).sum(-1)
    return torch.gather(logp_all, 2, ids[:, 1:, None]).squeeze(-1), ent


def token_values(critic, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The critic's value before each token t >= 1, shape [B, L-1] (verl's alignment: the value of a
    response token is read at the position that precedes it)."""
    out = critic(input_ids=ids, attention_mask=causal_mask_or_none(attention), use_cache=False)
    return out.logits[:, :-1, 0].float()
