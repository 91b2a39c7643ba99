# level: 1
# LayerNorm over the last dimension with a learned affine transform.
# CPU variant with small shapes: eager reference runs in a few ms on 2 cores.
import torch
import torch.nn as nn

ROWS = 4096
DIM = 1024


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
