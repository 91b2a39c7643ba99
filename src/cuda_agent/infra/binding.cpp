// Fixed infrastructure of a cuda-agent workspace: the single Python module of the extension.
#include "binding_registry.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  for (auto& entry : cuda_agent::binding_registry()) entry.second(m);
}
