"""What the timing benchmarks read beside the judge's verdicts (benchmarks/timing_check.py): the
gated calls' markers, the GPU's clocks while a block runs, Nsight Compute's kernel time per forward."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from cuda_agent.hardware.ncu import parse_ncu_csv


def markers(calls) -> dict:
    """What the gated timed calls' markers say: the median time from the start marker to the end
    marker, and how many calls were timed longer because the device looked busy past the end
    marker (CallTimer.stop: the idle marker, less the host's reaction, beyond the slack). An honest
    kernel on one stream should have none; many means the host's reaction after a long wait is
    read as work. And the checked calls' median device time of their kernels in CUDA's activity
    records (`kernel_ms`): near the gated time, the kernels themselves ran that long in the judge's
    process; near Nsight Compute's, the time went between or around them. `waited`: how many timed
    calls' timing thread waited for a core while it waited for the device (`run_delay_ms`; the
    idle marker is that much late, and timing.device_busy_ms takes it off, within its cap). `lag_ms`:
    the timed calls' median lag of the idle marker behind the end marker."""
    import statistics

    kernel = [c.kernel_ms for c in calls if c.role == "check" and getattr(c, "kernel_ms", None) is not None]
    kernel_ms = statistics.median(kernel) if kernel else None
    timed = [c for c in calls if c.role == "timed" and c.stream_ms is not None and c.inside_ms is not None]
    if not timed:
        return {"stream_ms": None, "past_end": None, "kernel_ms": kernel_ms, "waited": None, "lag_ms": None}
    past = sum(c.inside_ms > c.stream_ms * 1.0001 + 1e-6 for c in timed)
    waited = sum((getattr(c, "run_delay_ms", None) or 0.0) > 0.001 for c in timed)
    lags = [c.lag_ms for c in timed if getattr(c, "lag_ms", None) is not None]
    return {"stream_ms": statistics.median(c.stream_ms for c in timed), "past_end": f"{past}/{len(timed)}",
            "kernel_ms": kernel_ms, "waited": f"{waited}/{len(timed)}",
            "lag_ms": round(statistics.median(lags), 4) if lags else None}


class GpuClocks:
    """The GPU's SM clock, power and used memory while a block runs, sampled by `nvidia-smi` every
    50 ms: a long compute-bound kernel timed back to back can run at lower clocks (power or heat)
    than the same kernel replayed once under Nsight Compute. The used memory (every process's) is
    kept with the time of each sample: GPU memory that any process frees slows a memory-bound
    kernel in another for a while after (docs/results/2026-12-06-retired-diagnostics.md, judge_replica), so
    `memory_changes` says whether any process allocated or freed during a window of the block,
    e.g. the judge's calls. Nothing is sampled without nvidia-smi."""

    FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "memory.used")

    def __enter__(self) -> "GpuClocks":
        import threading

        self.samples: list[tuple[float, list[float]]] = []  # (seconds since the start, values)
        exe = shutil.which("nvidia-smi")
        gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self.t0 = time.monotonic()
        self.t_end: float | None = None
        self.proc = subprocess.Popen(
            [exe, f"--query-gpu={','.join(self.FIELDS)}", "--format=csv,noheader,nounits", "-lms", "50", "-i", gpu],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) if exe else None
        # read as the samples come, so each has its time
        self._reader = threading.Thread(target=self._read, daemon=True) if self.proc else None
        if self._reader:
            self._reader.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                values = [float(x) for x in line.split(",")]
            except ValueError:
                continue  # "[N/A]" and the like
            if len(values) == len(self.FIELDS):
                self.samples.append((time.monotonic() - self.t0, values))

    def __exit__(self, *exc) -> None:
        self.t_end = time.monotonic() - self.t0
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)

    def memory_changes(self, last_s: float, min_mib: float = 64.0) -> list[list[float]]:
        """[seconds before the block's end, used MiB] at each change of at least `min_mib` in the
        block's last `last_s` seconds (the first sample of the window included)."""
        if not self.samples or self.t_end is None:
            return []
        window = [(t, v[4]) for t, v in self.samples if t >= self.t_end - last_s]
        out: list[list[float]] = []
        for t, mib in window:
            if not out or abs(mib - out[-1][1]) >= min_mib:
                out.append([round(self.t_end - t, 3), mib])
        return out

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        import statistics

        col = list(zip(*(v for _, v in self.samples)))
        return {"samples": len(self.samples), "sm_mhz_median": statistics.median(col[0]), "sm_mhz_min": min(col[0]),
                "mem_mhz_median": statistics.median(col[1]), "power_w_max": max(col[2]),
                "temp_c_max": max(col[3]), "used_mib_min": min(col[4]), "used_mib_max": max(col[4])}


def ncu_ms_per_forward(text: str, calls: int) -> float | None:
    """Summed gpu__time_duration of every kernel in `ncu --csv` output, per forward (ms)."""
    kernels = parse_ncu_csv(text)
    return sum(k["ns"] for k in kernels) / calls / 1e6 if kernels else None
