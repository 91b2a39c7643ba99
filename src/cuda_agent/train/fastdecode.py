"""One decode step of a Qwen2-family model in a few plain torch operations.

Measured on an H100 (benchmarks/generate_bench.py, 1.5B shape, 32 rows, 4k context): a decode step
through transformers' modules launches ~2,340 kernels and takes 71 ms on the host for 15.7 ms of
GPU work, so generation is bound by Python and launch overhead, not by the GPU. This step does the
same arithmetic with fused weights and library calls that do several things at once:

    q, k, v      one matmul against the three projections stacked (and their biases)
    rotary       cos/sin of each row's position computed once per step, shared by every layer,
                 applied to the queries and keys together
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

On a GPU the step is still ~25 launches a layer, and the host is the likely bound (a rollout of 32
ten-turn episodes of the 1.5B shape on an H100 generated ~560 tokens/s, about 50 ms a 32-row step);
`GraphedStep` captures `static_step` (the same arithmetic with every shape fixed by the batch slab) as a CUDA graph
and replays it, one launch a step, until the scheduler rebuilds the slab.
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

    def _decode(self, tokens: torch.Tensor, positions: torch.Tensor, slabs, mask: torch.Tensor, write, span):
        """The step's arithmetic; `write(buf, x)` stores this step's keys or values in a layer's slab
        and `span(buf)` is the part of it attention reads."""
        b = tokens.shape[0]
        h = self.embed(tokens)                                    # [B, hidden]
        cos, sin = self._rotary(positions, h.dtype)
        hq, hk, d = self.heads, self.kv_heads, self.head_dim
        group = hq // hk
        for (in_w, qkv_w, qkv_b, o_w, post_w, gu_w, down_w, scaling), (kb, vb) in zip(self.layers, slabs):
            x = self._norm(h, in_w)
            qkv = F.linear(x, qkv_w, qkv_b)
            qk = self._rope(qkv[:, : (hq + hk) * d].view(b, hq + hk, d), cos, sin)   # q and k in one rotary
            write(kb, qk[:, hq:])
            write(vb, qkv[:, (hq + hk) * d:].view(b, hk, d))
            # the query heads of each KV group stand in for query positions: no repeated KV
            att = F.scaled_dot_product_attention(qk[:, :hq].reshape(b, hk, group, d), span(kb), span(vb),
                                                 attn_mask=mask, scale=scaling)
            h = h + F.linear(att.reshape(b, hq * d), o_w)
            x = self._norm(h, post_w)
            gate, up = F.linear(x, gu_w).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, down_w)
        return self.lm_head(self._norm(h, self.norm_w))

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, slabs, fill: int,
             start: torch.Tensor) -> torch.Tensor:
        """Logits [B, vocab] of the next token after `tokens` [B] at `positions` [B]. `slabs` holds
        each layer's KV buffers ([B, kv_heads, capacity, head_dim] keys and values, filled up to
        `fill`, row b's tokens from `start[b]`); this step's keys and values are written at `fill`."""
        n = fill + 1
        mask = (torch.arange(n, device=tokens.device)[None] >= start[:, None])[:, None, None, :]   # [B,1,1,n]

        def write(buf: torch.Tensor, x: torch.Tensor) -> None:
            buf[:, :, fill].copy_(x)

        return self._decode(tokens, positions, slabs, mask, write, lambda buf: buf[:, :, :n])

    def static_step(self, tokens: torch.Tensor, positions: torch.Tensor, slabs, fill: torch.Tensor,
                    start: torch.Tensor) -> torch.Tensor:
        """`step` with every shape fixed by the slab and `fill` a one-element tensor on the device, so
        that it can be captured as a CUDA graph: attention reads the slab's whole capacity with the
        positions after `fill` masked out (at most the slab's headroom more than `step` reads), and
        the keys and values are written at `fill` by index."""
        cap = slabs[0][0].shape[2]
        at = torch.arange(cap, device=tokens.device)[None]
        mask = ((at >= start[:, None]) & (at <= fill))[:, None, None, :]

        def write(buf: torch.Tensor, x: torch.Tensor) -> None:
            buf.index_copy_(2, fill, x.unsqueeze(2))

        return self._decode(tokens, positions, slabs, mask, write, lambda buf: buf)


class GraphedStep:
    """`FastDecoder.static_step` over one batch slab, captured once as a CUDA graph and replayed at
    every step until the slab is rebuilt: one launch from the host instead of ~25 a layer, since
    launches are what bound a decode step through eager PyTorch (transformers' step on an H100 at 32
    rows of 4k tokens: 71 ms on the host for 15.7 ms of GPU work).

    The capture checks itself: the step is run eagerly first (the warm-up the capture needs; it
    writes the same keys and values the replay writes), then replayed, and a replay whose logits
    differ from the eager ones raises `GraphMismatch` (the caller then decodes eagerly)."""

    def __init__(self, decoder: FastDecoder, slabs):
        self.decoder = decoder
        self.slabs = list(slabs)
        self.key = self.key_of(self.slabs)
        dev, batch = self.slabs[0][0].device, self.slabs[0][0].shape[0]
        self._tokens = torch.zeros(batch, dtype=torch.long, device=dev)
        self._positions = torch.zeros(batch, dtype=torch.long, device=dev)
        self._start = torch.zeros(batch, dtype=torch.long, device=dev)
        self._fill = torch.zeros(1, dtype=torch.long, device=dev)
        self._graph = None
        self._logits: torch.Tensor | None = None

    @staticmethod
    def key_of(slabs) -> tuple:
        """The slab's identity as the graph sees it: every buffer's address and shape."""
        return tuple((k.data_ptr(), v.data_ptr(), tuple(k.shape)) for k, v in slabs)

    def _load(self, tokens, positions, fill: int, start) -> None:
        self._tokens.copy_(tokens)
        self._positions.copy_(positions)
        self._start.copy_(start)
        self._fill.fill_(fill)

    def _run(self) -> torch.Tensor:
        return self.decoder.static_step(self._tokens, self._positions, self.slabs, self._fill, self._start)

    @torch.inference_mode()
    def capture(self, tokens, positions, fill: int, start) -> torch.Tensor:
        """Capture the step; returns this step's logits (the eager warm-up's, checked against the
        first replay)."""
        self._load(tokens, positions, fill, start)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # lazy initialisations (cuBLAS workspaces) happen outside the capture
            want = self._run().clone()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: an episode thread touching CUDA meanwhile does not invalidate the capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._logits = self._run()
        graph.replay()
        if not torch.allclose(self._logits.float(), want.float(), rtol=1e-2, atol=1e-2):
            worst = (self._logits.float() - want.float()).abs().max().item()
            raise GraphMismatch(f"the replayed decode step differs from the eager one by up to {worst:.3g}")
        self._graph = graph
        return want

    @torch.inference_mode()
    def __call__(self, tokens, positions, fill: int, start) -> torch.Tensor:
        """This step's logits (a buffer the next replay overwrites: read it before then)."""
        self._load(tokens, positions, fill, start)
        self._graph.replay()
        return self._logits


class GraphMismatch(RuntimeError):
    """A captured decode step whose replay does not give the eager step's logits."""
