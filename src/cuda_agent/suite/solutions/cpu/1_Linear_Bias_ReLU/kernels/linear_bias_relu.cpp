// y = relu(x @ W^T + b), float32 on the CPU. x: (M, K), W: (N, K) (nn.Linear layout), b: (N,).
// Both operands are contiguous along K, so every output is a dot product of two contiguous rows.
// The work is cut into 4x4 output blocks: 4 rows of x against 4 rows of W share their loads, and the
// K loop is vectorised (omp simd) into 16 running sums. Blocks of rows are spread over OpenMP threads.
#include <torch/types.h>
#include <algorithm>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t k) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < k; ++i) s += a[i] * b[i];
    return s;
}

}  // namespace

torch::Tensor linear_bias_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    for (const auto& t : {x, weight, bias}) {
        TORCH_CHECK(t.device().is_cpu(), "linear_bias_relu_forward: CPU tensors expected");
        TORCH_CHECK(t.dtype() == torch::kFloat32, "linear_bias_relu_forward: float32 tensors expected");
        TORCH_CHECK(t.is_contiguous(), "linear_bias_relu_forward: contiguous tensors expected");
    }
    TORCH_CHECK(weight.dim() == 2 && bias.dim() == 1 && bias.size(0) == weight.size(0),
                "linear_bias_relu_forward: weight (N, K) and bias (N,) expected");
    TORCH_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) == weight.size(1), "linear_bias_relu_forward: x (..., K) expected");
    const int64_t K = weight.size(1), N = weight.size(0);
    const int64_t M = K == 0 ? 0 : x.numel() / K;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = N;
    auto y = torch::empty(shape, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    constexpr int64_t R = 4;  // rows of x per block
    constexpr int64_t C = 4;  // rows of W (output features) per block
    const int64_t row_blocks = (M + R - 1) / R;
#pragma omp parallel for schedule(static)
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
        const int64_t m0 = rb * R;
        const int64_t mr = std::min(R, M - m0);
        int64_t n0 = 0;
        if (mr == R) {
            for (; n0 + C <= N; n0 += C) {
                float acc[R][C] = {};
                const float* a0 = xp + (m0 + 0) * K;
                const float* a1 = xp + (m0 + 1) * K;
                const float* a2 = xp + (m0 + 2) * K;
                const float* a3 = xp + (m0 + 3) * K;
                const float* b0 = wp + (n0 + 0) * K;
                const float* b1 = wp + (n0 + 1) * K;
                const float* b2 = wp + (n0 + 2) * K;
                const float* b3 = wp + (n0 + 3) * K;
                float s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
                float s20 = 0, s21 = 0, s22 = 0, s23 = 0, s30 = 0, s31 = 0, s32 = 0, s33 = 0;
#pragma omp simd reduction(+ : s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33)
                for (int64_t k = 0; k < K; ++k) {
                    const float x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
                    const float w0 = b0[k], w1 = b1[k], w2 = b2[k], w3 = b3[k];
                    s00 += x0 * w0; s01 += x0 * w1; s02 += x0 * w2; s03 += x0 * w3;
                    s10 += x1 * w0; s11 += x1 * w1; s12 += x1 * w2; s13 += x1 * w3;
                    s20 += x2 * w0; s21 += x2 * w1; s22 += x2 * w2; s23 += x2 * w3;
                    s30 += x3 * w0; s31 += x3 * w1; s32 += x3 * w2; s33 += x3 * w3;
                }
                acc[0][0] = s00; acc[0][1] = s01; acc[0][2] = s02; acc[0][3] = s03;
                acc[1][0] = s10; acc[1][1] = s11; acc[1][2] = s12; acc[1][3] = s13;
                acc[2][0] = s20; acc[2][1] = s21; acc[2][2] = s22; acc[2][3] = s23;
                acc[3][0] = s30; acc[3][1] = s31; acc[3][2] = s32; acc[3][3] = s33;
                for (int64_t i = 0; i < R; ++i)
                    for (int64_t j = 0; j < C; ++j)
                        yp[(m0 + i) * N + n0 + j] = std::max(acc[i][j] + bp[n0 + j], 0.0f);
            }
        }
        // Remainder rows or columns: plain dot products.
        for (int64_t i = 0; i < mr; ++i)
            for (int64_t n = (mr == R ? n0 : 0); n < N; ++n)
                yp[(m0 + i) * N + n] = std::max(dot(xp + (m0 + i) * K, wp + n * K, K) + bp[n], 0.0f);
    }
    return y;
}
