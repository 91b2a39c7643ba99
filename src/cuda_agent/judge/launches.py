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
- `torch_dir`, run in the judge: the folder whose images are PyTorch's, for the issuers the
  observer reports with each kernel (policy.check_kernel_owners).
"""

from __future__ import annotations

import functools
import glob
import os
import sys
from importlib.resources import files
from pathlib import Path

from .build import BuildSpec

MODULE = "cuda_agent_launches"
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
