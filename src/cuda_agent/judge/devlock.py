"""One device, several judges: a readers-writer lock that keeps timed calls alone on their device.

Judges that share a GPU (`PoolConfig.judges_per_gpu`), or the CPU backend's judges of one pool
(`--workers`: their candidates' threads share the host's cores), take the device's lock file
around every call they make to a candidate: a timed call holds it alone, every other call (checked
and warm-up calls, the reference's work, the output checks) shares it. So the checks of several
candidates run at once while no other judge's calls run beside a timed one: a kernel timed beside
another process's kernels gets the GPU's time slices, not the GPU, and reads several times slower.
What runs outside the calls (builds, starting a candidate's process) takes no lock.

`flock` locks belong to open files, so the lock is released when the holder exits or is killed; a
judge killed mid-call never leaves its device locked. A judge waits for it with a limit, and looks
at who holds it (/proc/locks) while it waits (calls.CallLoop): the lock file is the judge's uid's,
which a candidate of a judge that is not root shares, and a candidate that takes it fails for
tampering instead of stalling every judge of its GPU. A turnstile file in front of the lock keeps a
waiting timed call from being starved by shared holders that keep overlapping: a judge that asks
for the lock alone holds the turnstile while it waits, so new shared holders wait behind it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator


class DeviceLock:
    """The lock of one device, at `path` (its turnstile at `path` + ".turnstile")."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def hold(self, exclusive: bool, timeout: float | None = None) -> Iterator[None]:
        """Hold the device alone (`exclusive`) or together with other shared holders. With `timeout`
        (seconds), `LockTimeout` if it is not had by then, naming the processes that hold it."""
        until = None if timeout is None else time.monotonic() + timeout
        lock_fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            turnstile_fd = os.open(f"{self.path}.turnstile", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                self._take(turnstile_fd, fcntl.LOCK_EX, until)
                try:
                    self._take(lock_fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, until)
                finally:
                    fcntl.flock(turnstile_fd, fcntl.LOCK_UN)
            finally:
                os.close(turnstile_fd)
            yield
        finally:
            os.close(lock_fd)  # closing the file releases its lock

    def _take(self, fd: int, mode: int, until: float | None) -> None:
        if until is None:
            fcntl.flock(fd, mode)
            return
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= until:
                    raise LockTimeout(self.path, self.holders()) from None
                time.sleep(0.0005)

    def holders(self) -> set[int]:
        """The processes that hold a lock on this lock file or its turnstile (/proc/locks)."""
        ids = set()
        for path in (self.path, Path(f"{self.path}.turnstile")):
            try:
                st = os.stat(path)
            except OSError:
                continue
            ids.add((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
        pids = set()
        try:
            with open("/proc/locks") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return pids
        for line in lines:
            parts = line.split()
            if "->" in parts:   # a waiter, not a holder
                continue
            try:
                major, minor, inode = parts[5].split(":")
                if (int(major, 16), int(minor, 16), int(inode)) in ids:
                    pids.add(int(parts[4]))
            except (IndexError, ValueError):
                continue
        return pids


class LockTimeout(Exception):
    """A device lock that was not had within its time limit; `holders` are the processes holding it."""

    def __init__(self, path: Path, holders: set[int]):
        super().__init__(f"{path} was not free in time (held by process{'es' if len(holders) != 1 else ''} "
                         f"{', '.join(map(str, sorted(holders))) or 'unknown'})")
        self.holders = holders


def _lock_folder() -> Path:
    return Path(tempfile.gettempdir()) / "cuda-agent-device-locks"


def host_lock_path() -> Path:
    """The lock of this host's cores, which CPU-backend judges share."""
    return _lock_folder() / "cpu.lock"


def _first_gpu(visible: str | None) -> str:
    first = (visible or "0").split(",")[0].strip() or "0"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in first)


def gpu_lock_path(visible: str | None) -> Path:
    """The lock of the GPU a process sees first (its CUDA_VISIBLE_DEVICES, as the pool or Ray set
    it), under this machine's temporary folder: every judge on this machine that shares that GPU,
    in any pool, takes the same lock."""
    return _lock_folder() / f"gpu-{_first_gpu(visible)}.lock"


def gpu_lock_of(index: int, visible: str | None = None) -> Path:
    """The lock of this process's GPU `index` (its entry in `visible`, by default this process's
    CUDA_VISIBLE_DEVICES, else the index itself): the lock every judge on that GPU takes."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [v.strip() for v in (visible or "").split(",") if v.strip()]
    return gpu_lock_path(entries[index] if index < len(entries) else str(index))


def counters_lock(visible: str | None = None) -> DeviceLock:
    """Nsight Compute's lock of the GPU a process sees first (`visible`, by default this process's
    CUDA_VISIBLE_DEVICES, which the ncu it starts inherits). A GPU's performance counters serve
    one profiling session at a time: a second ncu started meanwhile fails ("a driver resource was
    unavailable"), so every ncu this project starts (the agent's profile tool of any agent on the
    machine, the benchmarks) holds this alone for its whole run."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return DeviceLock(_lock_folder() / f"ncu-{_first_gpu(visible)}.lock")
