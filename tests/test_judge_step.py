"""benchmarks/judge_step.py's cold steps (cuda_agent.measure.steps): how a cold step makes a source new (no
device, no judge)."""

from __future__ import annotations

from cuda_agent.candidate import Candidate
from cuda_agent.measure import steps as js


MODEL_NEW = "import torch\nimport cuda_extension\nclass ModelNew(torch.nn.Module):\n    pass\n"
KERNELS = {"kernels/scale.cu": "__global__ void k() {}\n", "kernels/scale_binding.cpp": "// binding\n"}


def test_a_cold_step_edits_every_kernel_file_and_a_kernels_only_step_leaves_the_bindings():
    ws = Candidate.from_files(MODEL_NEW, KERNELS, origin="ws")
    every = dict(js.cold_variant(ws, "t1").kernels)
    assert all("cold run t1" in src for src in every.values())
    kernels_only = dict(js.cold_variant(ws, "t2", bindings=False).kernels)
    assert "cold run t2" in kernels_only["kernels/scale.cu"]
    assert kernels_only["kernels/scale_binding.cpp"] == KERNELS["kernels/scale_binding.cpp"]
    # the same workspace every run (one agent's folder): ninja keeps the unchanged binding's object
    assert js.cold_variant(ws, "t3", bindings=False).origin == js.cold_variant(ws, "t4", bindings=False).origin
    # nothing but bindings, or a single file (its binding is the module): not measurable this way
    only_binding = Candidate.from_files(MODEL_NEW, {"kernels/scale_binding.cpp": "// b\n"}, origin="b")
    assert js.cold_variant(only_binding, "t5", bindings=False) is None
    single = Candidate.from_source('import torch\ncuda_source = """__global__ void k() {}"""\n', origin="f")
    assert js.cold_variant(single, "t6", bindings=False) is None
    assert js.cold_variant(single, "t7") is not None
