"""One decode step of a Qwen2-family model in a few plain torch operations.

Measured on an H100 (benchmarks/generate_bench.py, 1.5B shape, 32 rows, 4k context): a decode step
through transformers' modules launches ~2,340 kernels and takes 71 ms on the host for 15.7 ms of
GPU work, so generation is bound by Python and launch overhead, not by the GPU. This step does the
same arithmetic with fused weights and library calls that do several things at once:

    q, k, v      one matmul against the three projections stacked (and their biases)
    rotary       cos/sin of each row's position computed once per step, shared by every layer
    KV cache     the step's keys and values written in place at the slab's fill position
    attention    one scaled_dot_product_attention over the slab with the padding masked out,
                 query heads grouped onto their KV heads (no repeated KV)
    norms        torch's fused rms_norm in fp32, as transformers' RMSNorm computes it
    MLP          gate and up in one matmul, silu(gate) * up, down

The arithmetic is transformers' (same dtypes, same order of the norms' fp32 casts), so the logits
agree with the model's own forward to rounding; the tests hold it to that. Only the decode step is
replaced: prefill still runs through the model. Models it does not cover (another architecture, a
peft wrapper, sliding windows, scaled rotary) keep the transformers path; `FastDecoder.supports`
says which.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class FastDecoder:
    """Fused decode steps over a `Qwen2ForCausalLM` (its weights are shared, the stacked q/k/v and
    gate/up weights are copies: about 1.3x the attention and MLP input weights, built once)."""

    def __init__(self, model):
        cfg = model.config
        self.model = model
        base = model.model
        self.hidden = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        rot = base.rotary_emb
        self.inv_freq = rot.inv_freq
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.layers = []
        with torch.no_grad():
            for layer in base.layers:
                att, mlp = layer.self_attn, layer.mlp
                qkv_w = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight])
                biases = [p.bias for p in (att.q_proj, att.k_proj, att.v_proj)]
                qkv_b = torch.cat(biases) if all(b is not None for b in biases) else None
                gu_w = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
                self.layers.append((layer.input_layernorm.weight, qkv_w, qkv_b, att.o_proj.weight,
                                    layer.post_attention_layernorm.weight, gu_w, mlp.down_proj.weight,
                                    att.scaling))
        self.norm_w = base.norm.weight
        self.embed = base.embed_tokens
        self.lm_head = model.lm_head

    @staticmethod
    def supports(model) -> bool:
        """A plain Qwen2 causal LM (not a peft wrapper) with full attention, plain rotary and SiLU."""
        try:
            from transformers import Qwen2ForCausalLM
        except ImportError:
            return False
        if type(model) is not Qwen2ForCausalLM:
            return False
        cfg = model.config
        rope = getattr(cfg, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        return (not getattr(cfg, "use_sliding_window", False) and getattr(cfg, "hidden_act", "silu") == "silu"
                and rope_type == "default")

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # transformers: w * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)
        return w * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def _rotary(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = pos[:, None].float() * self.inv_freq.float()[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.rope_scale).to(dtype)[:, None, :],
                (emb.sin() * self.rope_scale).to(dtype)[:, None, :])

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, slabs, fill: int,
             start: torch.Tensor) -> torch.Tensor:
        """Logits [B, vocab] of the next token after `tokens` [B] at `positions` [B]. `slabs` holds
        each layer's KV buffers ([B, kv_heads, capacity, head_dim] keys and values, filled up to
        `fill`, row b's tokens from `start[b]`); this step's keys and values are written at `fill`."""
        b = tokens.shape[0]
        h = self.embed(tokens)                                    # [B, hidden]
        cos, sin = self._rotary(positions, h.dtype)
        n = fill + 1
        mask = (torch.arange(n, device=h.device)[None] >= start[:, None])[:, None, None, :]   # [B,1,1,n]
        hq, hk, d = self.heads, self.kv_heads, self.head_dim
        group = hq // hk
        for (in_w, qkv_w, qkv_b, o_w, post_w, gu_w, down_w, scaling), (kb, vb) in zip(self.layers, slabs):
            x = self._norm(h, in_w)
            qkv = F.linear(x, qkv_w, qkv_b)
            q = qkv[:, : hq * d].view(b, hq, d)
            k = qkv[:, hq * d: (hq + hk) * d].view(b, hk, d)
            v = qkv[:, (hq + hk) * d:].view(b, hk, d)
            q = self._rope(q, cos, sin)
            kb[:, :, fill].copy_(self._rope(k, cos, sin))
            vb[:, :, fill].copy_(v)
            # the query heads of each KV group stand in for query positions: no repeated KV
            att = F.scaled_dot_product_attention(q.view(b, hk, group, d), kb[:, :, :n], vb[:, :, :n],
                                                 attn_mask=mask, scale=scaling)
            h = h + F.linear(att.reshape(b, hq * d), o_w)
            x = self._norm(h, post_w)
            gate, up = F.linear(x, gu_w).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, down_w)
        return self.lm_head(self._norm(h, self.norm_w))
