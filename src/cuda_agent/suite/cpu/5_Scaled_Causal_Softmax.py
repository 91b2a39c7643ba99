# level: 2
# Attention-score post-processing: scale, causal mask, softmax over the keys.
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn

BATCH = 2
HEADS = 4
SEQ = 256
SCALE = 0.75


class Model(nn.Module):
    """y = softmax(masked_fill(x * scale, key > query, -inf), dim=-1) for scores x of shape (B, H, L, L)."""

    def __init__(self, seq_len: int, scale: float):
        super().__init__()
        self.scale = scale
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(diagonal=1)
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = (x * self.scale).masked_fill(self.causal_mask, float("-inf"))
        return torch.softmax(scores, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, SEQ) * 2.0]


def get_init_inputs():
    return [SEQ, SCALE]
