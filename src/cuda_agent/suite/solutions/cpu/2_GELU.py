"""Exact-form GELU on the CPU: one OpenMP-parallel pass over 4096-element chunks, each vectorised
(omp simd) with a branch-free erf approximation (absolute error < 1e-6); the chunk loop is compiled
for baseline x86-64, AVX2 and AVX-512 and the widest supported variant runs."""
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

// verf: Abramowitz-Stegun 7.1.26 rational approximation, absolute error below 1e-6.
static inline float verf(float x) {
    const float a = std::fabs(x);
    const float t = 1.0f / (1.0f + 0.3275911f * a);
    float poly = 1.061405429f;
    poly = poly * t - 1.453152027f;
    poly = poly * t + 1.421413741f;
    poly = poly * t - 0.284496736f;
    poly = poly * t + 0.254829592f;
    return std::copysign(1.0f - poly * t * vexp(-a * a), x);
}

// The hot loops are compiled three times (baseline x86-64, AVX2+FMA, AVX-512) from one macro and the
// widest variant this CPU supports is picked once at run time.
static int simd_level() {
    static const int level = (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
                              __builtin_cpu_supports("fma")) ? 2
                             : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
    return level;
}

#define GELU_SPAN(NAME)                                                                  \
    static void NAME(const float* __restrict xp, float* __restrict yp, int64_t n) {      \
        _Pragma("omp simd")                                                              \
        for (int64_t i = 0; i < n; ++i) {                                                \
            const float v = xp[i];                                                       \
            yp[i] = 0.5f * v * (1.0f + verf(v * 0.7071067811865475f));                  \
        }                                                                                \
    }
GELU_SPAN(gelu_span_base)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
GELU_SPAN(gelu_span_avx2)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
GELU_SPAN(gelu_span_avx512)
#pragma GCC pop_options

torch::Tensor gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "gelu_forward: x must be a CPU tensor");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "gelu_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "gelu_forward: x must be contiguous");
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t n = x.numel();
    const int level = simd_level();
    void (*span)(const float*, float*, int64_t) =
        level == 2 ? gelu_span_avx512 : level == 1 ? gelu_span_avx2 : gelu_span_base;
    constexpr int64_t CHUNK = 8192;
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t begin = c * CHUNK;
        const int64_t len = n - begin < CHUNK ? n - begin : CHUNK;
        span(xp + begin, yp + begin, len);
    }
    return y;
}
"""

gelu_cpu = load_inline(
    name="suite_cpu_gelu_v3",
    cpp_sources=cpp_source,
    functions=["gelu_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_cpu.gelu_forward(x)
