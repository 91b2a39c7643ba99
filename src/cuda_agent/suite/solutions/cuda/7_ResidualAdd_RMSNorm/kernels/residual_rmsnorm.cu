// y = h * rsqrt(mean(h^2) + eps) * weight with h = x + residual, over the last dimension, float32.
// One block per row; h stays in registers (float4), so x and residual are read once and y written once.
#include <torch/types.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>

namespace {

constexpr int VPT = 4;  // float4 per thread; 1024 threads cover 16384 floats

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

__global__ void residual_rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ res,
                                        const float* __restrict__ w, float* __restrict__ y, int dim, float eps) {
    __shared__ float red[33];
    const int64_t row = blockIdx.x;
    const int d4 = dim >> 2;
    const float4* xr = reinterpret_cast<const float4*>(x + row * dim);
    const float4* rr = reinterpret_cast<const float4*>(res + row * dim);
    float4* yr = reinterpret_cast<float4*>(y + row * dim);
    const float4* w4 = reinterpret_cast<const float4*>(w);

    float4 h[VPT];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        h[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < d4) {
            const float4 a = __ldcs(xr + i);
            const float4 b = __ldcs(rr + i);
            h[k] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            ss += (h[k].x * h[k].x + h[k].y * h[k].y) + (h[k].z * h[k].z + h[k].w * h[k].w);
        }
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)dim + eps);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < d4) {
            const float4 g = __ldg(w4 + i);
            float4 o;
            o.x = h[k].x * inv * g.x;
            o.y = h[k].y * inv * g.y;
            o.z = h[k].z * inv * g.z;
            o.w = h[k].w * inv * g.w;
            __stcs(yr + i, o);
        }
    }
}

}  // namespace

torch::Tensor residual_rmsnorm_forward(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps) {
    for (const auto& t : {x, residual, weight}) {
        TORCH_CHECK(t.device().is_cuda(), "residual_rmsnorm_forward: CUDA tensors expected");
        TORCH_CHECK(t.dtype() == torch::kFloat32, "residual_rmsnorm_forward: float32 tensors expected");
        TORCH_CHECK(t.is_contiguous(), "residual_rmsnorm_forward: contiguous tensors expected");
        TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr<float>()) % 16 == 0, "residual_rmsnorm_forward: 16-byte aligned data expected");
    }
    TORCH_CHECK(x.sizes() == residual.sizes(), "residual_rmsnorm_forward: x and residual differ in shape");
    TORCH_CHECK(x.dim() >= 1, "residual_rmsnorm_forward: x needs a last dimension");
    const int64_t dim = x.size(x.dim() - 1);
    TORCH_CHECK(weight.numel() == dim, "residual_rmsnorm_forward: weight size mismatch");
    TORCH_CHECK(dim > 0 && dim % 4 == 0 && dim <= 4 * VPT * 1024, "residual_rmsnorm_forward: last dimension must be a multiple of 4, at most 16384");
    auto y = torch::empty_like(x);
    const int64_t rows = x.numel() / dim;
    if (rows == 0) return y;
    TORCH_CHECK(rows < (int64_t)1 << 31, "residual_rmsnorm_forward: too many rows");
    const int d4 = (int)(dim / 4);
    int threads = ((d4 + VPT - 1) / VPT + 31) / 32 * 32;
    threads = threads < 32 ? 32 : threads;
    residual_rmsnorm_kernel<<<(unsigned)rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), residual.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), (int)dim, (float)eps);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "residual_rmsnorm_forward: launch failed: ", cudaGetErrorString(err));
    return y;
}
