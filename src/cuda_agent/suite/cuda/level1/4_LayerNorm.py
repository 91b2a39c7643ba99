# Level 1: LayerNorm over the last dimension with a learned affine transform.
# estimate on H200: 196608 x 4096 fp32 = 3.2 GB read + 3.2 GB written = 6.4 GB / 4 TB/s ~= 1.6 ms (memory-bound)
# measured eager on H200 (torch 2.11, median of 10 calls): 2.10 ms
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly; the estimate above was made for the larger original shape.
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
