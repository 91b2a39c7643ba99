#include "binding_registry.h"
torch::Tensor cumsum_rows_forward(torch::Tensor x);
REGISTER_BINDING(cumsum_rows, [](pybind11::module_& m) { m.def("cumsum_rows_forward", &cumsum_rows_forward); });
