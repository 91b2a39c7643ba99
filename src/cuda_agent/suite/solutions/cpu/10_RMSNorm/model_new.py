"""RMSNorm on the CPU in one kernel: sum of squares per row, then scale and gain while writing."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.rmsnorm_forward(x, self.weight, self.eps)
