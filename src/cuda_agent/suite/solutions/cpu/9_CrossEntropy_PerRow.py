"""Per-row cross-entropy on the CPU: logsumexp of each row (vectorised max and exp-sum) minus the
target's logit; rows split across OpenMP threads, log-probabilities never materialised. The row
routine is compiled for baseline x86-64, AVX2 and AVX-512; the widest supported one runs."""
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

// logsumexp of one row
#define LSE_ROW(NAME)                                                                    \
    static float NAME(const float* __restrict xr, int64_t cols) {                        \
        float m = -INFINITY;                                                             \
        _Pragma("omp simd reduction(max : m)")                                           \
        for (int64_t j = 0; j < cols; ++j) m = m > xr[j] ? m : xr[j];                    \
        float s = 0.0f;                                                                  \
        _Pragma("omp simd reduction(+ : s)")                                             \
        for (int64_t j = 0; j < cols; ++j) s += vexp(xr[j] - m);                         \
        return m + std::log(s);                                                          \
    }
LSE_ROW(lse_row_base)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
LSE_ROW(lse_row_avx2)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
LSE_ROW(lse_row_avx512)
#pragma GCC pop_options

torch::Tensor cross_entropy_rows_forward(torch::Tensor logits, torch::Tensor target) {
    TORCH_CHECK(logits.device().is_cpu() && target.device().is_cpu(), "cross_entropy_rows_forward: CPU tensors expected");
    TORCH_CHECK(logits.dtype() == torch::kFloat32 && target.dtype() == torch::kInt64, "cross_entropy_rows_forward: float32 logits, int64 target");
    TORCH_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0), "cross_entropy_rows_forward: (N, C) and (N,) expected");
    TORCH_CHECK(logits.is_contiguous() && target.is_contiguous(), "cross_entropy_rows_forward: contiguous tensors expected");
    const int64_t rows = logits.size(0), classes = logits.size(1);
    auto loss = torch::empty({rows}, logits.options());
    const float* lp = logits.data_ptr<float>();
    const int64_t* tp = target.data_ptr<int64_t>();
    float* out = loss.data_ptr<float>();
    const int level = simd_level();
    float (*lse)(const float*, int64_t) = level == 2 ? lse_row_avx512 : level == 1 ? lse_row_avx2 : lse_row_base;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = lp + r * classes;
        const int64_t t = tp[r];
        out[r] = (t >= 0 && t < classes) ? lse(xr, classes) - xr[t] : NAN;
    }
    return loss;
}
"""

ce_cpu = load_inline(
    name="suite_cpu_cross_entropy_rows_v3",
    cpp_sources=cpp_source,
    functions=["cross_entropy_rows_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ce_cpu.cross_entropy_rows_forward(logits, target)
