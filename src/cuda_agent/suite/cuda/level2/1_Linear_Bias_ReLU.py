# Level 2: fully connected layer (GEMM + bias) followed by ReLU.
# estimate on H200: 2*8192*4096*4096 = 275 GFLOP / 50 TFLOP/s ~= 5.5 ms (compute-bound), + ReLU pass 268 MB ~= 0.07 ms
# measured eager on H200 (torch 2.11, median of 10 calls): 5.53 ms
import torch
import torch.nn as nn

BATCH = 8192
IN_FEATURES = 4096
OUT_FEATURES = 4096


class Model(nn.Module):
    """y = relu(x @ W^T + b)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True)
        with torch.no_grad():
            self.linear.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
