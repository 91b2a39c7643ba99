// Softmax over the last dimension of a contiguous float32 tensor.
// Rows of up to 2048 floats (a multiple of 4) are handled by one warp each with the row held in
// registers as float4 (one global read, one global write); other rows fall back to a three-pass warp loop.
//
// Plain CUDA, no torch headers: this file compiles in about a second. The tensor checks and the
// allocation live in softmax_rows_binding.cpp, whose torch headers come precompiled.
#include <cuda_runtime.h>
#include <cstdint>
#include <math_constants.h>

namespace {

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

template <int MAXV>
__global__ void softmax_vec_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int c4 = cols >> 2;
    const float4* xr = reinterpret_cast<const float4*>(x + row * cols);
    float4* yr = reinterpret_cast<float4*>(y + row * cols);

    float4 v[MAXV];
    float m = -CUDART_INF_F;
#pragma unroll
    for (int k = 0; k < MAXV; ++k) {
        const int i = lane + 32 * k;
        if (i < c4) {
            v[k] = __ldcs(xr + i);
            m = fmaxf(m, fmaxf(fmaxf(v[k].x, v[k].y), fmaxf(v[k].z, v[k].w)));
        }
    }
    m = warp_max(m);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < MAXV; ++k) {
        const int i = lane + 32 * k;
        if (i < c4) {
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
        if (i < c4) {
            float4 o;
            o.x = v[k].x * inv;
            o.y = v[k].y * inv;
            o.z = v[k].z * inv;
            o.w = v[k].w * inv;
            __stcs(yr + i, o);
        }
    }
}

__global__ void softmax_any_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    float m = -CUDART_INF_F;
    for (int j = lane; j < cols; j += 32) m = fmaxf(m, xr[j]);
    m = warp_max(m);
    float s = 0.0f;
    for (int j = lane; j < cols; j += 32) s += expf(xr[j] - m);
    s = warp_sum(s);
    const float inv = 1.0f / s;
    for (int j = lane; j < cols; j += 32) yr[j] = expf(xr[j] - m) * inv;
}

}  // namespace

cudaError_t softmax_rows_launch(const float* xp, float* yp, int64_t rows, int cols, cudaStream_t stream) {
    const int64_t blocks = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    if (blocks >= (int64_t)1 << 31) return cudaErrorInvalidConfiguration;
    const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(xp) % 16 == 0 && reinterpret_cast<uintptr_t>(yp) % 16 == 0;
    const dim3 grid((unsigned)blocks), block(32 * WARPS_PER_BLOCK);
    if (vec && cols <= 128 * 8) {
        softmax_vec_kernel<8><<<grid, block, 0, stream>>>(xp, yp, rows, cols);
    } else if (vec && cols <= 128 * 16) {
        softmax_vec_kernel<16><<<grid, block, 0, stream>>>(xp, yp, rows, cols);
    } else {
        softmax_any_kernel<<<grid, block, 0, stream>>>(xp, yp, rows, cols);
    }
    return cudaGetLastError();
}
