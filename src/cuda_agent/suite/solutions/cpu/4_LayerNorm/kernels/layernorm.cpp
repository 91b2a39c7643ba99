// LayerNorm over the last dimension (float32, CPU), rows across OpenMP threads. Per row: vectorised
// mean, vectorised variance of the centred values (the row stays in cache), then (x - mean) * rstd * w + b.
// The row routine is compiled for baseline x86-64, AVX2 and AVX-512; the widest supported one runs.
#include <torch/types.h>
#include <cmath>

// The hot loops are compiled three times (baseline x86-64, AVX2+FMA, AVX-512) from one macro and the
// widest variant this CPU supports is picked once at run time.
static int simd_level() {
    static const int level = (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
                              __builtin_cpu_supports("fma")) ? 2
                             : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
    return level;
}

#define LAYERNORM_ROW(NAME)                                                                        \
    static void NAME(const float* __restrict xr, const float* __restrict wp, const float* __restrict bp, \
                     float* __restrict yr, int64_t dim, float eps) {                               \
        float sum = 0.0f;                                                                          \
        _Pragma("omp simd reduction(+ : sum)")                                                     \
        for (int64_t j = 0; j < dim; ++j) sum += xr[j];                                            \
        const float mean = sum / (float)dim;                                                       \
        float sq = 0.0f;                                                                           \
        _Pragma("omp simd reduction(+ : sq)")                                                      \
        for (int64_t j = 0; j < dim; ++j) {                                                        \
            const float d = xr[j] - mean;                                                          \
            sq += d * d;                                                                           \
        }                                                                                          \
        const float rstd = 1.0f / std::sqrt(sq / (float)dim + eps);                                \
        _Pragma("omp simd")                                                                        \
        for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - mean) * rstd * wp[j] + bp[j];           \
    }
LAYERNORM_ROW(layernorm_row_base)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
LAYERNORM_ROW(layernorm_row_avx2)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
LAYERNORM_ROW(layernorm_row_avx512)
#pragma GCC pop_options

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    for (const auto& t : {x, weight, bias}) {
        TORCH_CHECK(t.device().is_cpu(), "layernorm_forward: CPU tensors expected");
        TORCH_CHECK(t.dtype() == torch::kFloat32, "layernorm_forward: float32 tensors expected");
        TORCH_CHECK(t.is_contiguous(), "layernorm_forward: contiguous tensors expected");
    }
    TORCH_CHECK(x.dim() >= 1, "layernorm_forward: x needs a last dimension");
    const int64_t dim = x.size(x.dim() - 1);
    TORCH_CHECK(dim > 0 && weight.numel() == dim && bias.numel() == dim, "layernorm_forward: weight/bias size mismatch");
    auto y = torch::empty_like(x);
    const int64_t rows = x.numel() / dim;
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const float feps = (float)eps;
    const int level = simd_level();
    void (*row_fn)(const float*, const float*, const float*, float*, int64_t, float) =
        level == 2 ? layernorm_row_avx512 : level == 1 ? layernorm_row_avx2 : layernorm_row_base;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) row_fn(xp + r * dim, wp, bp, yp + r * dim, dim, feps);
    return y;
}
