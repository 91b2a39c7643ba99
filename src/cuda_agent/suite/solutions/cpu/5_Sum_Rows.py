"""Row sums on the CPU: rows split across OpenMP threads, each row summed with 8 independent
partial sums (vectorisable) in float32 and combined at the end."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor sum_rows_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "sum_rows_forward: x must be a CPU tensor");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "sum_rows_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous() && x.dim() >= 1, "sum_rows_forward: contiguous x with a last dimension expected");
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
    auto y = torch::empty(shape, x.options());
    const int64_t cols = x.size(x.dim() - 1);
    const int64_t rows = y.numel();
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * cols;
        float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        int64_t j = 0;
        for (; j + 8 <= cols; j += 8)
            for (int k = 0; k < 8; ++k) part[k] += xr[j + k];
        float s = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        for (; j < cols; ++j) s += xr[j];
        yp[r] = s;
    }
    return y;
}
"""

sum_cpu = load_inline(
    name="suite_cpu_sum_rows_v1",
    cpp_sources=cpp_source,
    functions=["sum_rows_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_cpu.sum_rows_forward(x)
