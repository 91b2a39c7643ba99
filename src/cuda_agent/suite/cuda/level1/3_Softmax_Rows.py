# Level 1: softmax along the last dimension, rows of moderate length (1024).
# estimate on H200: 786432 x 1024 fp32 = 3.2 GB read + 3.2 GB written = 6.4 GB / 4 TB/s ~= 1.6 ms (memory-bound)
# measured eager on H200 (torch 2.11, median of 10 calls): 1.62 ms
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly; the estimate above was made for the larger original shape.
import torch
import torch.nn as nn

ROWS = 262144
COLS = 1024


class Model(nn.Module):
    """y = softmax(x, dim=-1)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    # spread 2 makes the rows peaked enough that every logit matters
    return [torch.randn(ROWS, COLS) * 2.0]


def get_init_inputs():
    return []
