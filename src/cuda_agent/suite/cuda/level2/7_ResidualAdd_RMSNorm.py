# Level 2: residual add followed by RMSNorm with a learned gain (a pre-norm transformer step).
# estimate on H200: 65536 x 4096 fp32 (1.07 GB each); eager: add 3.2 GB + pow 2.1 + mean 1.1 + 2 muls 4.3
#   = 10.7 GB / 4 TB/s ~= 2.7 ms (fused: 3.2 GB ~= 0.8 ms)
# measured eager on H200 (torch 2.11, median of 10 calls): 3.04 ms
import torch
import torch.nn as nn

ROWS = 65536
DIM = 4096
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
