"""Facts about the host and process-wide choices that several parts of the system share: the cores
this process may use, the GPUs a child should see, the sandbox uids each kind of process runs
under, the fp32 numerics of references, what counts as running out of memory, and how a child's
exit is told.

Kept light (no torch import at module level): the judge's and the synthesis workers' sandboxed
processes import it too.
"""

from __future__ import annotations

import os
import re
import sys

# -- cores and GPUs ----------------------------------------------------------------------------------

def usable_cpus() -> list[int]:
    """The ids of the cores this process may run on, in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """The cores this process may run on (a pinned share of a machine), not the machine's count."""
    return len(usable_cpus()) or 1


def visible_gpus() -> list[str]:
    """Device identifiers a child should see, one per GPU (CUDA_VISIBLE_DEVICES entries, or indices).
    Counting through NVML does not create a CUDA context in this process."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and not d.strip().startswith("-")]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no usable torch CUDA build: no GPUs
        return []


# -- sandbox uids ------------------------------------------------------------------------------------
# Cleaning up after a sandboxed process kills every process of its uid, so no two processes that
# may be alive at once share one. Each kind takes its own range (used when running as root):

SYNTH_UIDS = range(58000, 61000)   # synthesis filter workers: a few per slot, taken in turn
JUDGE_UIDS = range(61000, 65000)   # a judge's candidate processes (and a pool's judge slots)
BUILD_UID_OFFSET = 5000            # a judge's builds: its uid + this (66000-69999)
SPARE_UID_STRIDE = 10000           # the k-th worker a judge keeps alive at once: its uid + k * this
PREBUILD_UIDS = range(150000, 158000)  # `cuda-agent build` ahead of judging: 8 per process


def judge_uid(spread: int) -> int:
    """A judge's uid; `spread` (a process id, a slot number) picks one in the range."""
    return JUDGE_UIDS.start + spread % len(JUDGE_UIDS)


def build_uid(uid: int) -> int:
    """The uid the builds of the judge (or pool slot) with `uid` run under."""
    return uid + BUILD_UID_OFFSET


def spare_uid(uid: int, k: int) -> int:
    """The uid of the k-th of the workers that the judge with `uid` keeps alive at once (k = 0: its own)."""
    return uid + SPARE_UID_STRIDE * k


def prebuild_uid_base(spread: int) -> int:
    """The first of the 8 uids of one `cuda-agent build` process (`spread`: its process id)."""
    return PREBUILD_UIDS.start + (spread % (len(PREBUILD_UIDS) // 8)) * 8


def synth_uid(slot: int, start: int, ways: int) -> int:
    """The uid of a synthesis worker slot's `start`-th process; a slot cycles through `ways` uids so
    that a replacement never shares one with the process it replaces."""
    return SYNTH_UIDS.start + slot * ways + start % ways


# -- numerics ------------------------------------------------------------------------------------------

def true_fp32(torch) -> None:
    """Matmuls and convolutions in true fp32 in this process: with TF32 the reference would be the
    less precise side (the fp32 tolerance is 1e-4 relative L2). Process-wide by necessity."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


# -- out of memory -------------------------------------------------------------------------------------

# what torch and the CUDA runtime say when an allocation or a context does not fit
_OOM_TEXT = re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation")


def is_out_of_memory(error: object) -> bool:
    """Whether a failure is for want of memory: an exception (MemoryError, torch's OutOfMemoryError,
    or the CUDA runtime's error text in a kernel launch), a verdict's Failure (its category, or a
    judge failure whose text is the judge's own out-of-memory), or failure text."""
    if isinstance(error, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if isinstance(error, BaseException):
        return (oom_type is not None and isinstance(error, oom_type)) or bool(_OOM_TEXT.search(str(error)))
    category = getattr(error, "category", None)
    if category is not None:
        if getattr(category, "value", category) == "oom":
            return True
        return bool(_OOM_TEXT.search(str(getattr(error, "message", ""))))
    return isinstance(error, str) and bool(_OOM_TEXT.search(error))


def exit_description(code: int | None) -> str:
    """A child's exit in words, from its return code (subprocess) or exit code (multiprocessing):
    negative is the signal that killed it, None is still running."""
    import signal

    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"
