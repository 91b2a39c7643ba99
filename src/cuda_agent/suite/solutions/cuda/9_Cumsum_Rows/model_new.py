"""Row-wise inclusive prefix sum: one warp per row walks the row in 128-float chunks (float4 per lane),
scanning each chunk with warp shuffles and carrying the running total."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.cumsum_rows_forward(x)
