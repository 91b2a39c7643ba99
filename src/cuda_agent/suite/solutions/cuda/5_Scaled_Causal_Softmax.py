"""Scale + causal mask + softmax in one pass. One warp per score row keeps the row in registers;
keys after the query position are never read (they are masked) and are written as exact zeros."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor causal_softmax_forward(torch::Tensor x, double scale);"

cuda_source = r"""
#include <torch/types.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>
#include <math_constants.h>

constexpr int WARPS_PER_BLOCK = 4;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Rows of length L (a multiple of 4, at most 128 * MAXV), cached in registers as float4.
template <int MAXV>
__global__ void causal_softmax_vec_kernel(const float* __restrict__ x, float* __restrict__ y,
                                          int64_t rows, int L, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int q = (int)(row % L);  // query position: keys 0..q are visible
    const int l4 = L >> 2;
    const float4* xr = reinterpret_cast<const float4*>(x + row * L);
    float4* yr = reinterpret_cast<float4*>(y + row * L);

    float4 v[MAXV];
    float m = -CUDART_INF_F;
#pragma unroll
    for (int k = 0; k < MAXV; ++k) {
        const int i = lane + 32 * k;
        const int c = 4 * i;
        v[k] = make_float4(-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F);
        if (i < l4 && c <= q) {
            const float4 t = __ldcs(xr + i);
            v[k].x = t.x * scale;
            v[k].y = (c + 1 <= q) ? t.y * scale : -CUDART_INF_F;
            v[k].z = (c + 2 <= q) ? t.z * scale : -CUDART_INF_F;
            v[k].w = (c + 3 <= q) ? t.w * scale : -CUDART_INF_F;
            m = fmaxf(m, fmaxf(fmaxf(v[k].x, v[k].y), fmaxf(v[k].z, v[k].w)));
        }
    }
    m = warp_max(m);  // finite: key 0 is always visible
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < MAXV; ++k) {
        const int i = lane + 32 * k;
        if (i < l4 && 4 * i <= q) {
            v[k].x = expf(v[k].x - m);
            v[k].y = expf(v[k].y - m);
            v[k].z = expf(v[k].z - m);
            v[k].w = expf(v[k].w - m);
            s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
        }
    }
    s = warp_sum(s);
    const float inv = 1.0f / s;
#pragma unroll
    for (int k = 0; k < MAXV; ++k) {
        const int i = lane + 32 * k;
        if (i < l4) {
            float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
            if (4 * i <= q) {
                o.x = v[k].x * inv;
                o.y = v[k].y * inv;
                o.z = v[k].z * inv;
                o.w = v[k].w * inv;
            }
            __stcs(yr + i, o);
        }
    }
}

// Any row length: three passes over the row, one warp per row.
__global__ void causal_softmax_any_kernel(const float* __restrict__ x, float* __restrict__ y,
                                          int64_t rows, int L, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int q = (int)(row % L);
    const float* xr = x + row * L;
    float* yr = y + row * L;
    float m = -CUDART_INF_F;
    for (int j = lane; j <= q; j += 32) m = fmaxf(m, xr[j] * scale);
    m = warp_max(m);
    float s = 0.0f;
    for (int j = lane; j <= q; j += 32) s += expf(xr[j] * scale - m);
    s = warp_sum(s);
    const float inv = 1.0f / s;
    for (int j = lane; j < L; j += 32) yr[j] = (j <= q) ? expf(xr[j] * scale - m) * inv : 0.0f;
}

torch::Tensor causal_softmax_forward(torch::Tensor x, double scale) {
    TORCH_CHECK(x.device().is_cuda(), "causal_softmax_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "causal_softmax_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "causal_softmax_forward: x must be contiguous");
    TORCH_CHECK(x.dim() >= 2 && x.size(x.dim() - 1) == x.size(x.dim() - 2),
                "causal_softmax_forward: x must end with a square (query, key) block");
    auto y = torch::empty_like(x);
    const int64_t L = x.size(x.dim() - 1);
    const int64_t rows = L == 0 ? 0 : x.numel() / L;
    if (rows == 0) return y;
    const int64_t blocks = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    TORCH_CHECK(blocks < (int64_t)1 << 31, "causal_softmax_forward: too many rows");
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const bool vec = (L % 4 == 0) && (reinterpret_cast<uintptr_t>(xp) % 16 == 0) && (reinterpret_cast<uintptr_t>(yp) % 16 == 0);
    const dim3 grid((unsigned)blocks), block(32 * WARPS_PER_BLOCK);
    if (vec && L <= 128 * 8) {
        causal_softmax_vec_kernel<8><<<grid, block, 0, stream>>>(xp, yp, rows, (int)L, (float)scale);
    } else if (vec && L <= 128 * 16) {
        causal_softmax_vec_kernel<16><<<grid, block, 0, stream>>>(xp, yp, rows, (int)L, (float)scale);
    } else {
        causal_softmax_any_kernel<<<grid, block, 0, stream>>>(xp, yp, rows, (int)L, (float)scale);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "causal_softmax_forward: launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

causal_softmax_ext = load_inline(
    name="suite_scaled_causal_softmax_v1",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["causal_softmax_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, seq_len: int, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return causal_softmax_ext.causal_softmax_forward(x, self.scale)
