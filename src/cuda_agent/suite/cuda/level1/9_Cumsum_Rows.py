# Level 1: inclusive prefix sum along the last dimension.
# estimate on H200: 196608 x 4096 fp32 = 3.2 GB read + 3.2 GB written = 6.4 GB / 4 TB/s ~= 1.6 ms (memory-bound)
# measured eager on H200 (torch 2.11, median of 10 calls): 3.20 ms
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly; the estimate above was made for the larger original shape.
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
