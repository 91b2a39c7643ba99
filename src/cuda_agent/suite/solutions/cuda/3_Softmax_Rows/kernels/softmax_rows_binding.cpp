#include "binding_registry.h"

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

cudaError_t softmax_rows_launch(const float* x, float* y, int64_t rows, int cols, cudaStream_t stream);

torch::Tensor softmax_rows_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cuda(), "softmax_rows_forward: x must be a CUDA tensor");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "softmax_rows_forward: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "softmax_rows_forward: x must be contiguous");
    TORCH_CHECK(x.dim() >= 1, "softmax_rows_forward: x needs a last dimension");
    auto y = torch::empty_like(x);
    const int64_t cols = x.size(x.dim() - 1);
    if (x.numel() == 0) return y;
    TORCH_CHECK(cols < (int64_t)1 << 31, "softmax_rows_forward: rows too long");
    cudaError_t err = softmax_rows_launch(x.data_ptr<float>(), y.data_ptr<float>(), x.numel() / cols, (int)cols,
                                          c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, "softmax_rows_forward: launch failed: ", cudaGetErrorString(err));
    return y;
}

REGISTER_BINDING(softmax_rows, [](pybind11::module_& m) { m.def("softmax_rows_forward", &softmax_rows_forward); });
