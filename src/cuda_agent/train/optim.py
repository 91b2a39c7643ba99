"""The learner's optimiser: AdamW whose state is fp32 whatever the weights' dtype, and the LR warm-up.

Why not torch.optim.AdamW on bf16 weights: its moments would be bf16 (8 bits of mantissa) and, worse,
an update of lr 1e-6 on a weight of ~0.02 is 5e-5 of it, below bf16's resolution (2^-8 = 0.4%), so
round-to-nearest drops every update and the model never moves. The usual fix is an fp32 master copy
(16 bytes per trainable parameter: bf16 weight 2, bf16 grad 2, fp32 master 4, fp32 moments 8). This
one keeps the two moments in fp32 but no master copy: the update is computed in fp32 and written back
to the bf16 weight with stochastic rounding (round up with probability equal to the remainder), whose
expectation is the fp32 result, so small updates accumulate in expectation (Zamirai et al. 2020,
"Revisiting BFloat16 Training"; torchao's `bf16_stochastic_round`). 12 bytes per trainable parameter.

On paper, Qwen2.5-1.5B (1.54e9 parameters) trained in full:
    fp32 weights + torch AdamW:  4 + 4 (grad) + 8 (moments)           = 16 B/param = 23.0 GiB
    bf16 + fp32 master copy:     2 + 2 + 4 + 8                         = 16 B/param = 23.0 GiB
    bf16 + this optimiser:       2 + 2 + 8                             = 12 B/param = 17.2 GiB
plus activations (bf16 halves them; see `memory.py`). With a separate critic of the same size, twice
that; with a shared value head, the head's 1536 parameters. fp32 weights (the CPU default) take the
ordinary AdamW path here: the same arithmetic as torch.optim.AdamW (tested against it).
"""

from __future__ import annotations

import math

import torch


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """fp32 -> bf16, rounding up or down at random with the probability that makes the expectation x.
    bf16 is fp32's top 16 bits: add uniform noise in [0, 2^16) to the bit pattern, then truncate."""
    bits = x.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device, generator=generator)
    rounded = (bits + noise) & -65536   # keep the top 16 bits
    out = rounded.view(torch.float32)
    # non-finite values and values whose noise overflowed into inf keep round-to-nearest
    bad = ~torch.isfinite(out) | ~torch.isfinite(x)
    return torch.where(bad, x.float(), out).to(torch.bfloat16)


class AdamW32(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected moments, torch's definition) with fp32 moments
    for any parameter dtype; bf16 parameters are updated by stochastic rounding of the fp32 result."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, seed: int = 0):
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid AdamW settings lr={lr} betas={betas} eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self._seed)
        return self._generators[device]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32,
                                                           memory_format=torch.contiguous_format)
                state["step"] += 1
                t = float(state["step"])
                if p.dtype == torch.float32:
                    self._update(p, p.grad, state["exp_avg"], state["exp_avg_sq"], lr, b1, b2, eps, wd, t)
                    continue
                # a low-precision parameter is updated a slice at a time, so the fp32 temporaries
                # stay ~5 x 4 bytes x SLICE instead of 5 x 4 bytes x its size (Qwen's 233M-element
                # embedding: 4.7 GB)
                flat = [x.view(-1) for x in (p.data, p.grad, state["exp_avg"], state["exp_avg_sq"])]
                for i in range(0, flat[0].numel(), self.SLICE):
                    pw, g, m, v = (x[i:i + self.SLICE] for x in flat)
                    w = pw.float()
                    self._update(w, g, m, v, lr, b1, b2, eps, wd, t)
                    pw.copy_(stochastic_round_bf16(w, self._generator(p.device)) if p.dtype == torch.bfloat16
                             else w)
        return loss

    SLICE = 1 << 24

    @staticmethod
    def _update(w, grad, m, v, lr, b1, b2, eps, wd, t) -> None:
        """One AdamW update of the fp32 weights `w` in place (torch's arithmetic)."""
        g = grad.float()
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        w.mul_(1 - lr * wd)
        denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
        w.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


def warmup_lambda(warmup_steps: int):
    """LR factor of optimiser step k (0-based): linear from 1/warmup_steps to 1 over the first
    `warmup_steps` steps, then constant 1; no warm-up when warmup_steps is 0."""
    def factor(k: int) -> float:
        return 1.0 if warmup_steps <= 0 else min(1.0, (k + 1) / warmup_steps)
    return factor
