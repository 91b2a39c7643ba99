"""RMSNorm in one pass: one block per row keeps the row in registers (float4), reduces the sum of
squares with warp shuffles, then writes x * rsqrt(mean(x^2) + eps) * weight."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps);"

cuda_source = r"""
#include <torch/types.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>

constexpr int VPT = 4;  // float4 per thread: a block of up to 1024 threads covers rows of up to 16384 floats

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block; every thread gets the result. `red` holds 33 floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int nwarps = blockDim.x >> 5;
        float t = lane < nwarps ? red[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                               int dim, float eps) {
    __shared__ float red[33];
    const int64_t row = blockIdx.x;
    const int d4 = dim >> 2;
    const float4* xr = reinterpret_cast<const float4*>(x + row * dim);
    float4* yr = reinterpret_cast<float4*>(y + row * dim);
    const float4* w4 = reinterpret_cast<const float4*>(w);

    float4 v[VPT];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < d4) {
            v[k] = __ldcs(xr + i);
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
    }
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < d4) {
            const float4 g = __ldg(w4 + i);
            float4 o;
            o.x = v[k].x * inv * g.x;
            o.y = v[k].y * inv * g.y;
            o.z = v[k].z * inv * g.z;
            o.w = v[k].w * inv * g.w;
            __stcs(yr + i, o);
        }
    }
}

torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.device().is_cuda() && weight.device().is_cuda(), "rmsnorm_forward: CUDA tensors expected");
    TORCH_CHECK(x.dtype() == torch::kFloat32 && weight.dtype() == torch::kFloat32, "rmsnorm_forward: float32 expected");
    TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "rmsnorm_forward: contiguous tensors expected");
    TORCH_CHECK(x.dim() >= 1, "rmsnorm_forward: x needs a last dimension");
    const int64_t dim = x.size(x.dim() - 1);
    TORCH_CHECK(weight.numel() == dim, "rmsnorm_forward: weight must have ", dim, " elements");
    TORCH_CHECK(dim % 4 == 0 && dim <= 4 * VPT * 1024, "rmsnorm_forward: last dimension must be a multiple of 4 and at most 16384");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(weight.data_ptr<float>()) % 16 == 0, "rmsnorm_forward: 16-byte aligned data expected");
    auto y = torch::empty_like(x);
    const int64_t rows = x.numel() / dim;
    if (rows == 0) return y;
    TORCH_CHECK(rows < (int64_t)1 << 31, "rmsnorm_forward: too many rows");
    const int d4 = (int)(dim / 4);
    int threads = ((d4 + VPT - 1) / VPT + 31) / 32 * 32;
    threads = threads < 32 ? 32 : threads;
    rmsnorm_kernel<<<(unsigned)rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), (int)dim, (float)eps);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "rmsnorm_forward: launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

rmsnorm_ext = load_inline(
    name="suite_rmsnorm_v1",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rmsnorm_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm_ext.rmsnorm_forward(x, self.weight, self.eps)
