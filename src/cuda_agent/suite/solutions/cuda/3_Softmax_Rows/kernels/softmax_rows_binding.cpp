#include "binding_registry.h"
torch::Tensor softmax_rows_forward(torch::Tensor x);
REGISTER_BINDING(softmax_rows, [](pybind11::module_& m) { m.def("softmax_rows_forward", &softmax_rows_forward); });
