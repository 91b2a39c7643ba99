# Level 1: LayerNorm over the last dimension with a learned affine transform.
# estimate on H200: 65536 x 4096 fp32 = 1.07 GB read + 1.07 GB written = 2.1 GB / 4 TB/s ~= 0.54 ms (memory-bound)
# eager on H200 (torch 2.11): 2.10 ms measured at 196608 x 4096, so ~0.7 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
import torch
import torch.nn as nn

ROWS = 65536
DIM = 4096


class Model(nn.Module):
    """y = LayerNorm(x) over the last dimension (eps 1e-5), affine weight and bias."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)
        with torch.no_grad():  # non-trivial affine parameters, so they matter in the output
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(ROWS, DIM) * 3.0 + 1.0]


def get_init_inputs():
    return [DIM]
