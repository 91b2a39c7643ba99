# Level 1: max reduction over the middle dimension of a 3-D tensor (strided reduction).
# estimate on H200: 192 x 256 x 32768 fp32 = 6.4 GB read (output 25 MB) / 4 TB/s ~= 1.6 ms (memory-bound)
# measured eager on H200 (torch 2.11, median of 10 calls): 1.48 ms
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly; the estimate above was made for the larger original shape.
import torch
import torch.nn as nn

BATCH = 32
REDUCED = 256
INNER = 32768


class Model(nn.Module):
    """y[b, k] = max_r x[b, r, k]."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.amax(x, dim=1)


def get_inputs():
    return [torch.randn(BATCH, REDUCED, INNER)]


def get_init_inputs():
    return []
