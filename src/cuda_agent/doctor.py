"""`cuda-agent doctor`: can this machine judge, and with what isolation?

Each check is one line: ok, warn (works with less: the CPU backend only, reduced isolation, a
missing optional tool) or fail (the judge cannot work as configured). The checks run the same
probes the judge runs (seccomp and namespaces in a throw-away child, the compiler on a real OpenMP
program, CUDA IPC between two processes), so a passing doctor means a judge step can start.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


def _run(argv: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def check_python() -> Check:
    ok = sys.version_info >= (3, 11)
    return Check("python", "ok" if ok else "fail", f"{sys.version.split()[0]} at {sys.executable}"
                 + ("" if ok else " (3.11 or newer needed)"))


def check_torch() -> Check:
    try:
        import torch
    except Exception as exc:  # a broken install says why
        return Check("torch", "fail", f"cannot import torch: {exc} (bash install-torch.sh)")
    if torch.cuda.is_available():
        return Check("torch", "ok", f"{torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)} "
                                    f"({torch.cuda.device_count()} visible)")
    why = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build, but no usable GPU"
    return Check("torch", "warn", f"{torch.__version__}: {why}; the judge uses its CPU backend")


def check_compiler() -> Check:
    """g++ with OpenMP: every candidate and the judge's observer are compiled with it."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return Check("c++ compiler", "fail", "no g++ on PATH (apt-get install g++)")
    version = _run([cxx, "--version"]).stdout.splitlines()[0]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "omp.cpp"
        src.write_text("#include <omp.h>\nint main(){int n=0;\n#pragma omp parallel reduction(+:n)\nn+=1;\n"
                       "return n>0?0:1;}\n")
        res = _run([cxx, "-std=c++20", "-fopenmp", "-O2", str(src), "-o", str(Path(tmp) / "omp")])
        if res.returncode != 0:
            return Check("c++ compiler", "fail", f"{version}: a C++20 OpenMP program does not build: "
                                                 f"{(res.stderr.strip().splitlines() or ['?'])[-1]}")
        if _run([str(Path(tmp) / "omp")]).returncode != 0:
            return Check("c++ compiler", "fail", f"{version}: the OpenMP program built but does not run")
    return Check("c++ compiler", "ok", f"{version} (C++20, OpenMP)")


def check_nvcc() -> Check:
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:
        return Check("nvcc", "warn", "torch missing: not checked")
    nvcc = shutil.which("nvcc") or (str(Path(CUDA_HOME) / "bin" / "nvcc") if CUDA_HOME else None)
    if nvcc is None or not Path(nvcc).exists():
        status: Status = "fail" if torch.cuda.is_available() else "warn"
        return Check("nvcc", status, "no CUDA toolkit (nvcc on PATH or under CUDA_HOME): CUDA candidates cannot build")
    out = _run([nvcc, "--version"]).stdout
    release = next((line.split("release")[-1].split(",")[0].strip() for line in out.splitlines() if "release" in line), "?")
    torch_cuda = torch.version.cuda
    if torch_cuda and release.split(".")[0] != torch_cuda.split(".")[0]:
        return Check("nvcc", "fail", f"nvcc {release} at {nvcc}, torch built for CUDA {torch_cuda}: the major "
                                     "versions must match (candidates would not load)")
    return Check("nvcc", "ok", f"{release} at {nvcc}")


def check_cupti() -> Check:
    from cuda_agent.judge import launches

    include, library = launches.cupti_include(), launches.cupti_library()
    if include is None or library is None:
        return Check("cupti", "warn", "CUPTI headers or library not found: on CUDA the launch observer falls back "
                                      "to PyTorch's profiler on checked calls (said in every verdict)")
    return Check("cupti", "ok", f"headers {include}, library {library}")


def check_tool(name: str, purpose: str) -> Callable[[], Check]:
    def check() -> Check:
        path = shutil.which(name)
        return Check(name, "ok" if path else "warn", path or f"not on PATH: {purpose} unavailable")
    return check


def check_sandbox() -> Check:
    from cuda_agent.judge import sandbox

    problems = [p for p in (sandbox.seccomp_problem(),) if p]
    if problems:
        return Check("sandbox", "fail", problems[0])
    if not sandbox.is_root():
        return Check("sandbox", "warn", "seccomp works; not root: no separate uid, network or mount namespace for "
                                        "candidates (reduced isolation, reported in every verdict)")
    ns = sandbox.namespaces_problem(network=True)
    if ns:
        return Check("sandbox", "fail", ns)
    abi = sandbox.landlock_abi()
    return Check("sandbox", "ok", "seccomp, separate uids, network and mount namespaces"
                 + (f", Landlock ABI {abi}" if abi >= 1 else ", no Landlock in this kernel"))


_IPC_CHILD = r"""
import sys, torch
from cuda_agent.judge.cudaipc import SharedGpuBuffer
torch.cuda.init()
buf = SharedGpuBuffer.open(sys.argv[1], int(sys.argv[2]))
print(int(buf.tensor.sum().item()))
"""


def check_gpu_plane() -> Check:
    """CUDA IPC between two processes: how the judge hands a call's inputs to the candidate."""
    try:
        import torch
    except Exception:
        return Check("gpu plane", "warn", "torch missing: not checked")
    if not torch.cuda.is_available():
        return Check("gpu plane", "warn", "no GPU: not needed on the CPU backend")
    from cuda_agent.judge.cudaipc import SharedGpuBuffer

    nbytes = 1 << 20
    buf = SharedGpuBuffer.create(nbytes)
    try:
        buf.tensor.fill_(1)
        torch.cuda.synchronize()
        res = _run([sys.executable, "-c", _IPC_CHILD, buf.handle.hex(), str(nbytes)], timeout=120)
    finally:
        buf.close()
    if res.returncode != 0 or res.stdout.strip() != str(nbytes):
        tail = (res.stderr.strip().splitlines() or [res.stdout.strip() or "?"])[-1]
        return Check("gpu plane", "warn", f"CUDA IPC failed ({tail}): calls fall back to host memory (slower, "
                                          "said in every verdict)")
    return Check("gpu plane", "ok", "CUDA IPC between processes works")


CHECKS: tuple[Callable[[], Check], ...] = (
    check_python, check_torch, check_compiler, check_nvcc, check_cupti,
    check_tool("compute-sanitizer", "-c memcheck=true"), check_tool("ncu", "per-kernel profiles (Nsight Compute)"),
    check_sandbox, check_gpu_plane)


def run_checks() -> list[Check]:
    out = []
    for check in CHECKS:
        try:
            out.append(check())
        except Exception as exc:  # a check that breaks is a finding, not a crash of the doctor
            out.append(Check(check.__name__.removeprefix("check_"), "fail", f"{type(exc).__name__}: {exc}"))
    return out


def exit_code(checks: list[Check]) -> int:
    return 3 if any(c.status == "fail" for c in checks) else 0

