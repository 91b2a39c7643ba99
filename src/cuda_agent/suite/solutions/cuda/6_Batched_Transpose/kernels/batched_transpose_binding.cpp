#include "binding_registry.h"
torch::Tensor batched_transpose_forward(torch::Tensor x);
REGISTER_BINDING(batched_transpose, [](pybind11::module_& m) { m.def("batched_transpose_forward", &batched_transpose_forward); });
