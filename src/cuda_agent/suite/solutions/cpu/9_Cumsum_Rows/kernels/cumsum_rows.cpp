// Inclusive prefix sum along the last dimension (float32, CPU). The running sums are kept in double,
// so long rows do not drift. A prefix sum is a chain of dependent additions, so rows are processed in
// groups of 8 with their chains interleaved (8 independent additions in flight per column step);
// groups of rows are spread over OpenMP threads.
#include <torch/types.h>

namespace {

constexpr int64_t GROUP = 8;

void cumsum_group(const float* __restrict x, float* __restrict y, int64_t cols) {
    double s[GROUP] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (int64_t j = 0; j < cols; ++j) {
        for (int64_t r = 0; r < GROUP; ++r) {
            s[r] += x[r * cols + j];
            y[r * cols + j] = (float)s[r];
        }
    }
}

void cumsum_row(const float* __restrict x, float* __restrict y, int64_t cols) {
    double s = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
        s += x[j];
        y[j] = (float)s;
    }
}

}  // namespace

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
    const int64_t groups = rows / GROUP;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; ++g) cumsum_group(xp + g * GROUP * cols, yp + g * GROUP * cols, cols);
    for (int64_t r = groups * GROUP; r < rows; ++r) cumsum_row(xp + r * cols, yp + r * cols, cols);
    return y;
}
