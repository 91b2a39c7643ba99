# Level 2: 3x3 convolution (no padding), ReLU, then a per-channel bias added after the activation.
# estimate on H200: 2*128*128*126*126*64*9 = 300 GFLOP / 50 TFLOP/s ~= 6.0 ms with fp32 math (TF32 cuDNN: ~1.5 ms)
#   + ReLU and add passes over the 1.04 GB output: 4.2 GB ~= 1.0 ms
# measured eager on H200 (torch 2.11, median of 10 calls): 3.94 ms with cuDNN TF32 (torch default), 9.21 ms with TF32 off
import torch
import torch.nn as nn

BATCH = 128
CHANNELS_IN = 64
CHANNELS_OUT = 128
HEIGHT = 128
WIDTH = 128


class Model(nn.Module):
    """y = relu(conv2d(x)) + bias[c]."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) + self.bias


def get_inputs():
    return [torch.randn(BATCH, CHANNELS_IN, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS_IN, CHANNELS_OUT]
