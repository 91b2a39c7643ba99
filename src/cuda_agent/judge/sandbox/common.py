"""What every mechanism of the sandbox shares: the C library, the prctl numbers, the error a host
that cannot isolate raises, whether the judge is root, and how a sandboxed interpreter is started."""

from __future__ import annotations

import ctypes
import os
import sys

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38


class SandboxError(RuntimeError):
    """The isolation a sandboxed process needs cannot be set up on this host (never the candidate's fault)."""


def is_root() -> bool:
    return os.geteuid() == 0


def python_argv(module: str, *args: str) -> list[str]:
    # -I: isolated mode (no PYTHONPATH, no user site, no cwd on sys.path); -S is not used so the
    # installed packages (torch, this package) stay importable.
    return [sys.executable, "-I", "-m", module, *args]
