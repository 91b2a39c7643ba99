# level: 3
# Multi-head self-attention block (fused QKV projection, softmax attention, output projection).
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import math

import torch
import torch.nn as nn

BATCH = 2
SEQ = 128
DIM = 128
HEADS = 4


class Model(nn.Module):
    """y = proj(softmax(q k^T / sqrt(d)) v) with q, k, v = split(qkv(x)) per head."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        with torch.no_grad():  # larger q/k weights give peaked (non-uniform) attention
            self.qkv.weight.normal_(0.0, 2.0 * dim ** -0.5)
            self.proj.weight.normal_(0.0, dim ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, d)
        return self.proj(out)


def get_inputs():
    return [torch.randn(BATCH, SEQ, DIM)]


def get_init_inputs():
    return [DIM, HEADS]
