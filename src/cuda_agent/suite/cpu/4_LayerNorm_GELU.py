# level: 2
# LayerNorm over the last dimension followed by exact GELU.
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 1024
DIM = 1024


class Model(nn.Module):
    """y = gelu(LayerNorm(x))."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm(x))


def get_inputs():
    return [torch.randn(ROWS, DIM) * 2.0 - 0.5]


def get_init_inputs():
    return [DIM]
