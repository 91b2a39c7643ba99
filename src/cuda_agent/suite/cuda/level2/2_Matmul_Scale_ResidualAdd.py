# Level 2: bias-free projection, scaled, added back onto its input (residual).
# estimate on H200: 2*8192*4096*4096 = 275 GFLOP / 50 TFLOP/s ~= 5.5 ms (compute-bound), + 2 elementwise passes ~0.3 ms
# measured eager on H200 (torch 2.11, median of 10 calls): 5.64 ms
import torch
import torch.nn as nn

BATCH = 8192
DIM = 4096
SCALE = 0.5


class Model(nn.Module):
    """y = (x @ W^T) * scale + x."""

    def __init__(self, dim: int, scale: float):
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        with torch.no_grad():
            self.proj.weight.normal_(0.0, dim ** -0.5)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.scale + x


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [DIM, SCALE]
