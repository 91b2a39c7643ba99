"""Static policy rules that close ways past the checker: what the interpreter would read differently
from the checker, compute moved out of the model's methods, Python reached from C++, and code
bytes of the candidate's own."""

from __future__ import annotations

import json
from pathlib import Path

from cuda_agent.judge.policy import check_cpp, check_python

HELPER = '''import torch
import torch.nn as nn


def init_weight(w):
    return w.mul_(0.5)           # used only by __init__: weight initialisation


def get_inputs():
    return [torch.randn(4, 4)]   # copied along, never called: the judge runs the task's


def helper(a, b):
    return torch.matmul(a, b)    # called from forward: compute the policy refuses


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(init_weight(torch.ones(4)))

    def forward(self, a, b):
        name = "w"
        return helper(getattr(self, name), b)
'''


def test_compute_in_a_module_level_helper_is_found_and_init_helpers_are_not():
    found = check_python(HELPER, "strict")
    assert found == ["line 14: PyTorch compute 'torch.matmul' in helper (strict policy)"], found
    assert check_python(HELPER, "lenient") == []


def test_getattr_with_a_computed_name_only_on_a_methods_own_self():
    src = ("import torch\n\ndef g(self, n):\n    return getattr(self, n)\n\n"
           "class ModelNew:\n    def forward(self, x):\n        f = lambda self, n: getattr(self, n)\n"
           "        return getattr(self, 'w' + '')\n")
    found = check_python(src, "strict")
    assert [f.split(":")[0] for f in found] == ["line 4", "line 8"], found
    rebound = "class ModelNew:\n    def forward(self, x):\n        self = x\n        return getattr(self, 'a' + 'b')\n"
    assert any("rebinding 'self'" in f for f in check_python(rebound, "strict"))


def test_a_coding_declaration_other_than_utf8_is_refused():
    assert check_python("# coding: utf-8\nimport torch\n", "strict") == []
    for cookie in ("# coding: utf-7", "# -*- coding: latin-1 -*-", "#!/usr/bin/env python\n# vim: set fileencoding=utf_16 :"):
        found = check_python(cookie + "\nimport torch\n", "lenient")
        assert found and "source encoding" in found[0], (cookie, found)


def test_frames_through_inspect_and_numpy_through_torch_are_refused():
    for line in ("fi = x.frame", "d = ins.getargvalues(f)", "f = ins.currentframe()", "np = torch.storage.np"):
        assert check_python(f"import torch\n{line}\n", "lenient"), line


def test_python_from_cpp_under_any_namespace_name_and_sections_of_its_own():
    for src in ('namespace q = pybind11; void f(){ const char* n = "numpy"; q::module_::import(n); }',
                'void f(pybind11::object m){ auto np = m.attr("np"); }',
                'void f(){ PyImport_ImportModule("numpy"); }',
                '__attribute__((section(".text#"), used)) static const unsigned char stub[] = {0x0f, 0x05};',
                '[[gnu::section(".text")]] static const char s[] = {1};'):
        assert check_cpp(src, "x.cpp", "lenient"), src
    honest = ('#include <torch/extension.h>\nint section_count = 2;\n'
              'torch::Tensor f(torch::Tensor x) { return torch::empty_like(x); }\n')
    assert check_cpp(honest, "x.cpp", "strict") == []


def test_getattr_passed_around_as_a_value_is_refused_under_strict():
    for line in ("g = getattr", "reach = list(map(getattr, [x], ['shape']))", "has = hasattr",
                 "f = functools.reduce(getattr, ['a'], x)"):
        src = f"import functools\nimport torch\n\ndef helper(x):\n    {line}\n    return x\n"
        found = check_python(src, "strict")
        assert any("other than in a direct call" in f for f in found), (line, found)
    direct = "import torch\n\nclass ModelNew:\n    def forward(self, x):\n        return getattr(self, 'w') if hasattr(self, 'w') else x\n"
    assert check_python(direct, "strict") == []


def test_torch_compilers_are_refused_under_strict_only():
    for line in ("f = torch.jit.script(g)", "m = torch.compile(g)", "from torch import jit",
                 "g = torch.fx.symbolic_trace(m)", "e = torch.export.export(m, ())"):
        src = f"import torch\n\ndef g(x):\n    return x\n\n{line}\n"
        strict = check_python(src, "strict")
        assert any("generate kernels" in f for f in strict), (line, strict)
        assert not any("generate kernels" in f for f in check_python(src, "lenient")), line


def test_a_hand_written_annotations_dict_is_refused():
    src = ("from dataclasses import dataclass\n\n@dataclass\nclass C:\n"
           "    __annotations__ = {'x=0\\n  import os\\n  self.y': int}\n")
    for policy in ("strict", "lenient"):
        assert any("'__annotations__'" in f for f in check_python(src, policy)), policy


def test_python_is_out_of_reach_from_cpp_however_pybind11_is_named():
    binding = 'REGISTER_BINDING(f, [](pybind11::module_& m) { m.def("f", &f, py::arg("x"), py::call_guard<py::gil_scoped_release>()); });\n'
    honest = binding + "int py = 0; cudaFuncAttributes attr; int n = attr.maxThreadsPerBlock; float Py = 1.0f;\n"
    for policy in ("strict", "lenient"):
        assert check_cpp(honest, "ok.cpp", policy) == [], policy
    dodges = {
        "free getattr": "auto np = getattr(m, which);",
        "type alias and static import": "using M = pybind11::module_; auto np = M::import(which);",
        "decltype": "auto np = std::remove_reference_t<decltype(m)>::import(which);",
        "member pointer to attr": "auto a = &std::remove_reference_t<decltype(m)>::attr;",
        "namespace alias": "namespace q = pybind11; q::module_ x;",
        "using-directive": "using namespace py; object o;",
        "macro": "#define Q pybind11\nQ::object o;",
        "other pybind11 names": "py::object o = py::none(); py::dict d;",
        "C-API": "PyObject* p = m.ptr(); Py_INCREF(p);",
        "IValue to Python": "auto o = v.toPyObject();",
        "THP": "auto o = THPVariable_Wrap(t);",
        "borrowed handle": "auto o = reinterpret_borrow<decltype(m)>(p);",
    }
    for what, line in dodges.items():
        found = check_cpp(line + "\n", "x.cpp", "lenient")
        assert any("Python C-API" in f or "pybind11 beyond" in f for f in found), (what, found)


def test_finalisers_are_refused_they_run_on_the_interpreters_schedule():
    for name in ("__del__", "__exit__"):
        src = f"import torch\n\nclass Keeper:\n    def {name}(self, *args):\n        pass\n"
        for policy in ("strict", "lenient"):
            assert any(f"defining '{name}'" in f for f in check_python(src, policy)), (name, policy)
    assert check_python("import torch\n\nclass Keeper:\n    def __enter__(self):\n        return self\n", "lenient") == []


def test_the_corpus_benchmark_reads_the_bundled_code_and_compares_runs(tmp_path, capsys):
    from pathlib import Path

    from cuda_agent.fidelity.policy_corpus import main

    fixtures = Path(__file__).resolve().parent / "fixtures"
    out = tmp_path / "now.json"
    assert main(["--out", str(out)], fixtures=fixtures) == 0
    first = capsys.readouterr().out
    assert "lenient: 0 of" in first, first
    assert any(k.startswith("fixtures/") for k in json.loads(out.read_text()))
    assert main(["--out", str(tmp_path / "again.json"), "--compare", str(out)], fixtures=fixtures) == 0
    assert "0 verdicts differ" in capsys.readouterr().out


# ------------------------------------------------------------------ compiler and linker flags
def test_link_flags_naming_libraries_pytorch_already_loads_are_accepted():
    """Published solutions pass `extra_ldflags=["-lcudart"]` (2 of 38 correct KernelBench solutions
    were refused for it): a library the process already has adds no code, and what the binary
    calls in it is still judged per symbol."""
    from cuda_agent.judge.builds import check_flags

    named = ["-lcudart", "-lcuda", "-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cuda", "-ltorch_cpu",
             "-ltorch_python", "-lm", "-lstdc++", "-lcublas", "-lcublasLt", "-lcudnn", "-lcurand", "-lcufft", "-lcusparse"]
    assert check_flags(named) == []


def test_nvcc_flags_published_solutions_use_are_accepted():
    from cuda_agent.judge.builds import check_flags

    one_token = ["-Xptxas=-O3,-v", "--ptxas-options=-v,-O3", "-Xptxas=-dlcm=ca", "-arch=compute_90", "-code=sm_90",
                 "--gpu-architecture=sm_90a", "-gencode=arch=compute_90a,code=[sm_90a,compute_90a]",
                 "--generate-code=arch=compute_90,code=sm_90", "-Xcompiler=-O3,-fPIC", "--threads=4",
                 "--compiler-options=-O3", "-Wno-deprecated-gpu-targets", "-std=c++20", "-U__CUDA_NO_HALF_OPERATORS__"]
    assert check_flags(one_token) == []
    two_token = ["-Xptxas", "-O3,-v", "-gencode", "arch=compute_90,code=sm_90", "-arch", "sm_90",
                 "-Xcompiler", "-O3,-fopenmp", "--ptxas-options", "-v", "-t", "8"]
    assert check_flags(two_token) == []


def test_library_search_paths_only_to_the_folders_pytorch_loads_from(tmp_path):
    """`-L` to torch's own lib folder (or CUDA's, or an nvidia wheel's) changes nothing; to any other
    folder it could put a library of the candidate's choosing ahead of the real one."""
    import torch

    from cuda_agent.judge.builds import check_flags

    torch_lib = Path(torch.__file__).parent / "lib"
    assert check_flags([f"-L{torch_lib}", "-L", str(torch_lib), "-lc10"]) == []
    assert check_flags([f"-L{torch_lib}/../../../../../../tmp"]) == [f"-L{torch_lib}/../../../../../../tmp"]
    assert check_flags([f"-L{tmp_path}", "-lc10"]) == [f"-L{tmp_path}"]
    assert check_flags(["-L", str(tmp_path)]) == ["-L", str(tmp_path)]


def test_flags_that_change_what_is_linked_or_loaded_stay_refused():
    from cuda_agent.judge.builds import check_flags

    for flag in ("-lcudart_static", "-lcublas_static", "-ldl", "-lnvrtc", "-lcusolver", "-lfoo", "-Xcompiler=-O3,-fplugin=x.so",
                 "-Xptxas=-O3,--foo", "-rdc=true", "-Wl,-rpath,/tmp", "-arch=sm_90,-Xlinker"):
        assert check_flags([flag]) == [flag], flag
    assert check_flags(["-Xcompiler", "-O3,-fplugin=x.so"]) == ["-Xcompiler", "-O3,-fplugin=x.so"]


# ------------------------------------------------------------------ kernels judged by who issued them
TORCH_DIR = "/site/torch"
DRIVER = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
CUBLAS = "/site/nvidia/cublas/lib/libcublasLt.so.13|/site/nvidia/cublas/lib/libcublas.so.13"
CANDIDATE = "/var/cache/ca/ext/4f2a/fx_gemm.so"


def _owners(**chains):
    return {name.replace("__", "::"): value for name, value in chains.items()}


def test_issuer_is_the_first_image_past_nvidias_and_the_c_runtimes():
    from cuda_agent.judge.launches import issuer_of

    who = issuer_of(f"{DRIVER}|/lib/x86_64-linux-gnu/libc.so.6|{CUBLAS}|{TORCH_DIR}/lib/libtorch_cuda.so|/usr/bin/python3")
    assert who.library == f"{TORCH_DIR}/lib/libtorch_cuda.so" and who.vendor == "libcublas.so.13"
    assert issuer_of(CANDIDATE) == (CANDIDATE, None)
    assert issuer_of(f"{DRIVER}|{CUBLAS}") == (None, "libcublas.so.13")   # the walk stopped inside cuBLAS
    assert issuer_of("") == (None, None)
    # a candidate's extension is `<identifier>.so`: named like a vendor library it is still the issuer
    assert issuer_of(f"{DRIVER}|/var/cache/ext/libcublasLt.so").library == "/var/cache/ext/libcublasLt.so"
    # wheels that bundle CUDA hash the names
    assert issuer_of(f"{DRIVER}|/site/torch/lib/libcublasLt-1b2c3d4e.so.12|{CANDIDATE}").vendor == \
        "libcublasLt-1b2c3d4e.so.12"


def test_pytorchs_kernels_are_fallback_on_every_task_directly_or_from_a_graph():
    """torch.mm captured into a graph in __init__ and replayed: its cuBLAS kernels were issued by
    libtorch_cuda, which no GEMM allowance covers; the replay itself (torch.cuda.CUDAGraph issues
    it) is not judged, its kernels are."""
    from cuda_agent.judge.launches import check_kernel_owners

    owners = _owners(cuda_agent__graph_launch=[f"{TORCH_DIR}/lib/libtorch_cuda.so"],
                     sm90_xmma_gemm_f32f32_tf32f32_f32_nn=[f"{DRIVER}|{CUBLAS}|{TORCH_DIR}/lib/libtorch_cuda.so"],
                     copy_floats=[CANDIDATE])
    for allowance in (frozenset(), frozenset({"gemm"}), frozenset({"gemm", "conv"})):
        found = check_kernel_owners(owners, "strict", allowance, TORCH_DIR)
        assert len(found) == 1 and "sm90_xmma_gemm" in found[0] and "PyTorch issued" in found[0], found
    softmax = _owners(**{"void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>":
                         [f"{TORCH_DIR}/lib/libtorch_cuda.so"]})
    assert check_kernel_owners(softmax, "strict", frozenset({"gemm"}), TORCH_DIR)
    assert check_kernel_owners(owners, "lenient", frozenset(), TORCH_DIR) == []   # torch glue is lenient's


def test_the_candidates_own_kernels_and_graphs_pass():
    from cuda_agent.judge.launches import check_kernel_owners

    owners = _owners(cuda_agent__graph_launch=[f"{TORCH_DIR}/lib/libtorch_cuda.so"], softmax_rows=[CANDIDATE],
                     copy_floats=[CANDIDATE, f"{DRIVER}|{CANDIDATE}"])
    assert check_kernel_owners(owners, "strict", frozenset(), TORCH_DIR) == []


def test_vendor_kernels_need_the_tasks_allowance_whoever_issued_them():
    """The import table is not the only door to cuBLAS (a library reached by address imports
    nothing): the kernels that launch are held to the task's allowance too."""
    from cuda_agent.judge.launches import check_kernel_owners

    gemm = _owners(sm90_xmma_gemm_f32f32=[f"{DRIVER}|{CUBLAS}|{CANDIDATE}"])
    assert check_kernel_owners(gemm, "strict", frozenset({"gemm"}), TORCH_DIR) == []
    found = check_kernel_owners(gemm, "strict", frozenset({"conv"}), TORCH_DIR)
    assert len(found) == 1 and "only in tasks whose reference has a GEMM" in found[0]
    # the walk stopped inside cuBLAS: its caller unknown, the allowance still applies
    assert check_kernel_owners(_owners(k=[f"{DRIVER}|{CUBLAS}"]), "strict", frozenset(), TORCH_DIR)
    assert check_kernel_owners(_owners(k=[f"{DRIVER}|{CUBLAS}"]), "strict", frozenset({"gemm"}), TORCH_DIR) == []
    conv = _owners(cudnn_fprop=[f"{DRIVER}|/site/nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9|{CANDIDATE}"])
    assert check_kernel_owners(conv, "strict", frozenset({"conv"}), TORCH_DIR) == []
    assert check_kernel_owners(conv, "strict", frozenset({"gemm"}), TORCH_DIR)
    fft = _owners(fft_kernel=[f"{DRIVER}|/site/nvidia/cufft/lib/libcufft.so.12|{CANDIDATE}"])
    assert "outside the policy" in check_kernel_owners(fft, "strict", frozenset({"gemm", "conv"}), TORCH_DIR)[0]
    # an issuer the walk did not reach, and no vendor library: left to the name rules
    assert check_kernel_owners(_owners(k=[DRIVER], j=[""]), "strict", frozenset(), TORCH_DIR) == []


# ---------------------------------------------------------------------- code reached by address
BY_ADDRESS = {
    "a C-style cast to a typedef'd function pointer":
        "typedef void (*gemm_t)(const char*);\nvoid f(long a){ gemm_t g = (gemm_t)(a + 0x1234); g(\"N\"); }",
    "reinterpret_cast to a function pointer type":
        "void f(long a){ auto g = reinterpret_cast<void(*)(int)>(a); g(1); }",
    "a cast to a function type named by using":
        "using F = void(int);\nvoid f(void* a){ auto g = reinterpret_cast<F*>(a); g(1); }",
    "bytes copied into a function pointer":
        "void f(long a){ void (*g)(int); memcpy(&g, &a, 8); g(1); }",
    "a cast to a decltype'd type":
        "void f(long a){ auto g = reinterpret_cast<decltype(&at::get_num_threads)>(a); g(); }",
    "a function pointer type as a template argument":
        "template<class F> F as(long a){ return (F)a; }\nvoid f(long a){ as<void(*)(int)>(a)(1); }",
    "a union holding a function pointer": "union U { long a; void (*f)(int); };",
    "data cast to a struct holding a function pointer":
        "struct S { int k; void (*f)(int); };\nvoid g(long a){ reinterpret_cast<S*>(&a)->f(1); }",
    "a forged object of a class with virtual functions":
        "struct V { virtual void f(int); };\nstruct W { V v; };\nvoid g(long* a){ ((W*)a)->v.f(1); }",
    "the process's maps by path": "const char* p = \"/proc/self/maps\";",
    "the loader's tables": "#include <cstddef>\nextern \"C\" int dl_iterate_phdr(void*, void*);\nvoid f(){ dl_iterate_phdr(0, 0); }",
}
HONEST_POINTERS = r'''
#include <cstdint>
#include <functional>
struct alignas(16) f4 { float x, y, z, w; };
__global__ void k1(const float* x, float* y, int64_t n) { y[0] = x[0]; }
__global__ void k2(const float* x, float* y, int64_t n) { y[0] = x[0]; }
template <typename T> struct Acc { using acc_t = typename std::conditional<(sizeof(T) < 4), float, T>::type; };
void run(const float* x, float* y, int64_t n) {
  void (*kernel)(const float*, float*, int64_t) = reinterpret_cast<uintptr_t>(x) % 16 ? k1 : k2;
  cudaFuncSetAttribute((const void*)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 0);
  const f4* v = reinterpret_cast<const f4*>(x);
  auto h = reinterpret_cast<const __half2*>(y);
  std::function<void(int)> cb;
  float s = static_cast<Acc<float>::acc_t>(v[0].x);
  kernel<<<1, 1>>>(x, y, n);
}
'''


def test_functions_reached_by_address_are_refused_by_construct():
    for what, source in BY_ADDRESS.items():
        found = check_cpp(source, "k.cpp", "lenient")
        assert any("never by an address computed from data" in f for f in found), (what, found)


def test_function_pointers_from_names_and_data_pointer_casts_stay_allowed():
    assert check_cpp(HONEST_POINTERS, "k.cu", "strict") == []


def test_a_team_left_running_is_refused_in_source_and_import_table():
    from cuda_agent.judge.policy import check_binary

    assert check_cpp('extern "C" void GOMP_parallel_start(void (*)(void*), void*, unsigned);', "k.cpp", "strict")
    refused = check_binary(["GOMP_parallel_start", "GOMP_parallel_end", "GOMP_parallel", "omp_get_thread_num"],
                           "strict", "cpu")
    assert [r.split("'")[1] for r in refused] == ["GOMP_parallel_start", "GOMP_parallel_end"], refused


# ------------------------------------------------------------------ private attributes and NumPy
SELF_RULES = '''import math
import torch
import torch.nn as nn


def peek(self):
    return self._C


class Helper(nn.Module):
    def __init__(self):
        super().__init__()
        self._scale = 2.0
        self._describe = lambda: self._scale

    @property
    def scale(self):
        return self._scale

    @staticmethod
    def grab(self):
        return self._utils

    def plain(self, x):
        return x.chunk(2)[0], x.select(0, 0), torch.random, math.pi


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 4) @ torch.ones(4, 4))

    def forward(self, a, b):
        Helper.plain(torch, a)
        return torch.storage.io, torch.serialization.struct, a @ b
'''


def test_private_attributes_only_on_a_methods_own_self_and_foreign_modules_by_rule():
    found = check_python(SELF_RULES, "strict")
    assert found == [
        "line 7: access to private attribute '_C' is not allowed (only on a method's own self)",
        "line 22: access to private attribute '_utils' is not allowed (only on a method's own self)",
        "line 34: 'Helper.plain' (a method taken from its class, callable with any object as self) is not allowed",
        "line 35: reaching module 'io' through an attribute is not allowed",
        "line 35: reaching module 'struct' through an attribute is not allowed",
        "line 35: tensor compute '@' in forward (strict policy)",
    ], found


def test_numpy_by_any_attribute_and_array_protocols_are_refused():
    source = '''import torch


class View:
    __array_interface__ = {}


def f(m):
    return m.numpy, m.np, m.scipy
'''
    found = check_python(source, "strict")
    assert any("'__array_interface__'" in f for f in found), found
    assert sum("reaching module" in f for f in found) == 3, found
    # NumPy is importable under the lenient policy: `numpy` as an attribute is then no way around it
    assert not any("'numpy'" in f for f in check_python(source, "lenient"))


def test_operators_on_registered_tensors_are_compute_and_on_sizes_are_not():
    source = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.register_buffer("b", torch.zeros(4))
        self.scale = 2.0

    def forward(self, x):
        rows = x.shape[0] * 2 + int(self.scale)
        return -self.w, self.b + rows
'''
    assert check_python(source, "strict") == [
        "line 14: tensor compute (an operator on 'self.w') in forward (strict policy)",
        "line 14: tensor compute (an operator on 'self.b') in forward (strict policy)"]


def test_a_method_under_the_modules_own_pass_through_decorator_keeps_its_self():
    """A wrapper that hands the method its own arguments (`fn(*args, **kwargs)`, functools.wraps
    at most) keeps `self` the instance: private attributes and getattr on it stay allowed. One that
    could hand it anything else does not."""
    from cuda_agent.judge import policy

    def module(body: str) -> str:
        return ("import functools\nimport torch\nimport torch.nn as nn\n" + body +
                "\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self._w = nn.Parameter(torch.ones(4))\n\n    @deco\n    def forward(self, x):\n"
                "        return ext.f(x, self._w, getattr(self, '_' + 'w'))\n")

    honest = module("def deco(fn):\n    @functools.wraps(fn)\n    def inner(*args, **kwargs):\n"
                    "        return fn(*args, **kwargs)\n    return inner\n")
    assert not [v for v in policy.check_python(honest, "strict") if "self" in v or "getattr" in v]
    swapped = module("def deco(fn):\n    def inner(*args):\n        return fn(torch, *args[1:])\n    return inner\n")
    refused = policy.check_python(swapped, "strict")
    assert any("getattr" in v or "private" in v for v in refused), refused
