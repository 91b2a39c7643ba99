# Level 2: elementwise chain over a hidden state: add a bias, GELU, per-channel scale, add the residual.
# estimate on H200: 16384 x 16384 fp32 (1.07 GB each); eager: add 3.2 GB + gelu 2.1 GB + mul 2.1 GB + add 3.2 GB
#   = 10.7 GB / 4 TB/s ~= 2.7 ms (fused: 3 x 1.07 GB ~= 0.8 ms)
# measured eager on H200 (torch 2.11, median of 10 calls): 2.76 ms
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16384
DIM = 16384


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
