# Level 1: exact (erf) GELU over a large activation tensor.
# estimate on H200: 16384 x 49152 fp32 = 3.2 GB read + 3.2 GB written = 6.4 GB / 4 TB/s ~= 1.6 ms (memory-bound)
# measured eager on H200 (torch 2.11, median of 10 calls): 1.53 ms
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly; the estimate above was made for the larger original shape.
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16384
COLS = 16384


class Model(nn.Module):
    """y = GELU(x) = 0.5 * x * (1 + erf(x / sqrt(2)))."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
