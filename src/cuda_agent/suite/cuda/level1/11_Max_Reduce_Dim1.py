# Level 1: max reduction over the middle dimension of a 3-D tensor (strided reduction).
# estimate on H200: 32 x 256 x 32768 fp32 = 1.07 GB read (output 4 MB) / 4 TB/s ~= 0.27 ms (memory-bound)
# eager on H200 (torch 2.11): 1.48 ms measured at 192 x 256 x 32768, so ~0.25 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
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
