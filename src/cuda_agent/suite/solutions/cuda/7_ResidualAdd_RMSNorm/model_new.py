"""Residual add + RMSNorm fused: one block per row, h = x + residual held in registers, one write."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return cuda_extension.residual_rmsnorm_forward(x, residual, self.weight, self.eps)
