#include "binding_registry.h"
torch::Tensor linear_bias_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);
REGISTER_BINDING(linear_bias_relu, [](pybind11::module_& m) { m.def("linear_bias_relu_forward", &linear_bias_relu_forward); });
