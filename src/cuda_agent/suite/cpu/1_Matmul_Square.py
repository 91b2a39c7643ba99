# level: 1
# One square fp32 matrix product, C = A @ B.
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn

N = 384


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
