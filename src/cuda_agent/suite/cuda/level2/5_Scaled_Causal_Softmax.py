# Level 2: attention-score post-processing: scale, causal mask, softmax over the keys.
# estimate on H200: scores 8x16x1024x1024 fp32 = 0.54 GB; eager: mul 1.07 GB + masked_fill 1.07 GB + softmax 1.07 GB
#   = 3.2 GB / 4 TB/s ~= 0.8 ms (fused: 1.07 GB ~= 0.27 ms)
# eager on H200 (torch 2.11): 4.64 ms measured at 32x16x1024x1024, so ~1.2 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
import torch
import torch.nn as nn

BATCH = 8
HEADS = 16
SEQ = 1024
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
