"""A pre-flight estimate of a training step's GPU memory, from the model's config alone (the model is
built on the meta device: no weights, no memory), so a run that cannot fit fails in a second with
the numbers rather than after loading 15 GB and sampling a batch.

What is counted (bytes): weights (every parameter at the training dtype; a frozen reference copy
in bf16 when one is loaded), gradients (trainable parameters, same dtype), optimiser (AdamW32's two
fp32 moments per trainable parameter, and its fp32 temporaries of one slice), activations of one micro-batch:
    with gradient checkpointing: each layer keeps its input (h values per token), plus one layer's
        full set while it is recomputed in backward;
    without: every layer's full set: ~(8h + 2 kv + 4 I) values per token for a Llama/Qwen block
        (norm inputs and outputs, q/k/v, attention output, residuals, gate/up/act/product of the
        MLP; attention by SDPA/flash keeps no [L, L] scores);
    plus the chunked log-prob's [chunk, V] fp32 logits (~3 live copies) and the final hidden states.
What is not: the CUDA context (~0.5 GiB), allocator fragmentation, generation's KV cache (the
rollout runs before the update and frees it); hence a 10% margin on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GiB = 1024 ** 3


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return int((self.weights + self.grads + self.optimizer + self.activations) * 1.10)

    def describe(self) -> str:
        parts = ", ".join(f"{k} {getattr(self, k) / GiB:.1f}" for k in ("weights", "grads", "optimizer", "activations"))
        return f"~{self.total / GiB:.1f} GiB ({parts}, +10% margin)"


def count_params(config, lora: dict | None = None) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """(all parameters, LoRA parameters, linear modules by name: (in, out)) of `config`'s causal LM,
    built on the meta device. LoRA adds r x (in + out) per targeted linear module."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    linears = {n: (m.in_features, m.out_features) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    lora_params = 0
    if lora is not None:
        targets = set(lora["target_modules"])
        lora_params = sum(lora["r"] * (i + o) for n, (i, o) in linears.items() if n.rsplit(".", 1)[-1] in targets)
    return total, lora_params, linears


def estimate(config, *, dtype_bytes: int, micro_batch: int, seq_len: int, checkpointing: bool,
             lora: dict | None = None, separate_critic: bool = False, ref_copy: bool = False,
             chunk: int = 1024) -> MemoryEstimate:
    total, lora_params, _ = count_params(config, lora)
    h, layers = config.hidden_size, config.num_hidden_layers
    inter = getattr(config, "intermediate_size", 4 * h)
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", heads) * (h // heads)
    vocab = config.vocab_size
    trainable = lora_params if lora is not None else total
    models = 2 if separate_critic else 1
    weights = models * (total + lora_params) * dtype_bytes + (total * 2 if ref_copy else 0)
    grads = models * trainable * dtype_bytes
    # + AdamW32's fp32 temporaries of one slice of a bf16 parameter (5 tensors of 2^24 values)
    optimizer = models * trainable * 8 + (5 * 4 << 24 if dtype_bytes == 2 else 0)
    tokens = micro_batch * seq_len
    full_layer = (8 * h + 2 * kv + 4 * inter) * dtype_bytes * tokens
    if checkpointing:
        act = layers * h * dtype_bytes * tokens + full_layer
    else:
        act = layers * full_layer
    act += min(chunk, tokens) * vocab * 4 * 3 + tokens * h * 4
    return MemoryEstimate(weights=weights, grads=grads, optimizer=optimizer, activations=models * act)
