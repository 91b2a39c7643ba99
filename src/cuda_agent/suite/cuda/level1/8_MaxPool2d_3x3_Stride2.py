# Level 1: 2-D max pooling, window 3x3, stride 2, padding 1 (overlapping windows).
# estimate on H200: 128x128x256x256 fp32 = 4.3 GB read + 1.1 GB written = 5.4 GB / 4 TB/s ~= 1.3 ms (memory-bound)
# measured eager on H200 (torch 2.11, median of 10 calls): 4.12 ms
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly; the estimate above was made for the larger original shape.
import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 128
HEIGHT = 256
WIDTH = 256


class Model(nn.Module):
    """y = max_pool2d(x, kernel_size=3, stride=2, padding=1)."""

    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return []
