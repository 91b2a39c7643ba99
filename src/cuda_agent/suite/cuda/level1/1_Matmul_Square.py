# Level 1: one square fp32 matrix product, C = A @ B.
# estimate on H200: 2*4096^3 = 137 GFLOP / 50 TFLOP/s ~= 2.7 ms (compute-bound; 3 x 64 MB moved is negligible)
# measured eager on H200 (torch 2.11, median of 10 calls): 2.70 ms
import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    """C = A @ B for two N x N matrices."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
