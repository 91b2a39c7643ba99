"""Linear + bias + ReLU on the CPU: a register-blocked GEMM (4 rows x 4 output features per step,
vectorised over the reduction), with the bias and the ReLU applied before the single store."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.linear_bias_relu_forward(x, self.linear.weight, self.linear.bias)
