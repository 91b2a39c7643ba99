// Branch-free float math and instruction-set dispatch shared by the kernels of this workspace.
#pragma once
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
