# level: 1
# Softmax along the last dimension, rows of moderate length (1024).
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn

ROWS = 4096
COLS = 512


class Model(nn.Module):
    """y = softmax(x, dim=-1)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    # spread 2 makes the rows peaked enough that every logit matters
    return [torch.randn(ROWS, COLS) * 2.0]


def get_init_inputs():
    return []
