"""Row softmax on the CPU: rows split across OpenMP threads; per row a vectorised max, a vectorised
exp-and-sum (branch-free exp, relative error ~3e-7) and a scaling pass while the row is in cache.
The row routine is compiled for baseline x86-64, AVX2 and AVX-512; the widest supported one runs."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <bit>
#include <cmath>
#include <cstdint>

// Vectorisable float exp and erf (no libm calls, no branches) for `#pragma omp simd` loops.
// vexp: x = n*ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact product), e^r by a degree-6
// Taylor polynomial, 2^n written into the exponent bits; relative error ~3e-7 for -87 < x < 88
// (below that it returns ~1e-38 instead of 0; meant for x <= 0 arguments such as x - max).
static inline float vexp(float x) {
    const float n = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f;  // round to nearest integer
    const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t k = (int32_t)n;
    k = k < -126 ? -126 : k;
    k = k > 127 ? 127 : k;
    return p * std::bit_cast<float>((k + 127) << 23);
}

// The hot loops are compiled three times (baseline x86-64, AVX2+FMA, AVX-512) from one macro and the
// widest variant this CPU supports is picked once at run time.
static int simd_level() {
    static const int level = (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
                              __builtin_cpu_supports("fma")) ? 2
                             : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
    return level;
}

#define SOFTMAX_ROW(NAME)                                                                \
    static void NAME(const float* __restrict xr, float* __restrict yr, int64_t cols) {   \
        float m = -INFINITY;                                                             \
        _Pragma("omp simd reduction(max : m)")                                           \
        for (int64_t j = 0; j < cols; ++j) m = m > xr[j] ? m : xr[j];                    \
        float s = 0.0f;                                                                  \
        _Pragma("omp simd reduction(+ : s)")                                             \
        for (int64_t j = 0; j < cols; ++j) {                                             \
            const float e = vexp(xr[j] - m);                                             \
            yr[j] = e;                                                                   \
            s += e;                                                                      \
        }                                                                                \
        const float inv = 1.0f / s;                                                      \
        _Pragma("omp simd")                                                              \
        for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;                                 \
    }
SOFTMAX_ROW(softmax_row_base)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
SOFTMAX_ROW(softmax_row_avx2)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
SOFTMAX_ROW(softmax_row_avx512)
#pragma GCC pop_options

torch::Tensor softmax_rows_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "softmax_rows_forward: x must be a CPU tensor");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "softmax_rows_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous() && x.dim() >= 1, "softmax_rows_forward: contiguous x with a last dimension expected");
    auto y = torch::empty_like(x);
    const int64_t cols = x.size(x.dim() - 1);
    if (x.numel() == 0) return y;
    const int64_t rows = x.numel() / cols;
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int level = simd_level();
    void (*row_fn)(const float*, float*, int64_t) =
        level == 2 ? softmax_row_avx512 : level == 1 ? softmax_row_avx2 : softmax_row_base;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) row_fn(xp + r * cols, yp + r * cols, cols);
    return y;
}
"""

softmax_cpu = load_inline(
    name="suite_cpu_softmax_rows_v3",
    cpp_sources=cpp_source,
    functions=["softmax_rows_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax_cpu.softmax_rows_forward(x)
