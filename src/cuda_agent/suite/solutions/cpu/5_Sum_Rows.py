"""Row sums on the CPU: rows split across OpenMP threads, each row reduced with a vectorised
(omp simd) float32 sum; the row routine is compiled for baseline x86-64, AVX2 and AVX-512 and the
widest supported variant runs."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cstdint>

// The hot loops are compiled three times (baseline x86-64, AVX2+FMA, AVX-512) from one macro and the
// widest variant this CPU supports is picked once at run time.
static int simd_level() {
    static const int level = (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
                              __builtin_cpu_supports("fma")) ? 2
                             : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
    return level;
}

#define SUM_ROW(NAME)                                                                    \
    static float NAME(const float* __restrict xr, int64_t cols) {                        \
        float s = 0.0f;                                                                  \
        _Pragma("omp simd reduction(+ : s)")                                             \
        for (int64_t j = 0; j < cols; ++j) s += xr[j];                                   \
        return s;                                                                        \
    }
SUM_ROW(sum_row_base)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
SUM_ROW(sum_row_avx2)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
SUM_ROW(sum_row_avx512)
#pragma GCC pop_options

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
    const int level = simd_level();
    float (*row_fn)(const float*, int64_t) = level == 2 ? sum_row_avx512 : level == 1 ? sum_row_avx2 : sum_row_base;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) yp[r] = row_fn(xp + r * cols, cols);
    return y;
}
"""

sum_cpu = load_inline(
    name="suite_cpu_sum_rows_v2",
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
