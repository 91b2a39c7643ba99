# level: 3
# Two-layer MLP with a GELU in between (the feed-forward part of a transformer, no residual).
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 256
DIM = 256
HIDDEN = 1024


class Model(nn.Module):
    """y = fc2(gelu(fc1(x)))."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        with torch.no_grad():
            self.fc1.weight.normal_(0.0, dim ** -0.5)
            self.fc2.weight.normal_(0.0, hidden ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def get_inputs():
    return [torch.randn(TOKENS, DIM)]


def get_init_inputs():
    return [DIM, HIDDEN]
