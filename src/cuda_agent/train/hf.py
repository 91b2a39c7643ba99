"""The one-GPU path's model side: generation and log-probabilities with plain transformers.

`HFPolicy` samples token by token with the KV cache and returns the log-probability of each sampled
token under the distribution it was sampled from (softmax of logits / temperature, no top-k/top-p),
which is what the PPO ratio needs; the trainer recomputes them (`token_logprobs`) and the gap
between the two is reported (`rollout_logprob_gap`), as verl reports its engine/trainer mismatch.
Generation is serialised by a lock: one model, many episodes in flight, the judge's work overlapping.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from .episode import Generation


class HFPolicy:
    def __init__(self, model, eos_id: int, *, seed: int = 0, device: str | torch.device = "cpu",
                 allowed: list[int] | None = None):
        self.model = model
        self.allowed = allowed   # sample only these ids (constrained decoding); None: the whole vocabulary
        self.eos_id = eos_id
        self.device = torch.device(device)
        self._lock = threading.Lock()
        self._rng = torch.Generator(device="cpu").manual_seed(seed)

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 session: str | None = None) -> Generation:   # no cache kept across turns: session unused
        with self._lock:
            was_training = self.model.training
            self.model.eval()
            try:
                return self._sample(prompt_ids, max_new_tokens, temperature)
            finally:
                self.model.train(was_training)

    def _sample(self, prompt_ids: list[int], max_new_tokens: int, temperature: float) -> Generation:
        ids = torch.tensor([prompt_ids], device=self.device)
        past = None
        out: list[int] = []
        logps: list[float] = []
        for _ in range(max_new_tokens):
            res = self.model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            logp = F.log_softmax(restrict(res.logits[0, -1].float(), self.allowed) / temperature, dim=-1).cpu()
            tok = int(torch.multinomial(logp.exp(), 1, generator=self._rng))
            out.append(tok)
            logps.append(float(logp[tok]))
            if tok == self.eos_id:
                return Generation(token_ids=out, logprobs=logps, finish="stop")
            ids = torch.tensor([[tok]], device=self.device)
        return Generation(token_ids=out, logprobs=logps, finish="length")


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
