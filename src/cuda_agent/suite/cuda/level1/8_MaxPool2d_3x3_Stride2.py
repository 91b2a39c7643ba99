# Level 1: 2-D max pooling, window 3x3, stride 2, padding 1 (overlapping windows).
# estimate on H200: 32x128x256x256 fp32 = 1.07 GB read + 0.27 GB written = 1.34 GB / 4 TB/s ~= 0.34 ms (memory-bound)
# eager on H200 (torch 2.11): 4.12 ms measured at 128x128x256x256, so ~1.0 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
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
