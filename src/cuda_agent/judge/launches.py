"""The observer of kernel launches (CUDA): built by the judge, loaded by every CUDA worker before
any candidate code.

`infra/launches.cpp` subscribes to CUPTI's callbacks for every kernel launch entry point of the
driver and the runtime (see that file); this module holds what surrounds it:

- the build spec: the source and CUPTI's headers, taken from the CUDA installation PyTorch uses
  (CUPTI's headers come with the `nvidia-cuda-cupti` wheel PyTorch depends on, or with the CUDA
  toolkit); None where there are none, and the worker then lists kernels on checked calls only,
  through PyTorch's profiler, and says so in the verdict;
- `cupti_library`, run in the worker: the libcupti file PyTorch loads (or would), so that the
  process holds one copy of CUPTI;
- in the judge, the issuers the observer reports with each kernel, read (`issuer_of`) and judged
  (`check_kernel_owners`, the strict policy's rule for what ran on the GPU by who issued it).
"""

from __future__ import annotations

import functools
import glob
import os
import re
import sys
from importlib.resources import files
from pathlib import Path
from typing import NamedTuple

from .builds import BuildSpec

MODULE = "cuda_agent_launches"
GRAPH_LAUNCH = "cuda_agent::graph_launch"   # launches.cpp's name for a graph launch
FILE = "cuda_agent_launches.so"     # its name in a worker's folder


def _site_dirs() -> list[Path]:
    out = []
    for entry in sys.path:
        p = Path(entry or ".")
        if (p / "nvidia").is_dir():
            out.append(p / "nvidia")
    return out


def _cuda_home() -> Path | None:
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:
        return None
    return Path(CUDA_HOME) if CUDA_HOME else None


def cupti_include() -> Path | None:
    """The folder holding cupti.h: the wheel's first (the library PyTorch loads comes from it),
    then the toolkit's."""
    found = []
    for base in _site_dirs():
        found += sorted(glob.glob(str(base / "*" / "include" / "cupti.h")))
    home = _cuda_home()
    if home is not None:
        for rel in ("include", "extras/CUPTI/include", "targets/*/include"):
            found += sorted(glob.glob(str(home / rel / "cupti.h")))
    return Path(found[0]).parent if found else None


def spec() -> BuildSpec | None:
    """launches.cpp with CUPTI's headers beside it (the judge's build takes no -I flags), or None
    where no CUPTI header is installed."""
    include = cupti_include()
    if include is None:
        return None
    source = (files("cuda_agent") / "infra" / "launches.cpp").read_text()
    headers = tuple((p.name, p.read_text(errors="replace")) for p in sorted(include.glob("cupti*.h")))
    return BuildSpec(name=MODULE, sources=(("launches.cpp", source), *headers), cflags=("-O2",), with_cuda=True,
                     slot="judge-launches")


def cupti_library() -> str | None:
    """The libcupti this process has loaded (PyTorch's CUDA build links it), else the one beside
    the headers the observer was built with."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                if "/libcupti.so" in path and os.path.exists(path):
                    return path
    except OSError:
        pass
    candidates = []
    for base in _site_dirs():
        candidates += sorted(glob.glob(str(base / "*" / "lib" / "libcupti.so*")))
    home = _cuda_home()
    if home is not None:
        for rel in ("lib64", "extras/CUPTI/lib64", "targets/*/lib"):
            candidates += sorted(glob.glob(str(home / rel / "libcupti.so*")))
    return candidates[0] if candidates else None


@functools.lru_cache(maxsize=1)
def torch_dir() -> str:
    """The real path of the torch package: its images (lib/libtorch*.so, lib/libc10*.so, _C*.so) are
    PyTorch's, as the launch observer names them (real paths too)."""
    import torch

    return os.path.realpath(os.path.dirname(torch.__file__))


# ---------------------------------------------------------------------------------------------
# Who issued a launch (launches.cpp `issuer`): the chain of loaded images from the launch outward,
# "|"-separated, ending at the first that is neither NVIDIA's nor the C runtime's. NVIDIA's images
# carry a version after ".so." (a candidate's extension is `<identifier>.so`, never one of them).
# Both need ".so." in the name (torch's wheels with bundled CUDA add a hash: libcublasLt-1b2c3d4e.so.12).
_PASS_IMAGE = re.compile(r"^(libcuda|libcudart|libcupti|libnvidia-[\w-]+|libnvperf\w*|libc|libstdc\+\+|libgcc_s|"
                         r"libpthread|ld-linux[\w-]*|libm)([-.][^/]*)?\.so\.")
_VENDOR_IMAGE = re.compile(r"^lib(cublas|cublasLt|cudnn\w*|cufft\w*|curand|cusparse\w*|cusolver\w*|nccl|nvrtc\w*|"
                           r"nvJitLink|cutensor\w*|nvblas)([-.][^/]*)?\.so\.")


class Issuer(NamedTuple):
    """Who issued a launch: `library`, the first image past NVIDIA's and the C runtime's (None when
    the stack walk did not reach one); `vendor`, the vendor library it called (libcublasLt.so.13 ...),
    if the launch went through one."""
    library: str | None
    vendor: str | None


def issuer_of(chain: str) -> Issuer:
    images = [p for p in str(chain).split("|") if p]
    vendor = None
    for path in images:
        base = path.rsplit("/", 1)[-1]
        if _VENDOR_IMAGE.match(base):
            vendor = base  # the outermost one: what the issuer called
        elif not _PASS_IMAGE.match(base):
            return Issuer(path, vendor)
    return Issuer(None, vendor)


def vendor_family(base: str) -> str | None:
    """The vendor allowance (policy.vendor_allowance) a vendor library's kernels need: "gemm" for
    cuBLAS/cuBLASLt, "conv" for cuDNN; None for the others (allowed nowhere under the strict policy)."""
    if base.startswith("libcublas"):
        return "gemm"
    if base.startswith("libcudnn"):
        return "conv"
    return None


def _under(path: str, folder: str) -> bool:
    return bool(folder) and (path == folder or path.startswith(folder.rstrip("/") + "/"))


def check_kernel_owners(owners: dict[str, list[str]] | None, policy: str, vendor: frozenset[str],
                        torch_dir: str) -> list[str]:
    """The kernels a call launched (or replayed from a graph: their issuers at capture), judged by
    who issued them rather than by name (strict policy). `owners`: kernel name -> issuer chains
    (launches.cpp); `vendor`: the task's vendor allowance; `torch_dir`: the real path of the torch
    package, whose images (libtorch*, libc10*, torch/_C) are PyTorch's.

    - issued by PyTorch, directly or through a vendor library it called (torch.mm's cuBLAS GEMM):
      fallback, on every task, whoever captured it into a graph and when;
    - issued by the candidate's code through a vendor library: allowed only where the task allows
      that library (cuBLAS/cuBLASLt for a GEMM, cuDNN for a convolution), as the import check does;
    - an issuer the stack walk did not reach is left to the name rules (`check_kernels`)."""
    if policy != "strict" or not owners:
        return []
    out: list[str] = []
    for name in sorted(owners):
        if name == GRAPH_LAUNCH:
            continue  # the replay itself (torch.cuda.CUDAGraph issues it for anyone): its kernels are judged
        for chain in owners[name] or ():
            who = issuer_of(chain)
            if who.library is not None and _under(who.library, torch_dir):
                via = f" through {who.vendor}" if who.vendor else ""
                out.append(f"a kernel PyTorch issued{via} ran during forward: '{name[:120]}' (from "
                           f"{who.library.rsplit('/', 1)[-1]}): PyTorch's work, not the candidate's, launched directly or "
                           f"replayed from a CUDA graph")
            elif who.vendor is not None:
                family = vendor_family(who.vendor)
                if family is None or family not in vendor:
                    allowed = {"gemm": "a GEMM", "conv": "a convolution"}.get(family or "", None)
                    why = (f"{who.vendor} is allowed only in tasks whose reference has {allowed} (this one has none)"
                           if allowed else f"{who.vendor} is outside the policy (cuBLAS for GEMM and cuDNN for "
                                           f"convolution only)")
                    out.append(f"a vendor kernel ran during forward: '{name[:120]}': {why}")
            else:
                continue
            break  # one finding per kernel name
        if len(out) >= 5:
            break
    return out
