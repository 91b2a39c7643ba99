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
# may be alive at once share one, within one judge process or across processes (two synthesis
# runs, a judge service beside a benchmark). Each kind takes its own range (used when running as
# root), and every uid in use is leased (`lease_uids`) so that another process cannot take it:

SYNTH_UIDS = range(58000, 61000)   # synthesis filter workers: a few per slot, taken in turn
JUDGE_UIDS = range(61000, 65000)   # a judge's candidate processes (and a pool's judge slots)
BUILD_UID_OFFSET = 5000            # a judge's builds: its uid + this (66000-69999)
SPARE_UID_STRIDE = 10000           # the k-th worker a judge keeps alive at once: its uid + k * this
PREBUILD_UIDS = range(150000, 158000)  # `cuda-agent build` ahead of judging: one per parallel build


def build_uid(uid: int) -> int:
    """The uid the builds of the judge (or pool slot) with `uid` run under."""
    return uid + BUILD_UID_OFFSET


def spare_uid(uid: int, k: int) -> int:
    """The uid of the k-th of the workers that the judge with `uid` keeps alive at once (k = 0: its own)."""
    return uid + SPARE_UID_STRIDE * k


class UidLease:
    """Sandbox uids this process holds: an exclusive `flock` on one file per uid in a folder only
    root can enter. The kernel drops the locks when the process ends, however it ends, so a crash
    frees its uids and there is nothing to clean up. Derived uids (`build_uid`, `spare_uid`) need
    no lease of their own: they follow from the leased one, and no range overlaps another."""

    def __init__(self, base: int, uids: list[int], fds: list[int]):
        self.base, self.uids, self._fds = base, uids, fds

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)   # closing the descriptor drops its lock

    __del__ = close   # a lease dropped unclosed (its owner's set-up failed) frees its uids

    def __enter__(self) -> "UidLease":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _lease_dir() -> str:
    """The folder of the lease files: /run's where it can be made, else the temporary folder's;
    either must be this user's own and closed to others (a folder someone else made could hand
    out their choice of uids)."""
    import stat
    import tempfile

    for parent in ("/run", tempfile.gettempdir()):
        path = os.path.join(parent, "cuda-agent-uids")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return path
    raise RuntimeError("no folder for sandbox uid leases: /run/cuda-agent-uids and "
                       f"{os.path.join(tempfile.gettempdir(), 'cuda-agent-uids')} are missing and cannot be made, "
                       "or belong to another user, or are open to others")


def lease_uids(pool: range, offsets: list[int] | range, spread: int) -> UidLease:
    """The uids `base + o` (o in `offsets`) for the first `base` in `pool`, searched from one that
    `spread` picks (a process id, say, so that processes start apart), of which no live process
    holds any; held until the lease is closed or this process ends. A process that is not root
    cannot run anything under these uids, so it holds none: its lease is the first base, unheld."""
    import fcntl

    offsets = list(offsets)
    room = len(pool) - max(offsets) if offsets else 0
    if room <= 0 or min(offsets) < 0:
        raise ValueError(f"offsets {offsets[:4]}... do not fit uids {pool.start}-{pool.stop - 1}")
    if os.geteuid() != 0:
        return UidLease(pool.start, [pool.start + o for o in offsets], [])
    folder = _lease_dir()
    for i in range(room):
        base = pool.start + (spread + i) % room
        fds: list[int] = []
        for o in offsets:
            fd = os.open(os.path.join(folder, str(base + o)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                break
            fds.append(fd)
        else:
            return UidLease(base, [base + o for o in offsets], fds)
        for fd in fds:
            os.close(fd)
    raise RuntimeError(f"no {len(offsets)} free sandbox uids in {pool.start}-{pool.stop - 1}: other processes "
                       "hold them all")


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
