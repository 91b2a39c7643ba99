# level: 1
# Batched matrix transpose materialised in memory, (B, M, N) -> (B, N, M).
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn

BATCH = 4
M = 512
N = 768


class Model(nn.Module):
    """y = x.transpose(1, 2), as a new contiguous tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous()


def get_inputs():
    return [torch.randn(BATCH, M, N)]


def get_init_inputs():
    return []
