# Level 2: fully connected layer, tanh, then a sum over the features.
# estimate on H200: 2*8192*4096*4096 = 275 GFLOP / 50 TFLOP/s ~= 5.5 ms (compute-bound), + tanh and sum passes ~0.2 ms
# measured eager on H200 (torch 2.11, median of 10 calls): 5.54 ms
import torch
import torch.nn as nn

BATCH = 8192
IN_FEATURES = 4096
OUT_FEATURES = 4096


class Model(nn.Module):
    """y[i] = sum_j tanh(x @ W^T + b)[i, j]."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        with torch.no_grad():
            self.linear.weight.normal_(0.0, in_features ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x)).sum(dim=-1)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
