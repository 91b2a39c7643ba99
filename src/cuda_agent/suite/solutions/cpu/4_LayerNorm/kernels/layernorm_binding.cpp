#include "binding_registry.h"
torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);
REGISTER_BINDING(layernorm, [](pybind11::module_& m) { m.def("layernorm_forward", &layernorm_forward); });
