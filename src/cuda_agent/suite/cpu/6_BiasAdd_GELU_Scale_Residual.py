# level: 2
# Elementwise chain over a hidden state: add a bias, GELU, per-channel scale, add the residual.
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 1024
DIM = 1024


class Model(nn.Module):
    """y = gelu(x + bias) * gamma + residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.5)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + self.bias) * self.gamma + residual


def get_inputs():
    return [torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)]


def get_init_inputs():
    return [DIM]
