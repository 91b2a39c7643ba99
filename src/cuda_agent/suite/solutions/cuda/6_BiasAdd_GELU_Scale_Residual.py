"""gelu(x + bias) * gamma + residual in one pass: each thread owns a float4 column slice, loads its bias
and gain once, and streams 4 rows of x and residual with float4 loads."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor bias_gelu_scale_residual_forward(torch::Tensor x, torch::Tensor residual, torch::Tensor bias, torch::Tensor gamma);"

cuda_source = r"""
#include <torch/types.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>

constexpr int THREADS = 256;
constexpr int ROWS_PER_BLOCK = 4;

__device__ __forceinline__ float gelu_erf(float v) {
    return 0.5f * v * (1.0f + erff(v * 0.7071067811865475f));
}

__device__ __forceinline__ float fused(float x, float b, float g, float r) {
    return gelu_erf(x + b) * g + r;
}

__global__ void fused_vec4_kernel(const float4* __restrict__ x, const float4* __restrict__ res,
                                  const float4* __restrict__ bias, const float4* __restrict__ gamma,
                                  float4* __restrict__ y, int64_t rows, int d4) {
    const int c = blockIdx.x * THREADS + threadIdx.x;
    if (c >= d4) return;
    const float4 b = __ldg(bias + c);
    const float4 g = __ldg(gamma + c);
    for (int64_t r0 = (int64_t)blockIdx.y * ROWS_PER_BLOCK; r0 < rows; r0 += (int64_t)gridDim.y * ROWS_PER_BLOCK) {
        float4 xv[ROWS_PER_BLOCK], rv[ROWS_PER_BLOCK];
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) {
            if (r0 + r < rows) {
                const int64_t i = (r0 + r) * d4 + c;
                xv[r] = __ldcs(x + i);
                rv[r] = __ldcs(res + i);
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) {
            if (r0 + r < rows) {
                float4 o;
                o.x = fused(xv[r].x, b.x, g.x, rv[r].x);
                o.y = fused(xv[r].y, b.y, g.y, rv[r].y);
                o.z = fused(xv[r].z, b.z, g.z, rv[r].z);
                o.w = fused(xv[r].w, b.w, g.w, rv[r].w);
                __stcs(y + (r0 + r) * d4 + c, o);
            }
        }
    }
}

__global__ void fused_scalar_kernel(const float* __restrict__ x, const float* __restrict__ res,
                                    const float* __restrict__ bias, const float* __restrict__ gamma,
                                    float* __restrict__ y, int64_t n, int64_t dim) {
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i < n) {
        const int64_t c = i % dim;
        y[i] = fused(x[i], bias[c], gamma[c], res[i]);
    }
}

torch::Tensor bias_gelu_scale_residual_forward(torch::Tensor x, torch::Tensor residual, torch::Tensor bias, torch::Tensor gamma) {
    for (const auto& t : {x, residual, bias, gamma}) {
        TORCH_CHECK(t.device().is_cuda(), "bias_gelu_scale_residual_forward: CUDA tensors expected");
        TORCH_CHECK(t.dtype() == torch::kFloat32, "bias_gelu_scale_residual_forward: float32 tensors expected");
        TORCH_CHECK(t.is_contiguous(), "bias_gelu_scale_residual_forward: contiguous tensors expected");
    }
    TORCH_CHECK(x.sizes() == residual.sizes(), "bias_gelu_scale_residual_forward: x and residual differ in shape");
    TORCH_CHECK(x.dim() >= 1, "bias_gelu_scale_residual_forward: x needs a last dimension");
    const int64_t dim = x.size(x.dim() - 1);
    TORCH_CHECK(bias.numel() == dim && gamma.numel() == dim, "bias_gelu_scale_residual_forward: bias/gamma size mismatch");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return y;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    bool aligned = dim % 4 == 0;
    for (const auto& t : {x, residual, bias, gamma, y})
        aligned = aligned && reinterpret_cast<uintptr_t>(t.data_ptr<float>()) % 16 == 0;
    if (aligned && dim / 4 < (int64_t)1 << 30) {
        const int d4 = (int)(dim / 4);
        const int64_t rows = n / dim;
        int64_t gy = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
        gy = gy > 65535 ? 65535 : gy;
        const dim3 grid((unsigned)((d4 + THREADS - 1) / THREADS), (unsigned)gy);
        fused_vec4_kernel<<<grid, THREADS, 0, stream>>>(
            reinterpret_cast<const float4*>(x.data_ptr<float>()), reinterpret_cast<const float4*>(residual.data_ptr<float>()),
            reinterpret_cast<const float4*>(bias.data_ptr<float>()), reinterpret_cast<const float4*>(gamma.data_ptr<float>()),
            reinterpret_cast<float4*>(y.data_ptr<float>()), rows, d4);
    } else {
        fused_scalar_kernel<<<(unsigned)((n + THREADS - 1) / THREADS), THREADS, 0, stream>>>(
            x.data_ptr<float>(), residual.data_ptr<float>(), bias.data_ptr<float>(), gamma.data_ptr<float>(),
            y.data_ptr<float>(), n, dim);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "bias_gelu_scale_residual_forward: launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

fused_ext = load_inline(
    name="suite_bias_gelu_scale_residual_v1",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bias_gelu_scale_residual_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return fused_ext.bias_gelu_scale_residual_forward(x, residual, self.bias, self.gamma)
