// y = gelu(LayerNorm(x) * weight + bias) over the last dimension, float32.
// One block per row; each thread keeps up to VPT float4 of the row in registers, so the row is read
// once. Mean and variance use two block reductions (warp shuffles + one shared-memory step).
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

__device__ __forceinline__ float gelu_erf(float v) {
    return 0.5f * v * (1.0f + erff(v * 0.7071067811865475f));
}

__global__ void layernorm_gelu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ b, float* __restrict__ y, int dim, float eps) {
    __shared__ float red[33];
    const int64_t row = blockIdx.x;
    const int d4 = dim >> 2;
    const float4* xr = reinterpret_cast<const float4*>(x + row * dim);
    float4* yr = reinterpret_cast<float4*>(y + row * dim);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    const float4* b4 = reinterpret_cast<const float4*>(b);

    float4 v[VPT];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < d4) {
            v[k] = __ldcs(xr + i);
            sum += (v[k].x + v[k].y) + (v[k].z + v[k].w);
        }
    }
    const float mean = block_sum(sum, red) / (float)dim;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < d4) {
            const float a = v[k].x - mean, bb = v[k].y - mean, c = v[k].z - mean, d = v[k].w - mean;
            sq += (a * a + bb * bb) + (c * c + d * d);
        }
    }
    const float rstd = rsqrtf(block_sum(sq, red) / (float)dim + eps);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < d4) {
            const float4 g = __ldg(w4 + i);
            const float4 bb = __ldg(b4 + i);
            float4 o;
            o.x = gelu_erf((v[k].x - mean) * rstd * g.x + bb.x);
            o.y = gelu_erf((v[k].y - mean) * rstd * g.y + bb.y);
            o.z = gelu_erf((v[k].z - mean) * rstd * g.z + bb.z);
            o.w = gelu_erf((v[k].w - mean) * rstd * g.w + bb.w);
            __stcs(yr + i, o);
        }
    }
}

}  // namespace

torch::Tensor layernorm_gelu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    for (const auto& t : {x, weight, bias}) {
        TORCH_CHECK(t.device().is_cuda(), "layernorm_gelu_forward: CUDA tensors expected");
        TORCH_CHECK(t.dtype() == torch::kFloat32, "layernorm_gelu_forward: float32 tensors expected");
        TORCH_CHECK(t.is_contiguous(), "layernorm_gelu_forward: contiguous tensors expected");
        TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr<float>()) % 16 == 0, "layernorm_gelu_forward: 16-byte aligned data expected");
    }
    TORCH_CHECK(x.dim() >= 1, "layernorm_gelu_forward: x needs a last dimension");
    const int64_t dim = x.size(x.dim() - 1);
    TORCH_CHECK(weight.numel() == dim && bias.numel() == dim, "layernorm_gelu_forward: weight/bias size mismatch");
    TORCH_CHECK(dim > 0 && dim % 4 == 0 && dim <= 4 * VPT * 1024, "layernorm_gelu_forward: last dimension must be a multiple of 4, at most 16384");
    auto y = torch::empty_like(x);
    const int64_t rows = x.numel() / dim;
    if (rows == 0) return y;
    TORCH_CHECK(rows < (int64_t)1 << 31, "layernorm_gelu_forward: too many rows");
    const int d4 = (int)(dim / 4);
    int threads = ((d4 + VPT - 1) / VPT + 31) / 32 * 32;
    threads = threads < 32 ? 32 : threads;
    layernorm_gelu_kernel<<<(unsigned)rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(), (int)dim, (float)eps);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "layernorm_gelu_forward: launch failed: ", cudaGetErrorString(err));
    return y;
}
