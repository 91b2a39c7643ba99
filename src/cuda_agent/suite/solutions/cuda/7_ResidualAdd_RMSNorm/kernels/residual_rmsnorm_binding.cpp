#include "binding_registry.h"
torch::Tensor residual_rmsnorm_forward(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps);
REGISTER_BINDING(residual_rmsnorm, [](pybind11::module_& m) { m.def("residual_rmsnorm_forward", &residual_rmsnorm_forward); });
