#include "binding_registry.h"
torch::Tensor layernorm_gelu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);
REGISTER_BINDING(layernorm_gelu, [](pybind11::module_& m) { m.def("layernorm_gelu_forward", &layernorm_gelu_forward); });
