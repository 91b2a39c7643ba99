"""Builds of candidate extensions: sandboxed, incremental, content-addressed.

A build runs torch's extension builder (ninja) in a sandboxed process that executes nothing of
the candidate's but the compiler on its sources. Each extension has a persistent build folder
(per workspace, or per `load_inline` name), so ninja recompiles only the files that changed.
Finished libraries are copied by the judge into a cache keyed by everything that determines the
binary (sources, flags, arch, torch/CUDA/compiler versions): an unchanged candidate never
recompiles, and the cache is written only by the judge, never by candidate code.

Workspace builds also get a precompiled `binding_registry.h` (torch's headers and pybind11, the
bulk of every binding file's compile time), made once per toolchain and flag set from the fixed
header, and placed next to the header so gcc uses it for any file that includes it first. The
fixed `binding.cpp` is compiled once beside it too and linked into every workspace's library: its
object depends only on the toolchain and flags, and compiling it again costs every new workspace
(every rollout of an RL run) several seconds of a core. `load_inline` builds get the same for
`torch/extension.h`, the first include of the main.cpp that load_inline writes (half of that file's
compile time on the CPU), once a flag set has been seen twice: a precompiled header takes longer
to make than one compile and is large (0.3-0.8 GB), so a flag set used once does not get one, and
only the most recently used few are kept.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from importlib.resources import files
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ..sandbox import SandboxSpec, Sandboxed, pin_threads, python_argv

INFRA = files("cuda_agent") / "infra"

# Flags a candidate may pass to load_inline: optimisation, language standard, warnings, debug
# info, macros, target architecture and nvcc's numeric modes. None of them loads other code
# (plugins, linker scripts, -Wl wraps, -include), moves the include or library search paths
# (-I, -L, -isystem, --sysroot) or links a library beyond the vendor ones the binary check
# judges per symbol. Anything else is refused with a message.
_HOST_FLAG = (r"-O[0-3sz]?|-Ofast|-g[0-3]?|-std=(c|gnu)\+\+\d\d|-D[A-Za-z_]\w*(=[\w.+-]*)?|-U[A-Za-z_]\w*"
              r"|-f(no-)?(openmp|fast-math|unroll-loops|unroll-all-loops|strict-aliasing|tree-vectorize|PIC|pic"
              r"|math-errno|finite-math-only|omit-frame-pointer|inline-functions|vectorize|slp-vectorize"
              r"|rounding-math|signed-zeros|trapping-math|associative-math|reciprocal-math|exceptions)"
              r"|-march=native|-mtune=native|-mavx2?|-mavx512\w*|-mfma|-mf16c|-msse\d(\.\d)?|-ffp-contract=\w+"
              r"|-w|-Wall|-Wextra|-Wno-[\w-]+|-pthread|-fopenmp-simd")
# ptxas options: optimisation level, verbosity, load caching, spill and local-memory warnings
_PTXAS = r"(-v|-O[0-3]|--verbose|-dlcm=c[ag]|-dscm=\w+|-warn-spills|-warn-lmem-usage|--warn-on-spills|--warn-on-local-memory-usage)"
_SAFE_FLAG = re.compile(
    rf"^({_HOST_FLAG}|-lineinfo|--generate-line-info|--use_fast_math|-use_fast_math|--std=c\+\+\d\d|-G"
    r"|--restrict|-restrict|--expt-relaxed-constexpr|--expt-extended-lambda|--extended-lambda"
    r"|-Xptxas=?-v|-Xptxas=-O[0-3]|--ptxas-options=-(v|O[0-3])|-maxrregcount=\d+|--maxrregcount=\d+"
    r"|-arch=sm_\d+a?|-gencode=arch=compute_\d+a?,code=(sm|compute)_\d+a?|--gpu-architecture=sm_\d+a?"
    r"|-res-usage|--resource-usage|-Xcompiler=?-fopenmp|-Xcompiler=?-O[0-3]|-Xcompiler=-march=native"
    r"|-Xcompiler=-ffast-math|-Xcompiler=-funroll-loops|-Xcompiler=-Wall|-Xcompiler=-w"
    r"|-?-ftz=(true|false)|-?-prec-div=(true|false)|-?-prec-sqrt=(true|false)|-?-fmad=(true|false)"
    r"|--default-stream=per-thread|-lcublas|-lcublasLt|-lcudnn|-lgomp|-lpthread"
    # Libraries the process has loaded before any candidate code (PyTorch links them): naming them
    # again adds no code, only a DT_NEEDED entry the loader finds satisfied. What the binary then
    # calls in them is judged per symbol (policy.check_binary), as without the flag: the strict
    # policy refuses cuRAND/cuFFT/cuSPARSE functions whatever links them.
    r"|-l(cudart|cuda|c10|c10_cuda|torch|torch_cuda|torch_cpu|torch_python|m|stdc\+\+|curand|cufft|cusparse)"
    # nvcc options with no effect on what the code may reach: ptxas's optimisation level, verbosity,
    # caching and spill warnings (comma lists too), virtual and real architectures, compile threads,
    # suppressed front-end diagnostics
    rf"|-Xptxas=({_PTXAS}(,{_PTXAS})*)|--ptxas-options=({_PTXAS}(,{_PTXAS})*)"
    rf"|-Xcompiler=({_HOST_FLAG})(,({_HOST_FLAG}))*|--compiler-options=({_HOST_FLAG})(,({_HOST_FLAG}))*"
    r"|-arch=(compute|sm)_\d+a?|--gpu-architecture=(compute|sm)_\d+a?|-code=(sm|compute)_\d+a?(,(sm|compute)_\d+a?)*"
    r"|--gpu-code=(sm|compute)_\d+a?(,(sm|compute)_\d+a?)*"
    r"|(-gencode=|--generate-code=)arch=compute_\d+a?,code=\[?(sm|compute)_\d+a?(,(sm|compute)_\d+a?)*\]?"
    r"|--threads=\d+|-t\d+|-m64|-Xcudafe=--diag_suppress=[\w,]+|--diag-suppress=[\d,]+|-diag-suppress=[\d,]+"
    r"|-Wno-deprecated-gpu-targets|-ftemplate-depth=\d+)$")
# nvcc's two-token spellings (`-Xptxas -O3`, `-Xcompiler -fopenmp`): the option alone is harmless
# only with one of these values right after it.
_PAIRED = {"-Xptxas": re.compile(rf"^({_PTXAS}(,{_PTXAS})*)$"),
           "--ptxas-options": re.compile(rf"^({_PTXAS}(,{_PTXAS})*)$"),
           "-Xcompiler": re.compile(rf"^({_HOST_FLAG})(,({_HOST_FLAG}))*$"),
           "--compiler-options": re.compile(rf"^({_HOST_FLAG})(,({_HOST_FLAG}))*$"),
           "-gencode": re.compile(r"^arch=compute_\d+a?,code=\[?(sm|compute)_\d+a?(,(sm|compute)_\d+a?)*\]?$"),
           "--generate-code": re.compile(r"^arch=compute_\d+a?,code=\[?(sm|compute)_\d+a?(,(sm|compute)_\d+a?)*\]?$"),
           "-arch": re.compile(r"^(compute|sm)_\d+a?$"), "-code": re.compile(r"^(sm|compute)_\d+a?$"),
           "-t": re.compile(r"^\d+$"), "--threads": re.compile(r"^\d+$"),
           "-Xcudafe": re.compile(r"^--diag_suppress=[\w,]+$")}


def clean_flags(flags) -> tuple[str, ...]:
    """Flags as the compiler will see them: surrounding blanks stripped, empty entries dropped.
    Published load_inline calls pass `extra_cflags=['']`, which torch's builder ignores too."""
    return tuple(s for s in (str(f).strip() for f in (flags or ()) if f is not None) if s)


class BuildError(Exception):
    def __init__(self, message: str, log: str = "", timeout: bool = False):
        super().__init__(message)
        self.log = log
        self.timeout = timeout


class BuildSpec(BaseModel):
    """What to build. `sources` maps a relative path to its text."""

    model_config = ConfigDict(frozen=True)
    name: str
    sources: tuple[tuple[str, str], ...]
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    with_cuda: bool = False
    slot: str                      # persistent build folder identity (workspace path or inline name)

    def key(self, fingerprint: str) -> str:
        h = hashlib.sha256(fingerprint.encode())
        h.update(self.model_dump_json(exclude={"slot"}).encode())
        return h.hexdigest()[:24]


class BuildResult(BaseModel):
    library: Path
    seconds: float
    cached: bool
    key: str
    # which header the .cu files saw: "ops" (OPS_HEADER), "light" (LIGHT_EXTENSION_H), "torch" (its
    # own, or no .cu); for a cached library what its build recorded (None: a cache older than that)
    headers: str | None = "torch"


IMPORTS_FILE = "imports.json"
HEADERS_FILE = "headers.txt"   # beside a cached library: which header its .cu files were built with
SHARED_BINDING = "binding.o"   # the fixed binding.cpp, compiled once beside the precompiled header
REGISTRY_HEADER = "binding_registry.h"
# load_inline's `#include <torch/extension.h>`, moved into a header of the judge's next to main.cpp,
# which gcc then takes precompiled (a header is used precompiled only from the including file's folder
# or a -include; the system include of the original is searched for in torch's folders)
INLINE_PRELUDE = "torch_extension_prelude.h"
INLINE_PCH_KEEP = 6            # precompiled inline preludes kept (least recently used go first)
# Published load_inline CUDA sources start with `#include <torch/extension.h>`: torch's whole C++
# frontend and pybind11, which nvcc's two front ends (cudafe++ for the host side, cicc for the
# device side) parse in every .cu, about three times what a kernel file's tensor API needs (nvcc
# -time: cudafe++ and cicc over 70% of such a compile; benchmarks/cuda_header_cost.py). With
# light_cuda_headers a build first puts this stand-in ahead of torch's header for the .cu files
# only (main.cpp keeps torch's own, for its bindings); a file that uses more (pybind11, torch::nn)
# fails and the build runs again with torch's header. The object is the candidate's code either way:
# what the judge then verifies and times is what it built.
LIGHT_DIR = "light-include"
LIGHT_EXTENSION_H = """#pragma once
// cuda-agent's stand-in for <torch/extension.h> in .cu files: the tensor API (torch/types.h:
// ATen's tensors and operators, TORCH_CHECK, the dispatch macros) without the C++ frontend's
// modules and pybind11. A file that needs those is built again with torch's own header.
#include <torch/types.h>
"""
# Lighter still (JudgeConfig.op_cuda_headers): load_inline's cuda.cu itself starts with
# `#include <torch/types.h>`, whose ATen.h declares every ATen operator (a few thousand headers)
# and torch/library.h the operator registry. This stand-in for both torch/types.h and
# torch/extension.h keeps the tensor class with all its methods, options, the dispatch macros,
# checks, the tensor operators and torch's factory functions, and of ATen's free functions only those
# the build's sources name as a call: each name's own header from ATen/ops, which declares every
# overload of that name, so a call resolves as it does under torch's header or not at all (a name
# missed, or an API beyond these, fails the compile and the next header is tried). About 30% less
# nvcc time than the stand-in above on published .cu files (benchmarks/cuda_header_cost.py).
OPS_DIR = "ops-include"
OPS_HEADER = "cuda_agent_ops.h"
_OPS_HEAD = """#ifndef CUDA_AGENT_OPS_STANDIN_H
#define CUDA_AGENT_OPS_STANDIN_H
// cuda-agent's stand-in for <torch/types.h> and <torch/extension.h> in .cu files: ATen's tensor,
// options, dispatch macros and checks, and of ATen's operators only those the sources call.
#ifndef AT_PER_OPERATOR_HEADERS
#define AT_PER_OPERATOR_HEADERS
#define CUDA_AGENT_PER_OPERATOR_SET
#endif
#include <optional>
#include <ATen/core/Tensor.h>
#include <ATen/Context.h>
#include <ATen/Device.h>
#include <ATen/DeviceGuard.h>
#include <ATen/Dispatch.h>
#include <ATen/ScalarOps.h>
#include <ATen/TensorOperators.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
"""
_OPS_TAIL = """#ifdef CUDA_AGENT_PER_OPERATOR_SET
#undef AT_PER_OPERATOR_HEADERS
#undef CUDA_AGENT_PER_OPERATOR_SET
#endif
namespace torch {  // as torch/types.h
using namespace at;
using std::nullopt;
using std::optional;
using Dtype = at::ScalarType;
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kUInt16 = at::kUInt16;
constexpr auto kUInt32 = at::kUInt32;
constexpr auto kUInt64 = at::kUInt64;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
constexpr auto kU8 = kUInt8;
constexpr auto kU16 = kUInt16;
constexpr auto kU32 = kUInt32;
constexpr auto kU64 = kUInt64;
constexpr auto kI8 = kInt8;
constexpr auto kI16 = kInt16;
constexpr auto kI32 = kInt32;
constexpr auto kI64 = kInt64;
constexpr auto kF16 = kFloat16;
constexpr auto kF32 = kFloat32;
constexpr auto kF64 = kFloat64;
}  // namespace torch
#endif
"""
# A name followed by a call's parenthesis (template arguments allowed between)
_CALLED = re.compile(r"\b([A-Za-z_]\w*)\s*(?:<[^<>;(){}]*>)?\s*\(")
# What neither stand-in declares (pybind11, the C++ frontend's modules): torch's header at once
_NEEDS_TORCH_H = re.compile(r"pybind11|PYBIND11|\bpy::|torch::(nn|optim|jit|data|serialize)\b")


@functools.lru_cache(maxsize=1)
def aten_op_names() -> frozenset[str]:
    """Names that have a per-operator header in the installed torch (ATen/ops/NAME.h)."""
    import torch

    ops = Path(torch.__file__).resolve().parent / "include" / "ATen" / "ops"
    return frozenset(p.stem for p in ops.glob("*.h")) if ops.is_dir() else frozenset()


def ops_header(texts) -> str:
    """The op stand-in for sources `texts`: the fixed part and one ATen/ops include per called name."""
    names = sorted({m for t in texts for m in _CALLED.findall(t)} & aten_op_names())
    return _OPS_HEAD + "".join(f"#include <ATen/ops/{n}.h>\n" for n in names) + _OPS_TAIL


def object_imports(out_dir: Path) -> list[str] | None:
    """Demangled undefined symbols of every object file in a build folder (None without `nm`)."""
    import subprocess

    objects = sorted(str(p) for p in out_dir.glob("*.o"))
    if not objects or shutil.which("nm") is None:
        return None
    res = subprocess.run(["nm", "--undefined-only", "-C", *objects], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        return None
    names = set()
    for line in res.stdout.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0] in ("U", "w", "v"):
            names.add(parts[1].split("@")[0].strip())
    # A function one object calls and another defines (a workspace's binding file and its kernels)
    # is the candidate's own code, not an import.
    res = subprocess.run(["nm", "--defined-only", "-C", *objects], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        return None
    for line in res.stdout.splitlines():
        parts = line.strip().split(None, 2)
        if len(parts) == 3:
            names.discard(parts[2].split("@")[0].strip())
    return sorted(names)


def library_imports(library: Path) -> list[str] | None:
    """The imports recorded at build time for a cached library."""
    path = library.parent / IMPORTS_FILE
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, list) else None


def toolkit_lib_dirs() -> frozenset[str]:
    """The folders the libraries PyTorch loads come from (real paths): torch's own lib folder,
    the CUDA toolkit's (and its link stubs, where -lcuda is found on a machine without a driver),
    and the lib folders of the nvidia-* wheels PyTorch depends on. `-L` to one of them adds no
    library the process does not already have; any other folder could hold one of the candidate's."""
    import glob

    dirs: set[str] = set()
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
        dirs.add(str(Path(torch.__file__).parent / "lib"))
    except Exception:  # no torch: nothing to compare with, every -L is refused
        return frozenset()
    if CUDA_HOME:
        for rel in ("lib64", "lib", "lib64/stubs", "lib/stubs", "targets/*/lib", "targets/*/lib/stubs"):
            dirs.update(glob.glob(os.path.join(CUDA_HOME, rel)))
    for entry in sys.path:
        dirs.update(glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib")))
    return frozenset(os.path.realpath(d) for d in dirs if os.path.isdir(d))


def _toolkit_dir(path: str) -> bool:
    return bool(path) and os.path.isdir(path) and os.path.realpath(path) in _TOOLKIT_DIRS()


_TOOLKIT_DIRS = functools.lru_cache(maxsize=1)(toolkit_lib_dirs)


def check_flags(flags: list[str] | tuple[str, ...]) -> list[str]:
    """Flags that are not allowed (empty list if all are fine). Blank entries are no flags."""
    flags = [str(f) for f in flags]
    bad = []
    i = 0
    while i < len(flags):
        f = flags[i].strip()
        if f in _PAIRED and i + 1 < len(flags) and _PAIRED[f].match(flags[i + 1].strip()):
            i += 2
            continue
        if f == "-L" and i + 1 < len(flags) and _toolkit_dir(flags[i + 1].strip()):
            i += 2
            continue
        if f.startswith("-L") and _toolkit_dir(f[2:]):
            i += 1
            continue
        if f and not _SAFE_FLAG.match(f):
            bad.append(flags[i])
        i += 1
    return bad


def build_arch(device: str, arch: str | None) -> str | None:
    """The CUDA arch list builds use: the configured one, else (on cuda) the device's own."""
    if device == "cuda" and arch is None:
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        return f"{major}.{minor}"
    return arch


def toolchain_fingerprint(arch: str | None) -> str:
    import torch

    cxx = os.environ.get("CXX", "c++")
    return json.dumps({
        "torch": torch.__version__, "cuda": torch.version.cuda, "arch": arch, "cxx": cxx,
        "python": sys.version.split()[0], "abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
        "builder": 4,  # 4: imports.json leaves out symbols the library's own objects define
    }, sort_keys=True)


def workspace_spec(kernels: tuple[tuple[str, str], ...], slot: str, device: str) -> BuildSpec:
    """The CUDA Agent workspace build: kernels/* plus the fixed binding infrastructure."""
    suffixes = (".cu", ".cpp") if device == "cuda" else (".cpp",)
    sources = [("binding.cpp", (INFRA / "binding.cpp").read_text()),
               ("binding_registry.h", (INFRA / "binding_registry.h").read_text())]
    sources += [(f"kernels/{rel}", src) for rel, src in kernels]
    compiled = [rel for rel, _ in kernels if rel.endswith(suffixes)]
    if not compiled:
        raise BuildError(f"no kernels/*{'|*'.join(suffixes)} sources to build")
    cflags = ("-O3", "-fopenmp") if device == "cpu" else ("-O3",)
    ldflags = ("-fopenmp",) if device == "cpu" else ()
    return BuildSpec(name="cuda_extension", sources=tuple(sources), cflags=cflags,
                     cuda_cflags=("-O3",), ldflags=ldflags, with_cuda=device == "cuda", slot=slot)


def inline_spec(*, name: str, cpp_sources, cuda_sources, functions, cflags, cuda_cflags, ldflags,
                with_cuda: bool | None, with_pytorch_error_handling: bool = True) -> BuildSpec:
    """Reproduce `load_inline`'s source layout (main.cpp with generated bindings, cuda.cu)."""
    if isinstance(cpp_sources, str):
        cpp_sources = [cpp_sources]
    if isinstance(cuda_sources, str):
        cuda_sources = [cuda_sources]
    cpp_sources = list(cpp_sources or [])
    cuda_sources = list(cuda_sources or [])
    if not all(isinstance(s, str) for s in cpp_sources + cuda_sources):
        raise BuildError("load_inline sources must be strings")
    main = [f'#include "{INLINE_PRELUDE}"'] + cpp_sources
    if functions:
        if isinstance(functions, str):
            functions = [functions]
        if isinstance(functions, dict):
            items = list(functions.items())
        else:
            items = [(f, f"{f}") for f in functions]
        main.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for fn, doc in items:
            if not re.fullmatch(r"[A-Za-z_]\w*", str(fn)):
                raise BuildError(f"invalid function name {fn!r}")
            wrapped = f"torch::wrap_pybind_function({fn})" if with_pytorch_error_handling else fn
            main.append(f'm.def("{fn}", {wrapped}, {json.dumps(str(doc))});')
        main.append("}")
    sources = [(INLINE_PRELUDE, "#include <torch/extension.h>\n"), ("main.cpp", "\n".join(main))]
    if cuda_sources:
        sources.append(("cuda.cu", "\n".join(
            ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"] + cuda_sources)))
    if with_cuda is None:
        with_cuda = bool(cuda_sources)
    if not re.fullmatch(r"[A-Za-z_]\w{0,63}", str(name)):
        raise BuildError(f"invalid extension name {name!r}")
    return BuildSpec(name=name, sources=tuple(sources), cflags=clean_flags(cflags),
                     cuda_cflags=clean_flags(cuda_cflags), ldflags=clean_flags(ldflags),
                     with_cuda=bool(with_cuda), slot=f"inline-{name}")


class Builder:
    """Builds specs into the shared library cache. Thread-safe across processes via file locks."""

    def __init__(self, cache_dir: Path, work_root: Path, *, arch: str | None, timeout_s: float,
                 uid: int | None, jobs: int | None = None, zygote=None, cpus: list[int] | None = None,
                 light_cuda_headers: bool = False, op_cuda_headers: bool = False, landlock: str = "auto"):
        self.lib_dir = cache_dir / "ext"
        self.build_root = work_root / "build"
        self.lib_dir.mkdir(parents=True, exist_ok=True)
        self.build_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.build_root, 0o711)
        self.arch = arch
        self.timeout_s = timeout_s
        self.uid = uid
        self.cpus = cpus  # where builds run (a judge keeps its own cores for the calls it times)
        self.jobs = jobs or (len(cpus) if cpus else os.cpu_count()) or 2
        self.fingerprint = toolchain_fingerprint(arch)
        self.zygote = zygote  # callable returning a Zygote (or None): saves the interpreter start
        # Precompiled headers: the judge's cache, shown read-only to the sandboxed builds (`expose`)
        self.pch_root = cache_dir / "pch"
        self._pch_failed: set[str] = set()
        self.light_cuda_headers = light_cuda_headers   # see LIGHT_EXTENSION_H
        self.op_cuda_headers = op_cuda_headers         # see OPS_HEADER
        self.landlock = landlock  # for the compiler processes, as for the candidate's (SandboxSpec.landlock)

    @classmethod
    def for_config(cls, config, work_root: Path, *, arch: str | None, uid: int | None, jobs: int | None = None,
                   zygote=None, cpus: list[int] | None = None) -> "Builder":
        """A builder with a JudgeConfig's build settings (its cache, build limit and header choice):
        the judge's own, a compile worker's and `build_ahead`'s build alike."""
        return cls(config.cache_dir, work_root, arch=arch, timeout_s=config.build_timeout_s, uid=uid, jobs=jobs,
                   zygote=zygote, cpus=cpus, light_cuda_headers=config.light_cuda_headers,
                   op_cuda_headers=config.op_cuda_headers, landlock=config.landlock_mode())

    def lookup(self, spec: BuildSpec) -> Path | None:
        lib = self.lib_dir / spec.key(self.fingerprint) / f"{spec.name}.so"
        return lib if lib.exists() else None

    def build(self, spec: BuildSpec) -> BuildResult:
        key = spec.key(self.fingerprint)
        t0 = time.monotonic()
        cached = self.lookup(spec)
        if cached:
            return BuildResult(library=cached, seconds=time.monotonic() - t0, cached=True, key=key,
                               headers=_recorded_headers(cached))
        # each list on its own: a two-token flag must not pair across compiler and linker lines
        bad = check_flags(spec.cflags) + check_flags(spec.cuda_cflags) + check_flags(spec.ldflags)
        if bad:
            raise BuildError(f"compiler/linker flags not allowed: {' '.join(bad)}")
        # One build per key at a time (across threads and processes): the same sources submitted
        # twice wait for the first build instead of compiling again in another folder.
        with open(self.lib_dir / f".{key}.lock", "w") as key_lock:
            fcntl.flock(key_lock, fcntl.LOCK_EX)
            cached = self.lookup(spec)
            if cached:
                return BuildResult(library=cached, seconds=time.monotonic() - t0, cached=True, key=key,
                                   headers=_recorded_headers(cached))
            bdir, lock = self._claim_folder(spec)
            with lock:
                return self._build_locked(spec, key, bdir, t0)

    def _build_locked(self, spec: BuildSpec, key: str, bdir: Path, t0: float) -> BuildResult:
        self._sync_sources(bdir / "src", spec)
        gch = self._pch(spec)
        self._attach_pch(bdir / "src", gch, spec)
        shared = gch.parent / SHARED_BINDING if gch is not None else None
        shared = shared if shared and shared.exists() else None
        used = "torch"
        for tier in self._header_tiers(spec):
            try:
                self._run(bdir, spec, shared, headers=tier)
            except BuildError as exc:
                if exc.timeout:
                    raise
                # The next header, torch's own last, as a plain load_inline build would: what the
                # stand-in lacked, or the candidate's own error (then every try fails, and torch's
                # header's errors are the ones reported). Only the .cu files compile again.
                continue
            used = tier
            break
        if used == "torch":
            self._run(bdir, spec, shared)
        built = bdir / "out" / f"{spec.name}.so"
        if not built.exists():
            raise BuildError("the build produced no library")
        dest = self.lib_dir / key
        tmp = self.lib_dir / f".{key}.{os.getpid()}.{threading.get_ident()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        shutil.copy2(built, tmp / f"{spec.name}.so")
        # What the candidate's own code calls: the undefined symbols of the objects compiled
        # from its sources, read by the judge. The linked library also carries the CUDA
        # runtime's imports (ioctl, dlopen, threads), which are not the candidate's doing.
        (tmp / IMPORTS_FILE).write_text(json.dumps(object_imports(bdir / "out")))
        (tmp / HEADERS_FILE).write_text(used)
        try:
            os.rename(tmp, dest)
        except OSError:  # another judge finished the same key first
            shutil.rmtree(tmp, ignore_errors=True)
        return BuildResult(library=dest / f"{spec.name}.so", seconds=time.monotonic() - t0, cached=False, key=key,
                           headers=used)

    def _header_tiers(self, spec: BuildSpec) -> list[str]:
        """The stand-in headers a build tries before torch's own, lightest first: only for .cu files
        that include torch's header, and none where the sources plainly need what neither declares."""
        cu = [text for rel, text in spec.sources if rel.endswith(".cu")]
        device_side = [text for rel, text in spec.sources if rel.endswith((".cu", ".cuh"))]
        if not (spec.with_cuda and cu) or any(_NEEDS_TORCH_H.search(text) for text in device_side):
            return []
        tiers = []
        if self.op_cuda_headers and aten_op_names() and any(
                "torch/types.h" in t or "torch/extension.h" in t for t in cu):
            tiers.append("ops")
        if self.light_cuda_headers and any("torch/extension.h" in t for t in cu):
            tiers.append("light")
        return tiers

    def _claim_folder(self, spec: BuildSpec, ways: int = 8):
        """A persistent build folder of the spec's slot, locked. Different sources under one slot
        (load_inline candidates of many rollouts all named like the example they copied, say)
        would wait for each other on one folder: a busy folder sends the build to the next of
        `ways` folders of that slot, each keeping its own incremental state. All busy: wait."""
        base = hashlib.sha256(f"{spec.slot}|{spec.with_cuda}".encode()).hexdigest()[:16]
        for way in range(ways):
            name = base if way == 0 else f"{base}-{way}"
            lock = open(self.build_root / f"{name}.lock", "w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            break
        else:
            name = base
            lock = open(self.build_root / f"{name}.lock", "w")
            fcntl.flock(lock, fcntl.LOCK_EX)
        bdir = self.build_root / name
        bdir.mkdir(parents=True, exist_ok=True)
        return bdir, lock

    @staticmethod
    def _sync_sources(src_dir: Path, spec: BuildSpec) -> None:
        """Write sources, touching only files whose text changed so ninja rebuilds only those."""
        src_dir.mkdir(parents=True, exist_ok=True)
        wanted = {}
        for rel, text in spec.sources:
            path = (src_dir / rel).resolve()
            if src_dir.resolve() not in path.parents:
                raise BuildError(f"source path escapes the build folder: {rel}")
            wanted[path] = text
        for path in [p for p in src_dir.rglob("*") if p.is_file()]:
            if path.resolve() not in wanted:
                path.unlink()
        for path, text in wanted.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text(errors="replace") != text:
                path.write_text(text)

    @staticmethod
    def _pch_header(spec: BuildSpec) -> str | None:
        files = dict(spec.sources)
        return next((h for h in (REGISTRY_HEADER, INLINE_PRELUDE) if h in files), None)

    def _pch(self, spec: BuildSpec) -> Path | None:
        """The precompiled header for this spec's flags, made on first use (None: none), with the
        fixed binding.cpp compiled beside it (SHARED_BINDING) when the spec has one. A load_inline
        prelude is made on its flag set's second use, and only the last INLINE_PCH_KEEP are kept."""
        name = self._pch_header(spec)
        if name is None:
            return None
        files = dict(spec.sources)
        header, binding = files[name], files.get("binding.cpp")
        inline = name == INLINE_PRELUDE
        # The extension's name is left out of the header's compile line (job.make_pch), and only
        # the C++ flags reach main.cpp, so one inline prelude serves every name and CUDA flag set.
        parts = ([self.fingerprint, "inline", spec.cflags, spec.with_cuda, header] if inline else
                 [self.fingerprint, spec.name, spec.cflags, spec.cuda_cflags, spec.ldflags, spec.with_cuda, header,
                  binding])
        key = ("inline-" if inline else "") + hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]
        pdir = self.pch_root / key
        gch = pdir / f"{name}.gch"
        if gch.exists():
            if inline:
                _touch(pdir)  # recently used: kept
            return gch
        if key in self._pch_failed:
            return None
        self.pch_root.mkdir(parents=True, exist_ok=True)
        if inline and not self._seen_before(key):
            return None
        with open(self.pch_root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if gch.exists():
                return gch
            if inline:
                self._evict_inline(keep=INLINE_PCH_KEEP - 1)
            pdir.mkdir(exist_ok=True)
            (pdir / name).write_text(header)
            job = {"name": spec.name, "sources": [], "cflags": list(spec.cflags), "cuda_cflags": list(spec.cuda_cflags),
                   "ldflags": list(spec.ldflags), "include": [str(pdir)], "build_directory": str(pdir),
                   "with_cuda": spec.with_cuda, "header": str(pdir / name)}
            if binding is not None:
                (pdir / "binding.cpp").write_text(binding)
                job["binding"] = str(pdir / "binding.cpp")
                job["binding_object"] = str(pdir / SHARED_BINDING)
            try:
                self._run_job(pdir, job)
            except BuildError:  # builds still work, only slower: say nothing, try once per judge
                self._pch_failed.add(key)
                return None
            finally:
                for leftover in ("probe.cpp", "probe.ninja", "job.json"):
                    (pdir / leftover).unlink(missing_ok=True)
            if gch.exists():
                if os.geteuid() == 0:  # made under the build uid; from now on read-only to it
                    for path in (pdir, *pdir.iterdir()):
                        os.chown(path, 0, 0)
                        os.chmod(path, 0o755 if path.is_dir() else 0o644)
                return gch
        self._pch_failed.add(key)
        return None

    def _seen_before(self, key: str) -> bool:
        """Whether a build has asked for this prelude before (and mark that one has now)."""
        mark = self.pch_root / f"{key}.seen"
        try:
            fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return True
        os.close(fd)
        return False

    def _evict_inline(self, keep: int) -> None:
        """Remove all but the `keep` most recently used inline preludes. A build already compiling
        with one has the file open; one about to start finds its link dangling and parses the
        header instead."""
        used = {}
        for p in self.pch_root.glob("inline-*"):
            try:
                if p.is_dir():
                    used[p] = p.stat().st_mtime
            except OSError:  # evicted by another judge meanwhile
                pass
        for old in sorted(used, key=used.get, reverse=True)[keep:]:
            shutil.rmtree(old, ignore_errors=True)

    @classmethod
    def _attach_pch(cls, src: Path, gch: Path | None, spec: BuildSpec) -> None:
        name = cls._pch_header(spec)
        if name is None:
            return
        dest = src / f"{name}.gch"
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        if gch is None:
            return
        # A symlink: the build folder is chowned to the build uid, which must not own the shared file.
        dest.symlink_to(gch)

    def _run(self, bdir: Path, spec: BuildSpec, shared_binding: Path | None = None, headers: str | None = None) -> None:
        """Build the spec in `bdir`; `shared_binding`: the fixed binding.cpp's object, linked
        instead of compiling binding.cpp here (ninja links extra_ldflags after the objects);
        `headers`: "light", the .cu files see LIGHT_EXTENSION_H as <torch/extension.h>; "ops",
        they see this spec's OPS_HEADER as both <torch/types.h> and <torch/extension.h>."""
        src = bdir / "src"
        compiled = [str(src / rel) for rel, _ in spec.sources if rel.endswith((".cu", ".cpp", ".cc"))
                    and not (shared_binding is not None and rel == "binding.cpp")]
        cuda_cflags = list(spec.cuda_cflags)
        if headers:
            # outside src/ (the candidate's sources), written by the judge; an -I of nvcc's line
            # only, searched before torch's -isystem folders
            root = bdir / (LIGHT_DIR if headers == "light" else OPS_DIR)
            if headers == "light":
                texts = {"extension.h": LIGHT_EXTENSION_H}
            else:
                one = f'#include "{OPS_HEADER}"\n'   # both of torch's names lead to the one stand-in
                called = (text for rel, text in spec.sources if not rel.endswith(".cpp"))  # not the bindings
                texts = {OPS_HEADER: ops_header(called), "types.h": one, "extension.h": one}
            (root / "torch").mkdir(parents=True, exist_ok=True)
            for path in (root, root / "torch"):
                path.chmod(0o755)
            for name, text in texts.items():
                (root / "torch" / name).write_text(text)
                (root / "torch" / name).chmod(0o644)
            cuda_cflags = [f"-I{root}"] + cuda_cflags
        job = {
            "name": spec.name, "sources": compiled, "cflags": list(spec.cflags),
            "cuda_cflags": cuda_cflags,
            "ldflags": list(spec.ldflags) + ([str(shared_binding)] if shared_binding is not None else []),
            "include": [str(src), str(src / "kernels")], "build_directory": str(bdir / "out"),
            "with_cuda": spec.with_cuda,
        }
        (bdir / "out").mkdir(exist_ok=True)
        self._run_job(bdir, job)

    def _run_job(self, bdir: Path, job: dict) -> None:
        src = bdir / "src"
        (bdir / "job.json").write_text(json.dumps(job))
        env = {"MAX_JOBS": str(self.jobs)}
        if self.arch:
            env["TORCH_CUDA_ARCH_LIST"] = self.arch
        proc = Sandboxed(SandboxSpec(
            argv=python_argv("cuda_agent.judge.builds.job", str(bdir / "job.json")),
            workdir=bdir, uid=self.uid, env=env, max_procs=4096, max_file_mb=4096,
            target="builds.job", target_args=[str(bdir / "job.json")], landlock=self.landlock,
            expose=(self.pch_root,)),
            self.zygote() if self.zygote else None)
        pin_threads(proc.pid, self.cpus)
        try:
            try:
                proc.proc.wait(timeout=self.timeout_s)
            except Exception:
                raise BuildError(f"build exceeded {self.timeout_s:.0f} s", proc.log_tail(), timeout=True) from None
            if proc.proc.returncode != 0:
                log = proc.log_tail(200_000)
                raise BuildError(trim_compiler_output(log, src), log)
        finally:
            # cleanup, not kill alone: also the job's pids cgroup (whatever is still inside dies
            # with it, and the cgroup goes: the kernel's cgroups are finite, a long-running judge
            # makes one per build) and what the build's uid left in the shared temporary folders;
            # the build folder stays, it holds the result
            proc.cleanup(remove_workdir=False)
            log_file = bdir / "process.log"
            if log_file.exists():
                log_file.unlink()


def _recorded_headers(library: Path) -> str | None:
    try:
        return (library.parent / HEADERS_FILE).read_text().strip() or None
    except OSError:
        return None


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:  # owned by another user of the machine, or just evicted: only the order suffers
        pass


_NOISE = ("[", "FAILED", "ninja:", "Traceback", "File ", "subprocess.", "raise ", "RuntimeError", "The above")
_ERROR_LINE = re.compile(r"(error|Error|ERROR|undefined reference|fatal)")


def trim_compiler_output(log: str, src_dir: Path | None = None, limit: int = 4000) -> str:
    """Keep what a person needs: error lines with their location and a line of context, paths
    relative to the sources, no ninja/torch boilerplate and no traceback."""
    if src_dir is not None:
        log = log.replace(str(src_dir) + "/", "")
    lines = log.splitlines()
    keep: list[str] = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line) and not line.lstrip().startswith(_NOISE):
            if "RuntimeError: Error building extension" in line or "CalledProcessError" in line:
                continue
            keep.append(line.strip()[:400])
            for extra in lines[i + 1: i + 3]:
                if extra.strip() and not _ERROR_LINE.search(extra) and not extra.lstrip().startswith(_NOISE):
                    keep.append("    " + extra.strip()[:400])
    text = "\n".join(dict.fromkeys(keep)) or "\n".join(lines[-30:])
    if len(text) > limit:
        text = text[: limit - 40] + f"\n... ({len(text) - limit + 40} more characters)"
    return text
