# Level 2: LayerNorm over the last dimension followed by exact GELU.
# estimate on H200: 65536 x 4096 fp32 (1.07 GB); eager: LayerNorm 2.1 GB + GELU 2.1 GB = 4.3 GB / 4 TB/s ~= 1.1 ms
#   (fused: 2.1 GB ~= 0.54 ms)
# eager on H200 (torch 2.11): 2.42 ms measured at 131072 x 4096, so ~1.2 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 65536
DIM = 4096


class Model(nn.Module):
    """y = gelu(LayerNorm(x))."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm(x))


def get_inputs():
    return [torch.randn(ROWS, DIM) * 2.0 - 0.5]


def get_init_inputs():
    return [DIM]
