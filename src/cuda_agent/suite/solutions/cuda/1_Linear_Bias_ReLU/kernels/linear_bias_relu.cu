// y = relu(x @ W^T + b) in float32 (no TF32), x: (M, K), W: (N, K) as stored by nn.Linear, b: (N,).
//
// Fast path (M % 128 == 0, N % 128 == 0, K % 8 == 0, 16-byte aligned): a 128x128 output tile per block
// of 256 threads; each thread accumulates an 8x8 sub-tile (two 4-row by two 4-column groups, so the
// shared-memory reads are conflict-free float4). K advances 8 at a time through two shared-memory
// buffers: the next slab is fetched into registers while the current one is multiplied. Bias and ReLU
// are applied to the accumulators before the single float4 store. Any other shape uses a simple
// 16x16 shared-memory tiled kernel.
#include <torch/types.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>

namespace {

constexpr int BM = 128;
constexpr int BN = 128;
constexpr int BK = 8;
constexpr int PAD = 4;
constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS, 2)
gemm_bias_relu_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                      float* __restrict__ y, int M, int N, int K) {
    __shared__ __align__(16) float As[2][BK][BM + PAD];
    __shared__ __align__(16) float Bs[2][BK][BN + PAD];

    const int t = threadIdx.x;
    const int tx = t & 15;  // column group
    const int ty = t >> 4;  // row group
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;

    // Global -> shared mapping: each thread moves one float4 of the A slab and one of the B slab.
    const int lrow = t >> 1;
    const int lcol = (t & 1) * 4;
    const float* a_src = x + (int64_t)(m0 + lrow) * K + lcol;
    const float* b_src = w + (int64_t)(n0 + lrow) * K + lcol;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    float4 a_next = *reinterpret_cast<const float4*>(a_src);
    float4 b_next = *reinterpret_cast<const float4*>(b_src);
    As[0][lcol + 0][lrow] = a_next.x;
    As[0][lcol + 1][lrow] = a_next.y;
    As[0][lcol + 2][lrow] = a_next.z;
    As[0][lcol + 3][lrow] = a_next.w;
    Bs[0][lcol + 0][lrow] = b_next.x;
    Bs[0][lcol + 1][lrow] = b_next.y;
    Bs[0][lcol + 2][lrow] = b_next.z;
    Bs[0][lcol + 3][lrow] = b_next.w;
    __syncthreads();

    const int k_tiles = K / BK;
    for (int kt = 0; kt < k_tiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < k_tiles;
        if (more) {
            a_next = *reinterpret_cast<const float4*>(a_src + (kt + 1) * BK);
            b_next = *reinterpret_cast<const float4*>(b_src + (kt + 1) * BK);
        }
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[cur][kk][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][kk][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][kk][64 + tx * 4]);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) {
            const int nxt = cur ^ 1;
            As[nxt][lcol + 0][lrow] = a_next.x;
            As[nxt][lcol + 1][lrow] = a_next.y;
            As[nxt][lcol + 2][lrow] = a_next.z;
            As[nxt][lcol + 3][lrow] = a_next.w;
            Bs[nxt][lcol + 0][lrow] = b_next.x;
            Bs[nxt][lcol + 1][lrow] = b_next.y;
            Bs[nxt][lcol + 2][lrow] = b_next.z;
            Bs[nxt][lcol + 3][lrow] = b_next.w;
        }
        __syncthreads();
    }

    const int c0 = n0 + tx * 4;
    const int c1 = n0 + 64 + tx * 4;
    const float4 bias0 = *reinterpret_cast<const float4*>(bias + c0);
    const float4 bias1 = *reinterpret_cast<const float4*>(bias + c1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        float* dst = y + (int64_t)r * N;
        float4 o0, o1;
        o0.x = fmaxf(acc[i][0] + bias0.x, 0.0f);
        o0.y = fmaxf(acc[i][1] + bias0.y, 0.0f);
        o0.z = fmaxf(acc[i][2] + bias0.z, 0.0f);
        o0.w = fmaxf(acc[i][3] + bias0.w, 0.0f);
        o1.x = fmaxf(acc[i][4] + bias1.x, 0.0f);
        o1.y = fmaxf(acc[i][5] + bias1.y, 0.0f);
        o1.z = fmaxf(acc[i][6] + bias1.z, 0.0f);
        o1.w = fmaxf(acc[i][7] + bias1.w, 0.0f);
        *reinterpret_cast<float4*>(dst + c0) = o0;
        *reinterpret_cast<float4*>(dst + c1) = o1;
    }
}

constexpr int ST = 16;

__global__ void gemm_bias_relu_any_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                          const float* __restrict__ bias, float* __restrict__ y, int M, int N, int K) {
    __shared__ float xs[ST][ST + 1];
    __shared__ float ws[ST][ST + 1];
    const int r = blockIdx.y * ST + threadIdx.y;  // output row (x row)
    const int c = blockIdx.x * ST + threadIdx.x;  // output column (w row)
    const int wr = blockIdx.x * ST + threadIdx.y; // w row loaded by this thread
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += ST) {
        const int k = k0 + threadIdx.x;
        xs[threadIdx.y][threadIdx.x] = (r < M && k < K) ? x[(int64_t)r * K + k] : 0.0f;
        ws[threadIdx.y][threadIdx.x] = (wr < N && k < K) ? w[(int64_t)wr * K + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < ST; ++kk) acc = fmaf(xs[threadIdx.y][kk], ws[threadIdx.x][kk], acc);
        __syncthreads();
    }
    if (r < M && c < N) y[(int64_t)r * N + c] = fmaxf(acc + bias[c], 0.0f);
}

}  // namespace

torch::Tensor linear_bias_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    for (const auto& t : {x, weight, bias}) {
        TORCH_CHECK(t.device().is_cuda(), "linear_bias_relu_forward: CUDA tensors expected");
        TORCH_CHECK(t.dtype() == torch::kFloat32, "linear_bias_relu_forward: float32 tensors expected");
        TORCH_CHECK(t.is_contiguous(), "linear_bias_relu_forward: contiguous tensors expected");
    }
    TORCH_CHECK(weight.dim() == 2 && bias.dim() == 1 && bias.size(0) == weight.size(0),
                "linear_bias_relu_forward: weight (N, K) and bias (N,) expected");
    TORCH_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) == weight.size(1), "linear_bias_relu_forward: x (..., K) expected");
    const int64_t K = weight.size(1);
    const int64_t N = weight.size(0);
    const int64_t M = K == 0 ? 0 : x.numel() / K;
    std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
    out_shape.back() = N;
    auto y = torch::empty(out_shape, x.options());
    if (M == 0 || N == 0) return y;
    TORCH_CHECK(K > 0, "linear_bias_relu_forward: empty reduction dimension");
    TORCH_CHECK(M < (int64_t)1 << 31 && N < (int64_t)1 << 31 && K < (int64_t)1 << 31, "linear_bias_relu_forward: too large");
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    bool fast = M % BM == 0 && N % BN == 0 && K % BK == 0 && (M / BM) <= 65535;
    for (const auto& t : {x, weight, bias, y})
        fast = fast && reinterpret_cast<uintptr_t>(t.data_ptr<float>()) % 16 == 0;
    if (fast) {
        const dim3 grid((unsigned)(N / BN), (unsigned)(M / BM));
        gemm_bias_relu_kernel<<<grid, THREADS, 0, stream>>>(
            x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(), (int)M, (int)N, (int)K);
    } else {
        const int64_t gy = (M + ST - 1) / ST;
        TORCH_CHECK(gy <= 65535, "linear_bias_relu_forward: too many rows for the generic kernel");
        const dim3 grid((unsigned)((N + ST - 1) / ST), (unsigned)gy), block(ST, ST);
        gemm_bias_relu_any_kernel<<<grid, block, 0, stream>>>(
            x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(), (int)M, (int)N, (int)K);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "linear_bias_relu_forward: launch failed: ", cudaGetErrorString(err));
    return y;
}
