// Inclusive prefix sum along the last dimension of a contiguous float32 tensor.
// One warp per row. A chunk is 32 float4 (128 floats): each lane scans its float4, the lanes' totals
// are scanned with __shfl_up_sync, and a running carry links the chunks. Four chunks are loaded at
// once so each lane keeps four 16-byte loads in flight.
#include <torch/types.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>

namespace {

constexpr int WARPS_PER_BLOCK = 8;
constexpr int CHUNKS = 4;
constexpr unsigned FULL = 0xffffffffu;

// Inclusive scan of one value per lane; returns the lane's exclusive prefix, adds the total to carry.
__device__ __forceinline__ float warp_exclusive(float total, float& carry) {
    const int lane = threadIdx.x & 31;
    float t = total;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float n = __shfl_up_sync(FULL, t, o);
        if (lane >= o) t += n;
    }
    float excl = __shfl_up_sync(FULL, t, 1);
    if (lane == 0) excl = 0.0f;
    const float before = carry;
    carry += __shfl_sync(FULL, t, 31);
    return before + excl;
}

__global__ void cumsum_vec_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int c4 = cols >> 2;
    const float4* xr = reinterpret_cast<const float4*>(x + row * cols);
    float4* yr = reinterpret_cast<float4*>(y + row * cols);
    float carry = 0.0f;
    for (int base = 0; base < c4; base += 32 * CHUNKS) {
        float4 v[CHUNKS];
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int i = base + c * 32 + lane;
            v[c] = i < c4 ? __ldcs(xr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            if (base + c * 32 >= c4) break;  // uniform across the warp
            v[c].y += v[c].x;
            v[c].z += v[c].y;
            v[c].w += v[c].z;
            const float add = warp_exclusive(v[c].w, carry);
            v[c].x += add;
            v[c].y += add;
            v[c].z += add;
            v[c].w += add;
            const int i = base + c * 32 + lane;
            if (i < c4) __stcs(yr + i, v[c]);
        }
    }
}

__global__ void cumsum_any_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    float carry = 0.0f;
    for (int base = 0; base < cols; base += 32) {
        const int j = base + lane;
        const float v = j < cols ? xr[j] : 0.0f;
        const float excl = warp_exclusive(v, carry);
        if (j < cols) yr[j] = excl + v;
    }
}

}  // namespace

torch::Tensor cumsum_rows_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cuda(), "cumsum_rows_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "cumsum_rows_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "cumsum_rows_forward: x must be contiguous");
    TORCH_CHECK(x.dim() >= 1, "cumsum_rows_forward: x needs a last dimension");
    auto y = torch::empty_like(x);
    if (x.numel() == 0) return y;
    const int64_t cols = x.size(x.dim() - 1);
    TORCH_CHECK(cols < (int64_t)1 << 30, "cumsum_rows_forward: rows too long");
    const int64_t rows = x.numel() / cols;
    const int64_t blocks = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    TORCH_CHECK(blocks < (int64_t)1 << 31, "cumsum_rows_forward: too many rows");
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(xp) % 16 == 0 && reinterpret_cast<uintptr_t>(yp) % 16 == 0;
    if (vec) {
        cumsum_vec_kernel<<<(unsigned)blocks, 32 * WARPS_PER_BLOCK, 0, stream>>>(xp, yp, rows, (int)cols);
    } else {
        cumsum_any_kernel<<<(unsigned)blocks, 32 * WARPS_PER_BLOCK, 0, stream>>>(xp, yp, rows, (int)cols);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "cumsum_rows_forward: launch failed: ", cudaGetErrorString(err));
    return y;
}
