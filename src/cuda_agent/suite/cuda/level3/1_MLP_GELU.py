# Level 3: two-layer MLP with a GELU in between (the feed-forward part of a transformer, no residual).
# estimate on H200: 2 GEMMs of 2*8192*1024*4096 = 137 GFLOP / 50 TFLOP/s ~= 2.7 ms, + GELU over 8192 x 4096
#   (268 MB read + written ~= 0.15 ms) ~= 2.9 ms
# measured eager on H200 (torch 2.11, median of 10 calls): 2.85 ms
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 8192
DIM = 1024
HIDDEN = 4096


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
