"""Exact (erf) GELU: one vectorised streaming pass (float4 loads and stores, 4 in flight per thread)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor gelu_forward(torch::Tensor x);"

cuda_source = r"""
#include <torch/types.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>

constexpr int THREADS = 256;
constexpr int ITEMS = 4;  // float4 per thread

__device__ __forceinline__ float gelu_erf(float v) {
    return 0.5f * v * (1.0f + erff(v * 0.7071067811865475f));
}

__global__ void gelu_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
    int64_t base = (int64_t)blockIdx.x * (THREADS * ITEMS) + threadIdx.x;
    float4 v[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        int64_t i = base + (int64_t)k * THREADS;
        if (i < n4) v[k] = __ldcs(x + i);
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        int64_t i = base + (int64_t)k * THREADS;
        if (i < n4) {
            float4 r;
            r.x = gelu_erf(v[k].x);
            r.y = gelu_erf(v[k].y);
            r.z = gelu_erf(v[k].z);
            r.w = gelu_erf(v[k].w);
            __stcs(y + i, r);
        }
    }
}

__global__ void gelu_scalar_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t start, int64_t n) {
    int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu_erf(x[i]);
}

torch::Tensor gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cuda(), "gelu_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "gelu_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "gelu_forward: x must be contiguous");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return y;
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    int64_t done = 0;
    const bool aligned = (reinterpret_cast<uintptr_t>(xp) % 16 == 0) && (reinterpret_cast<uintptr_t>(yp) % 16 == 0);
    if (aligned) {
        const int64_t n4 = n / 4;
        if (n4 > 0) {
            const int64_t blocks = (n4 + THREADS * ITEMS - 1) / (THREADS * ITEMS);
            gelu_vec4_kernel<<<(unsigned)blocks, THREADS, 0, stream>>>(
                reinterpret_cast<const float4*>(xp), reinterpret_cast<float4*>(yp), n4);
        }
        done = n4 * 4;
    }
    if (done < n) {
        const int64_t rest = n - done;
        gelu_scalar_kernel<<<(unsigned)((rest + THREADS - 1) / THREADS), THREADS, 0, stream>>>(xp, yp, done, n);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "gelu_forward: launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

gelu_ext = load_inline(
    name="suite_gelu_erf_v1",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gelu_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_ext.gelu_forward(x)
