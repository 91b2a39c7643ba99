# level: 1
# Exact (erf) GELU over a large activation tensor.
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 1024
COLS = 2048


class Model(nn.Module):
    """y = GELU(x) = 0.5 * x * (1 + erf(x / sqrt(2)))."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
