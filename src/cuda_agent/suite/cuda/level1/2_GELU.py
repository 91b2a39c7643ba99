# Level 1: exact (erf) GELU over a large activation tensor.
# estimate on H200: 16384 x 16384 fp32 = 1.07 GB read + 1.07 GB written = 2.1 GB / 4 TB/s ~= 0.54 ms (memory-bound)
# eager on H200 (torch 2.11): 1.53 ms measured at 16384 x 49152, so ~0.5 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
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
