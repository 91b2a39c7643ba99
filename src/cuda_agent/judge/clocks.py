"""The judge's clocks of a candidate process, read from the kernel (/proc and the process CPU
clock), never from the process: its CPU time, each thread's CPU time and wait for a core, and the
judge's own wait. The CPU backend's outside clock and the bounds `timing.reconcile` checks a
claimed time against (judge/calls.py reads them around each call)."""

from __future__ import annotations

import os
import time


def cpu_ns(pid: int) -> int:
    """CPU time (ns) the process has used so far, every thread it ever ran included.

    On the CPU backend this is the outside clock: unlike wall time it does not grow while the
    process waits for a core on a loaded machine, and the candidate cannot change it (it is read
    here, in the judge, from the kernel). Divided by the number of cores it is a lower bound of the
    wall time the work needed. The process-wide CPU clock (CPUCLOCK_SCHED of another process:
    `((~pid) << 3) | 2`) keeps the time of threads that have exited, which summing the live
    threads' schedstat misses; /proc/<pid>/stat (exited threads included, clock-tick resolution)
    is the fallback where that clock is unavailable.
    """
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except (OSError, OverflowError, AttributeError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0


def thread_schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """(CPU time, run delay) in ns of each live thread of the process, the first two fields of the
    kernel's schedstat (read here, in the judge), in one read per thread.

    A thread runs on one core at a time, so the CPU time one thread gained during a call is a lower
    bound of the call's wall time that holds on any number of cores: dividing the process's CPU
    time by the cores would let a single-threaded candidate claim a fraction of its real time (its
    own clock can be slowed from native code). The run delay is the time the thread was runnable
    but waited for a core (`waits_during`). Threads that exited during the call are not here;
    their CPU time still counts in `cpu_ns`, their run delay is lost."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                fields = fh.read().split()
            out[int(tid)] = (int(fields[0]), int(fields[1]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def own_run_delay_ns() -> int:
    """The time (ns) the judge's calling thread has waited for a core so far: it reads the reply,
    so its wait after the candidate answered is part of a call's wall time."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            return int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def waits_during(cpu_ms: float | None, before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                  own_wait_ns: int) -> tuple[float | None, bool]:
    """The time (ms) the candidate's threads and the judge's calling thread waited for a core
    during a call, summed over the threads, and whether that reading is complete.

    The wall-clock bound (timing.reconcile) takes these waits off a call's wall time: every moment
    of an honest call's wall time is a thread of its critical path running (the work, the
    protocol), blocked on another thread of the path (whose time is then the path's) or runnable
    and waiting for a core, which the kernel adds to that thread's run delay. Summed over every
    thread, on and off the path, the waits cover what load added to the path. A wait still in
    progress when read is not counted yet (it is added when the thread gets its core), but the
    path's waits all ended before the reply was read.

    A thread that exited during the call took its waits with it, so the bound may then be too
    high for an honest candidate on a loaded host: such a reading is not `steady` (reconcile lets
    it replace a claim, and call it a lie only where the waits read already reach the cap it puts
    on them). Skipping it instead would let a candidate opt out of the bound by ending a thread in
    every call (torch's own OpenMP work between calls ends the spare threads of a larger team). An
    exit shows as a thread gone, or as CPU time the process gained that its live threads did not
    (a thread both started and ended in the call: the threads are read around the process's CPU
    clock, so a live thread's readings span the process's). None where the kernel's schedstat
    cannot be read or counts nothing (accounting off)."""
    if not before or not after:
        return None, False
    cpu_live_ns = waited_ns = 0
    for tid, (cpu, delay) in after.items():
        cpu0, delay0 = before.get(tid, (0, 0))  # a thread started in the call: all of it is the call's
        cpu_live_ns += max(cpu - cpu0, 0)
        waited_ns += max(delay - delay0, 0)
    if cpu_ms is not None and cpu_ms > 0.05 and cpu_live_ns == 0:
        return None, False
    steady = before.keys() <= after.keys() and (
        cpu_ms is None or cpu_ms * 1e6 - cpu_live_ns <= 20_000 + 0.01 * cpu_ms * 1e6)
    return (waited_ns + max(own_wait_ns, 0)) / 1e6, steady
