"""The one module that owns timing.

Inside a process, a call is timed from a start marker to the moment the *whole device* is idle:
on CUDA a start event, the call, a device-wide synchronize, then an end event (so work left on
any stream counts); on the CPU, `perf_counter` around the call. The judge also holds an outside
clock (its own wall clock around each request to the candidate process); `reconcile` decides
whether the candidate's own claim is believed.
"""

from __future__ import annotations

import statistics
from time import perf_counter as _perf_counter  # bound at import: rebinding time.perf_counter later changes nothing here

import torch

from .verdict import Timing


class CallTimer:
    """Times one call on `device` with full-device synchronisation."""

    def __init__(self, device: str):
        self.device = device
        if device == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self._start.record()
        else:
            self._t0 = _perf_counter()

    def stop(self) -> float:
        """Milliseconds since `start`, after all queued device work finished."""
        if self.device == "cuda":
            torch.cuda.synchronize()
            self._end.record()
            self._end.synchronize()
            return float(self._start.elapsed_time(self._end))
        return (_perf_counter() - self._t0) * 1e3


class CacheFlusher:
    """Overwrites a buffer larger than the last-level cache so each call starts cold."""

    def __init__(self, device: str, enabled: bool = True):
        self.enabled = enabled
        self.buf = None
        if not enabled:
            return
        if device == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20) or (64 << 20)
            self.buf = torch.empty(int(l2) * 2 // 4, dtype=torch.float32, device="cuda")
        else:
            self.buf = torch.empty((32 << 20) // 4, dtype=torch.float32)

    def flush(self) -> None:
        if self.buf is not None:
            self.buf.fill_(1.0)
            if self.buf.is_cuda:
                torch.cuda.synchronize()


def summarize(times_ms: list[float], source: str = "events") -> Timing:
    xs = sorted(times_ms)
    n = len(xs)

    def q(p: float) -> float:
        return xs[min(n - 1, max(0, round(p * (n - 1))))]

    return Timing(
        median_ms=statistics.median(xs), mean_ms=statistics.fmean(xs), min_ms=xs[0], max_ms=xs[-1],
        p10_ms=q(0.1), p90_ms=q(0.9), std_ms=statistics.pstdev(xs) if n > 1 else 0.0, n=n, source=source,
    )


class Reconciled:
    def __init__(self, timing: Timing, believed: bool, gross_lie: bool, note: str):
        self.timing, self.believed, self.gross_lie, self.note = timing, believed, gross_lie, note


def reconcile(inside_ms: list[float], outside_ms: list[float], overhead_ms: float, *,
              rel_slack: float, abs_slack_ms: float, cores: int = 1) -> Reconciled:
    """Believe the candidate's own times only if the judge's clock agrees.

    `outside_ms` are the judge's own measurements of the same calls (wall time on CUDA; on the
    CPU backend the CPU time the process consumed, which does not grow while it waits for a
    core); `overhead_ms` is what the protocol alone costs on that clock (measured with a trusted
    null model). `(outside - overhead) / cores` is then a lower bound of the work's duration. The
    claim is believed when it is not below that bound by more than the slack; otherwise the bound
    is the runtime. A claim under a third of the bound is a lie, not noise.
    """
    inside = statistics.median(inside_ms)
    est = [max(o - overhead_ms, 0.0) / cores for o in outside_ms]
    outside = statistics.median(est)
    if outside <= inside * (1 + rel_slack) + abs_slack_ms:
        return Reconciled(summarize(inside_ms, "events"), True, False, "")
    gross = outside > 3 * inside + 4 * abs_slack_ms
    note = (f"claimed {inside:.4f} ms per call but the judge's clock measured {outside:.4f} ms "
            f"(after {overhead_ms:.4f} ms of protocol cost): using the judge's clock")
    return Reconciled(summarize([max(e, 1e-6) for e in est], "outside"), False, gross, note)
