#include "binding_registry.h"
torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps);
REGISTER_BINDING(rmsnorm, [](pybind11::module_& m) { m.def("rmsnorm_forward", &rmsnorm_forward); });
