// h = x + residual; y = h / sqrt(mean(h^2) + eps) * w over the last dimension (float32, CPU).
#include <torch/types.h>
#include <cmath>

torch::Tensor residual_rmsnorm_forward(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps) {
    for (const auto& t : {x, residual, weight}) {
        TORCH_CHECK(t.device().is_cpu(), "residual_rmsnorm_forward: CPU tensors expected");
        TORCH_CHECK(t.dtype() == torch::kFloat32, "residual_rmsnorm_forward: float32 tensors expected");
        TORCH_CHECK(t.is_contiguous(), "residual_rmsnorm_forward: contiguous tensors expected");
    }
    TORCH_CHECK(x.sizes() == residual.sizes(), "residual_rmsnorm_forward: x and residual differ in shape");
    TORCH_CHECK(x.dim() >= 1, "residual_rmsnorm_forward: x needs a last dimension");
    const int64_t dim = x.size(x.dim() - 1);
    TORCH_CHECK(dim > 0 && weight.numel() == dim, "residual_rmsnorm_forward: weight size mismatch");
    auto y = torch::empty_like(x);
    const int64_t rows = x.numel() / dim;
    const float* xp = x.data_ptr<float>();
    const float* rp = residual.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const float feps = (float)eps;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * dim;
        const float* rr = rp + r * dim;
        float* yr = yp + r * dim;
        float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        int64_t j = 0;
        for (; j + 8 <= dim; j += 8)
            for (int k = 0; k < 8; ++k) {
                const float h = xr[j + k] + rr[j + k];
                yr[j + k] = h;
                part[k] += h * h;
            }
        float ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        for (; j < dim; ++j) {
            const float h = xr[j] + rr[j];
            yr[j] = h;
            ss += h * h;
        }
        const float inv = 1.0f / std::sqrt(ss / (float)dim + feps);
        for (int64_t i = 0; i < dim; ++i) yr[i] = yr[i] * inv * wp[i];
    }
    return y;
}
