"""Row-wise inclusive prefix sum on the CPU: rows across OpenMP threads, a running sum per row."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.cumsum_rows_forward(x)
