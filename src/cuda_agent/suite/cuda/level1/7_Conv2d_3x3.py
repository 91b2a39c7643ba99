# Level 1: 3x3 convolution, stride 1, padding 1, with bias.
# estimate on H200: 2*64*128*128*128*128*9 = 309 GFLOP / 50 TFLOP/s ~= 6.2 ms with fp32 math
#   (cuDNN may use TF32 by default: then about 1.5-2 ms); activations 2 x 537 MB move in ~0.3 ms
# measured eager on H200 (torch 2.11, median of 10 calls): 1.83 ms with cuDNN TF32 (torch default), 7.61 ms with TF32 off
import torch
import torch.nn as nn

BATCH = 64
CHANNELS_IN = 128
CHANNELS_OUT = 128
HEIGHT = 128
WIDTH = 128


class Model(nn.Module):
    """y = conv2d(x, W, b), kernel 3x3, padding 1."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS_IN, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS_IN, CHANNELS_OUT]
