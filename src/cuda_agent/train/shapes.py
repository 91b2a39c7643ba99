"""Models of real shapes with random weights, for speed and memory figures without a download.

The numbers are the published configs' (hidden size, layers, heads, KV heads, intermediate size,
vocabulary, tied embeddings); the weights are random, so such a model measures time and memory,
never skill. `tiny` has grouped KV heads like the real ones, for CPU smoke runs of the benchmarks.
The generation, training and rollout benchmarks all build their models here.
"""

from __future__ import annotations

import torch

SHAPES: dict[str, dict] = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=1024, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}


def build_model(shape: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
    """A random Qwen2ForCausalLM of a named shape, built directly on `device` in `dtype`; EOS is the
    last id of the vocabulary."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    dims = SHAPES[shape]
    config = Qwen2Config(**dims, max_position_embeddings=131_072, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                         bos_token_id=None, eos_token_id=dims["vocab_size"] - 1, pad_token_id=dims["vocab_size"] - 1)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)   # so a 7B model is never materialised in fp32 first
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()
