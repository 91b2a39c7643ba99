"""Batched transpose through shared-memory tiles: coalesced reads of x rows, coalesced writes of y rows."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.batched_transpose_forward(x)
