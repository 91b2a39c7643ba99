# Level 1: sum reduction along the last dimension.
# estimate on H200: 8192 x 32768 fp32 = 1.07 GB read (output 32 KB) / 4 TB/s ~= 0.27 ms (memory-bound)
# eager on H200 (torch 2.11): 1.48 ms measured at 49152 x 32768, so ~0.25 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
import torch
import torch.nn as nn

ROWS = 8192
COLS = 32768


class Model(nn.Module):
    """y[i] = sum_j x[i, j]."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
