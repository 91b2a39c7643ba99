"""Published KernelBench solutions are judged as they are: what they rely on that is not an error
(blank compiler flags, the reference module's globals, nested constructor arguments, ordinary
Python idioms, printf, large outputs on a large device) must not be refused. End-to-end versions
of these run as honest fixtures (tests/fixtures/{cpu,cuda}/honest/) in test_adversarial.py."""

from __future__ import annotations

import mmap
import types
from pathlib import Path

import pytest
import torch

from cuda_agent.judge import policy
from cuda_agent.judge.builds import BuildError, check_flags, clean_flags, inline_spec
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.tensorio import MAX_DEPTH, TransportError, pack, packed_end, unpack

TASKS = Path(__file__).parent / "fixtures" / "tasks"


# -- flags ----------------------------------------------------------------------------------------

def _spec(**flags):
    args = {"cflags": [], "cuda_cflags": [], "ldflags": []} | flags
    return inline_spec(name="k", cpp_sources="int f(){return 1;}", cuda_sources=None, functions=["f"],
                       with_cuda=None, **args)


def test_blank_flags_are_no_flags():
    blank = _spec(cflags=[""], cuda_cflags=["", "  "], ldflags=[" "])
    assert blank.cflags == blank.cuda_cflags == blank.ldflags == ()
    # the same binary as no flags at all: one cache entry, not a second build
    assert blank.key("fp") == _spec().key("fp")
    assert _spec(cflags=[" -O3 ", ""]).cflags == ("-O3",)
    assert clean_flags(None) == () and clean_flags(["", None, "-O2"]) == ("-O2",)
    assert check_flags(["", "   "]) == []


def test_flags_published_solutions_pass_are_allowed():
    published = ["-O3", "-O2", "--use_fast_math", "-use_fast_math", "-std=c++17", "--std=c++17", "-lineinfo",
                 "--expt-relaxed-constexpr", "--restrict", "-D_USE_MATH_DEFINES", "-DNDEBUG", "-lcublas",
                 "-Xptxas=-O3", "-ffast-math", "-funroll-loops", "-march=native", "-Wno-unused-variable",
                 "--ftz=true", "--prec-div=false", "-fmad=true", "-g", "-G", "--generate-line-info"]
    assert check_flags(published) == []
    # nvcc's two-token forms, with a harmless value after the option
    assert check_flags(["-Xptxas", "-O3", "-Xcompiler", "-fopenmp", "-Xptxas", "-v"]) == []


@pytest.mark.parametrize("flag", [
    "-I/tmp/evil", "-isystem/tmp", "-L/tmp", "-lfoo", "-ldl", "-include", "-fplugin=x.so", "-Wl,--wrap=clock_gettime",
    "-B/tmp", "-specs=x", "--sysroot=/tmp", "-ccbin=/tmp/cc", "--compiler-bindir=/tmp", "-Xlinker", "-shared",
    "-Xcompiler=-fplugin=x.so", "-DX=$(touch)", "@/tmp/rsp",
])
def test_flags_that_load_code_or_move_search_paths_are_refused(flag):
    assert check_flags([flag]) == [flag]


def test_two_token_flags_need_a_safe_value_in_the_same_list():
    assert check_flags(["-Xcompiler", "-fplugin=x.so"]) == ["-Xcompiler", "-fplugin=x.so"]
    assert check_flags(["-Xptxas"]) == ["-Xptxas"]
    assert check_flags(["-Xcompiler", "-Wl,-rpath,/tmp"]) == ["-Xcompiler", "-Wl,-rpath,/tmp"]


def test_builder_refuses_a_pair_split_across_compiler_and_linker_lines(tmp_path):
    from cuda_agent.judge.builds import Builder

    builder = Builder(tmp_path / "cache", tmp_path / "work", arch=None, timeout_s=60, uid=None)
    spec = _spec(cflags=["-O3", "-Xcompiler"], ldflags=["-fopenmp"])
    with pytest.raises(BuildError, match="not allowed: -Xcompiler"):
        builder.build(spec)


# -- nested values --------------------------------------------------------------------------------

@pytest.fixture
def region():
    buf = mmap.mmap(-1, 1 << 16)
    yield memoryview(buf)


def test_nested_containers_round_trip_with_their_kinds(region):
    values = [64, [96, [48, 24]], {"bias": True, "act": "relu", "p": None, 3: 0.5},
              (0.5, "sum"), [torch.randn(3, 4), {"w": torch.arange(5)}], ()]
    meta = pack(values, region, 0, 1 << 16)
    back = unpack(meta, region, 0, 1 << 16)
    assert back[0] == 64 and back[1] == [96, [48, 24]] and isinstance(back[1], list)
    assert back[2] == {"bias": True, "act": "relu", "p": None, 3: 0.5}
    assert back[3] == (0.5, "sum") and isinstance(back[3], tuple)
    assert torch.equal(back[4][0], values[4][0]) and torch.equal(back[4][1]["w"], values[4][1]["w"])
    assert back[5] == ()
    # tensors inside containers count for where the next values may start
    assert packed_end(meta) >= meta[4]["items"][1]["items"][0]["offset"] + 5 * 8
    # one level of tuples as older judges wrote it still reads as a tuple
    old = [{"t": "list", "items": [{"t": "scalar", "value": 1}]}]
    assert unpack(old, region, 0, 1 << 16) == [(1,)]


def test_nested_metadata_is_validated(region):
    deep: list = []
    cur = deep
    for _ in range(MAX_DEPTH + 2):
        cur.append([])
        cur = cur[0]
    with pytest.raises(TransportError):
        pack([deep], region, 0, 1 << 16)
    with pytest.raises(TransportError):
        pack([{(1, 2): 3}], region, 0, 1 << 16)
    with pytest.raises(TransportError):
        pack([{1, 2}], region, 0, 1 << 16)
    hostile_meta = {"t": "scalar", "value": 0}
    for _ in range(MAX_DEPTH + 2):
        hostile_meta = {"t": "list", "kind": "list", "items": [hostile_meta]}
    for hostile in ([hostile_meta],
                    [{"t": "list", "kind": "set", "items": []}],
                    [{"t": "dict", "keys": [[1]], "items": [{"t": "scalar", "value": 1}]}],
                    [{"t": "dict", "keys": ["a", "b"], "items": [{"t": "scalar", "value": 1}]}],
                    [{"t": "dict", "keys": ["a"], "items": "x"}],
                    [{"t": "list", "kind": "list", "items": [{"t": "scalar", "value": {"x": 1}}]}],
                    [{"t": "list", "items": [{"t": "tensor", "dtype": "float32", "shape": [8], "offset": 1 << 20,
                                              "nbytes": 32}]}]):
        with pytest.raises(TransportError):
            unpack(hostile, region, 0, 1 << 16)
    wide = [{"t": "list", "kind": "list", "items": [{"t": "scalar", "value": 0}] * 40000}] * 2
    with pytest.raises(TransportError):
        unpack(wide, region, 0, 1 << 16)


# -- Python policy --------------------------------------------------------------------------------

IDIOMS = '''
import functools
import math
from dataclasses import dataclass, field
from collections.abc import Sequence
import torch
import torch.nn as nn
from torch.nn.modules.utils import _pair
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="k", cpp_sources="", functions=["f"])


@dataclass
class Config:
    sizes: list = field(default_factory=list)


def cached(fn):
    @functools.wraps(fn)
    def inner(*args):
        return fn(*args)
    return inner


class Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight):
        return ext.f(input, weight)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, n))
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
        self.bound = 1 / math.sqrt(fan_in)
        self.kernel = _pair(3)

    @classmethod
    def build(cls, n):
        return cls(n)

    @property
    def size(self):
        return self.weight.shape[0]

    def scale(self):
        return math.sqrt(self.size)

    @cached
    def forward(self, input):
        w = getattr(self, "weight")
        name = "weight"
        w = getattr(self, name)
        return Fn.apply(input, w)
'''


def test_python_idioms_pass_both_policies():
    assert policy.check_python(IDIOMS, "lenient") == []
    assert policy.check_python(IDIOMS, "strict") == []


def test_reference_globals_are_no_violation():
    src = ("import torch.nn as nn\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           "        self.n = batch_size * features\n        self.k = to_2tuple(kernel_size)\n"
           "    def forward(self, x):\n        return x.view(batch_size, -1)\n")
    assert policy.check_python(src, "strict") == [] and policy.check_python(src, "lenient") == []


def test_lenient_allows_computed_getattr_strict_only_on_self():
    src = IDIOMS.replace('        w = getattr(self, name)\n', '        w = getattr(torch, "ma" + "tmul")\n')
    assert policy.check_python(src, "lenient") == []
    assert any("computed name" in v for v in policy.check_python(src, "strict"))


@pytest.mark.parametrize("snippet,needle", [
    ('getattr(torch.allclose, "__globals__")', "__globals__"),
    ('getattr(x, "f_back")', "f_back"),
    ('getattr(torch, "_C")', "private attribute '_C'"),
    ('getattr(torch, "sys")', "module 'sys'"),
    ('hasattr(x, "__subclasses__")', "__subclasses__"),
    ('setattr(torch, "allclose", f)', "setattr"),
    ('torch.nn.init._no_grad_uniform_.__globals__', "__globals__"),
    ('torch._C._set_grad_enabled(False)', "private attribute '_C'"),
    ('eval("1")', "eval"),
])
def test_tampering_constructs_are_refused_in_both_policies(snippet, needle):
    src = IDIOMS.replace("        return Fn.apply(input, w)\n", f"        {snippet}\n        return Fn.apply(input, w)\n")
    for pol in ("strict", "lenient"):
        found = policy.check_python(src, pol)
        assert any(needle in v for v in found), (pol, found)


def test_strict_still_refuses_compute_named_math_when_math_is_rebound():
    src = "import math\nimport torch\nmath = torch\nclass A:\n    def forward(self, x):\n        return math.sqrt(x)\n"
    assert any(".sqrt()" in v for v in policy.check_python(src, "strict"))


# -- candidate namespace (guards) -------------------------------------------------------------------

def test_candidate_module_sees_reference_globals_and_its_own_names_win():
    from cuda_agent.judge.guards import _Blocked, _candidate_namespace

    reference = types.ModuleType("model")
    exec("batch_size = 16\nhardtanh_min = -0.5\ndef to_2tuple(x):\n    return (x, x)\nclass Model: pass\n",
         reference.__dict__)
    candidate = types.ModuleType("model_new")
    blocked: list[str] = []
    _candidate_namespace(candidate, reference, blocked)
    exec("batch_size = 4\npair = to_2tuple(hardtanh_min)\nn = batch_size\nname = getattr(pair, 'count').__name__\n",
         candidate.__dict__)
    assert candidate.n == 4 and candidate.pair == (-0.5, -0.5) and candidate.name == "count"
    assert candidate.__name__ == "model_new" and reference.batch_size == 16
    with pytest.raises(_Blocked):
        exec("g = getattr(to_2tuple, '__glo' + 'bals__')", candidate.__dict__)
    with pytest.raises(_Blocked):
        exec("getattr(to_2tuple, 'f_' + 'back', None)", candidate.__dict__)
    assert blocked and "__globals__" in blocked[0]


def test_the_strict_namespace_leaves_out_what_the_candidate_could_not_import():
    from cuda_agent.judge.guards import _candidate_namespace

    reference = types.ModuleType("model")
    exec("import math\nimport numpy as np\nfrom numpy import log2\nimport torch\nbatch_size = 8\n"
         "def helper(x):\n    return x\n", reference.__dict__)
    seen = {}
    for policy in ("strict", "lenient"):
        candidate = types.ModuleType("model_new")
        _candidate_namespace(candidate, reference, [], policy)
        seen[policy] = set(vars(candidate))
    assert {"math", "torch", "batch_size", "helper"} <= seen["strict"] and not {"np", "log2"} & seen["strict"]
    assert {"np", "log2", "helper"} <= seen["lenient"]


# -- C++ sources ----------------------------------------------------------------------------------

def test_cpp_stdio_printf_and_tensor_clone_are_fine():
    src = ('#include <cstdio>\n#include <stdio.h>\n__global__ void k(float* y){ if (threadIdx.x == 0) printf("%f\\n", y[0]); }\n'
           'torch::Tensor f(torch::Tensor x){ auto y = x.clone(); auto z = y->clone(); fprintf(stderr, "x\\n"); return y; }\n')
    assert policy.check_cpp(src, "k.cu", "lenient") == []


@pytest.mark.parametrize("evil", ["clone(fn, stack, 0, 0);", "::clone(fn, stack, 0, 0);", "FILE* f = tmpfile();",
                                  "int fd = mkstemp(buf);", "auto f = fdopen(3, \"w\");"])
def test_cpp_process_and_file_functions_still_refused(evil):
    assert policy.check_cpp(evil, "k.cpp", "lenient"), evil


def test_binary_check_refuses_temporary_files_but_not_printf():
    assert policy.check_binary(["tmpfile", "mkstemp64"], "lenient", "cpu")
    assert policy.check_binary(["printf", "puts", "fprintf", "putchar"], "strict", "cpu") == []


# -- output limit ---------------------------------------------------------------------------------

def test_output_limit_scales_with_the_device_and_the_setting_caps_it(monkeypatch):
    import cuda_agent.judge.config as config

    monkeypatch.setattr(config, "device_memory_mb", lambda device: {"cuda": 143_771, "cpu": 8192}[device])
    assert JudgeConfig(device="cuda").output_limit_mb() == 143_771 // 8       # an H200: ~17.5 GiB
    assert JudgeConfig(device="cpu").output_limit_mb() == 2048               # small host: the old floor
    assert JudgeConfig(device="cuda", max_output_mb=512).output_limit_mb() == 512
    monkeypatch.setattr(config, "device_memory_mb", lambda device: 0)
    assert JudgeConfig(device="cuda").output_limit_mb() == 2048
    with pytest.raises(ValueError):
        JudgeConfig(device="cpu", max_output_mb=0)


def test_oversized_reference_output_names_the_setting(tmp_path):
    from cuda_agent.judge import Judge
    from cuda_agent.tasks import load_task_file

    task = load_task_file(TASKS / "elementwise.py")   # a 1 MiB output
    with Judge(JudgeConfig(device="cpu", max_output_mb=1, cache_dir=tmp_path, compile_mode="none")) as j:
        v = j.check_reference(task)
    assert v.failure is not None and "max_output_mb" in v.failure.message and "1 MiB" in v.failure.message


def test_operator_attribute_getters_are_refused():
    for src in ("from operator import attrgetter\n", "import operator\nf = operator.methodcaller('x')\n"):
        assert any("attrgetter/methodcaller" in v for v in policy.check_python(src, "lenient"))


# -- nested outputs -------------------------------------------------------------------------------

def test_nested_outputs_are_compared_item_by_item():
    from cuda_agent.judge.compare import compare_outputs
    from cuda_agent.judge.tensorio import snapshot

    tol = {"atol": 1e-2, "rtol": 1e-2, "max_rel_l2": {"float32": 1e-4}}
    a, b = torch.randn(4, 4), torch.randn(3)
    expected = [a, [b, {"n": 3, "h": b * 2}]]
    got = snapshot(expected)
    assert got[1][0] is not b and torch.equal(got[1][0], b)
    assert compare_outputs(expected, got, **tol).ok
    assert compare_outputs(expected, [a, (b, {"n": 3, "h": b * 2})], **tol).ok   # list or tuple: a sequence
    wrong = compare_outputs(expected, [a, [b, {"n": 3, "h": b * 3}]], **tol)
    assert not wrong.ok and "values outside" in wrong.message
    assert not compare_outputs(expected, [a, [b]], **tol).ok
    assert not compare_outputs(expected, [a, [b, {"n": 3, "x": b * 2}]], **tol).ok
    assert not compare_outputs(expected, [a, b], **tol).ok


@pytest.mark.gpu
def test_output_limit_on_this_gpu_is_a_share_of_its_memory():
    total_mb = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory >> 20
    limit = JudgeConfig(device="cuda").output_limit_mb()
    assert limit == max(2048, total_mb // 8)
    if total_mb >= 64 * 1024:   # an H100/H200-class device judges a 2 GiB output
        assert limit > 2048
