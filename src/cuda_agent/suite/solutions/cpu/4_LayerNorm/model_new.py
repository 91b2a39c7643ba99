"""LayerNorm on the CPU: rows split across OpenMP threads; two-pass mean/variance, one write."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.layernorm_forward(x, self.norm.weight, self.norm.bias, self.norm.eps)
