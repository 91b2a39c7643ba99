"""Linear + bias + ReLU as one fp32 GEMM with the bias and the ReLU applied in the epilogue
(128x128 block tiles, 8x8 register tiles per thread, double-buffered shared memory)."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.linear_bias_relu_forward(x, self.linear.weight, self.linear.bias)
