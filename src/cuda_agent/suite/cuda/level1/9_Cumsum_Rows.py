# Level 1: inclusive prefix sum along the last dimension.
# estimate on H200: 65536 x 4096 fp32 = 1.07 GB read + 1.07 GB written = 2.1 GB / 4 TB/s ~= 0.54 ms (memory-bound)
# eager on H200 (torch 2.11): 3.20 ms measured at 196608 x 4096, so ~1.1 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
import torch
import torch.nn as nn

ROWS = 65536
COLS = 4096


class Model(nn.Module):
    """y[i, j] = sum_{k <= j} x[i, k]."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
