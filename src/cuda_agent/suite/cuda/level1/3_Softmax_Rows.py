# Level 1: softmax along the last dimension, rows of moderate length (1024).
# estimate on H200: 262144 x 1024 fp32 = 1.07 GB read + 1.07 GB written = 2.1 GB / 4 TB/s ~= 0.54 ms (memory-bound)
# eager on H200 (torch 2.11): 1.62 ms measured at 786432 x 1024, so ~0.55 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
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
