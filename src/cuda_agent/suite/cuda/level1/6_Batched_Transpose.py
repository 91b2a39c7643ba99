# Level 1: batched matrix transpose materialised in memory, (B, M, N) -> (B, N, M).
# estimate on H200: 8 x 4096 x 8192 fp32 = 1.07 GB read + 1.07 GB written = 2.1 GB / 4 TB/s ~= 0.54 ms (memory-bound)
# eager on H200 (torch 2.11): 5.80 ms measured at 24 x 4096 x 8192, so ~1.9 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
import torch
import torch.nn as nn

BATCH = 8
M = 4096
N = 8192


class Model(nn.Module):
    """y = x.transpose(1, 2), as a new contiguous tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous()


def get_inputs():
    return [torch.randn(BATCH, M, N)]


def get_init_inputs():
    return []
