# Level 1: RMSNorm over the last dimension with a learned gain, written out in elementary ops.
# estimate on H200: eager runs ~5 kernels over 65536 x 4096 fp32 (1.07 GB): 4 reads + 3 writes ~= 7.5 GB
#   / 4 TB/s ~= 1.9 ms (a fused kernel needs 2.1 GB ~= 0.55 ms)
# measured eager on H200 (torch 2.11, median of 10 calls): 2.31 ms
import torch
import torch.nn as nn

ROWS = 65536
DIM = 4096
EPS = 1e-6


class Model(nn.Module):
    """y = x / sqrt(mean(x^2, -1) + eps) * weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * inv_rms * self.weight


def get_inputs():
    return [torch.randn(ROWS, DIM)]


def get_init_inputs():
    return [DIM, EPS]
