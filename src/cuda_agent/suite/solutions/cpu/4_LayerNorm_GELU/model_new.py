"""LayerNorm + GELU fused on the CPU: one pass of statistics per row, then normalise and apply GELU
while writing, so the normalised tensor is never stored."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.layernorm_gelu_forward(x, self.norm.weight, self.norm.bias, self.norm.eps)
