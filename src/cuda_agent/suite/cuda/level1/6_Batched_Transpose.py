# Level 1: batched matrix transpose materialised in memory, (B, M, N) -> (B, N, M).
# estimate on H200: 24 x 4096 x 8192 fp32 = 3.2 GB read + 3.2 GB written = 6.4 GB / 4 TB/s ~= 1.6 ms (memory-bound)
# measured eager on H200 (torch 2.11, median of 10 calls): 5.80 ms
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly; the estimate above was made for the larger original shape.
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
