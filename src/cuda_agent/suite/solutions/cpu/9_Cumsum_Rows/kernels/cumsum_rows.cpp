// Inclusive prefix sum along the last dimension (float32, CPU). The running sum is kept in double,
// so long rows do not drift; each row is one sequential pass.
#include <torch/types.h>

torch::Tensor cumsum_rows_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "cumsum_rows_forward: x must be a CPU tensor");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "cumsum_rows_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous() && x.dim() >= 1, "cumsum_rows_forward: contiguous x with a last dimension expected");
    auto y = torch::empty_like(x);
    if (x.numel() == 0) return y;
    const int64_t cols = x.size(x.dim() - 1);
    const int64_t rows = x.numel() / cols;
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * cols;
        float* yr = yp + r * cols;
        double s = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            s += xr[j];
            yr[j] = (float)s;
        }
    }
    return y;
}
