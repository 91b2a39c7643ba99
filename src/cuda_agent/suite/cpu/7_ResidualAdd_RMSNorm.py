# level: 2
# Residual add followed by RMSNorm with a learned gain (a pre-norm transformer step).
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn

ROWS = 1024
DIM = 1024
EPS = 1e-6


class Model(nn.Module):
    """h = x + residual; y = h / sqrt(mean(h^2, -1) + eps) * weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = x + residual
        return h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def get_inputs():
    return [torch.randn(ROWS, DIM), torch.randn(ROWS, DIM) * 0.5 + 0.25]


def get_init_inputs():
    return [DIM, EPS]
