"""The one module that owns timing.

Inside a process, a call is timed from a start marker to the moment the *whole device* is idle.
On CUDA the start marker sits behind a **gate**: a kernel that occupies every SM's thread slots
until the harness has finished enqueueing the call (or a timeout passes). The call's kernels then
run back to back, so the events measure GPU work, not the gaps in which the GPU waited for Python
to launch the next kernel: a 10 us kernel is timed as 10 us, as Nsight Compute would, not as the
50-60 us its Python launch path takes. An end event on the calling stream gives the time; a device-
wide synchronize then waits for work on any other stream, and if that work outlived the end event,
the time runs to the device's idle point instead. On the CPU, `perf_counter` around the call.

A forward that synchronizes with the host inside the call (`.item()`, `cudaDeviceSynchronize`)
would wait for the gate; the gate's timeout releases it, and the process times its later calls
without the gate.

Who opens the gate (JudgeConfig.gate_release): the process, right after forward returns; or the
judge, which then also writes the call's inputs only at that moment (the process says when forward
has enqueued its work). With the judge's release, no work on the inputs can start before the
judge's clock does, and the judge's clock of the call leaves out the host's enqueueing exactly as
the gated time does: a launch-bound forward, or one whose enqueueing a loaded host slows, is no
longer mistaken for a lie. The process cannot open that gate early to any purpose: the inputs are
not there before the judge's release. The judge also holds an outside clock (its own wall clock around each request
to the candidate process); `reconcile` decides whether the candidate's own claim is believed.
"""

from __future__ import annotations

import os
import statistics
from time import perf_counter as _perf_counter  # bound at import: rebinding time.perf_counter later changes nothing here

import torch

from .verdict import Timing

GATE_KERNEL = "cuda_agent_gate"
# The gate: thread 0 of each block polls a flag in pinned host memory (sparingly: the poll crosses
# PCIe), every other thread holds its slot at the barrier, so no other kernel can start on the SM.
_GATE_SOURCE = r"""
extern "C" __global__ void cuda_agent_gate(volatile int* flag, int* timed_out, int timeout_us, int token) {
    if (threadIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        while (*flag != token) {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (t - t0 > (unsigned long long)timeout_us * 1000ull) { *timed_out = 1; break; }
            __nanosleep(4000);
        }
    }
    __syncthreads();
}
"""
GATE_TIMEOUT_US = 50_000   # longer than any honest forward takes to enqueue; a host sync costs this once
# With the judge's release the judge opens the gate (after RELEASE_WAIT_S at the latest, calls.py `release_call`);
# the gate's own timeout is then only a backstop against a judge that never does.
JUDGE_GATE_TIMEOUT_US = 10_000_000
RELEASE_WAIT_S = 0.2
_gate_kernel = None
_gate_error: str | None = None


def prepare_gate() -> str | None:
    """Compile the gate kernel (NVRTC, ~0.2 s) once per process, before any candidate code loads:
    the sandbox refuses what compiling it needs later. Returns why the gate is unavailable, or None."""
    global _gate_kernel, _gate_error
    if _gate_kernel is None and _gate_error is None:
        try:
            _gate_kernel = torch.cuda._compile_kernel(_GATE_SOURCE, GATE_KERNEL)
        except Exception as exc:  # no NVRTC, an old torch: calls are timed without the gate
            _gate_error = f"{type(exc).__name__}: {exc}"[:300]
    return _gate_error


class _Gate:
    """Holds the calling stream (and every SM) until `release`.

    Everything the launch needs (the driver's entry point, the argument block) is resolved here,
    before the sandbox is installed: the sandbox refuses loading libraries and resolving symbols.
    `control_address`: the data plane's control page in this process (page-aligned, shared with the
    judge); it is page-locked here so that the gate can poll the judge's release word there."""

    def __init__(self, control_address: int | None = None):
        import ctypes

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        per_sm = max(1, int(getattr(props, "max_threads_per_multi_processor", 2048)) // 1024)
        self.blocks = int(props.multi_processor_count) * per_sm
        self._pinned = (torch.zeros(1, dtype=torch.int32, pin_memory=True),
                        torch.zeros(1, dtype=torch.int32, pin_memory=True))
        # Read and written through NumPy views: no ATen op runs in the call, where every op dispatched
        # is the candidate's as far as the policy is concerned.
        self.flag, self.timed_out = (t.numpy() for t in self._pinned)
        utils = torch.cuda._utils
        driver = getattr(utils, "_get_gpu_runtime_library", None) or getattr(utils, "_get_cuda_library")
        lib = driver()
        self._launch = lib.cuLaunchKernel
        self._own_flag = ctypes.c_void_p(self._pinned[0].data_ptr())
        self._control_flag: ctypes.c_void_p | None = None
        self.control = None  # the judge's release word, as this process reads it
        self.control_problem: str | None = None  # why the judge cannot release this gate, with a control page
        if control_address is not None:
            import numpy as np

            from .protocol import CONTROL_BYTES

            # Without it the gate still works, released by the process (the judge then does not ask).
            err = torch.cuda.cudart().cudaHostRegister(control_address, CONTROL_BYTES, 0)
            dptr = ctypes.c_uint64(0)
            if err == 0:
                err = lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(control_address), 0)
            if err != 0:
                self.control_problem = f"the control page could not be mapped for the GPU (CUDA error {err})"
            else:
                self._control_flag = ctypes.c_void_p(dptr.value)
                self.control = np.frombuffer((ctypes.c_int32 * 1).from_address(control_address), dtype=np.int32)
        self._values = [self._own_flag, ctypes.c_void_p(self._pinned[1].data_ptr()), ctypes.c_int(GATE_TIMEOUT_US),
                        ctypes.c_int(1)]
        self._args = (ctypes.c_void_p * 4)(*(ctypes.addressof(v) for v in self._values))
        self._c_void_p = ctypes.c_void_p
        self.token: int | None = None  # the judge's release token of the call held now

    def hold(self, token: int | None = None) -> None:
        """Hold the stream until `release` (token None) or until the judge writes `token`."""
        if token is not None and self._control_flag is None:
            raise RuntimeError("no control page: the judge cannot release this gate")
        self.token = token
        self.flag[0] = 0
        if token is None:
            self._values[0].value, self._values[2].value, self._values[3].value = \
                self._own_flag.value, GATE_TIMEOUT_US, 1
        else:
            self._values[0].value, self._values[2].value, self._values[3].value = \
                self._control_flag.value, JUDGE_GATE_TIMEOUT_US, int(token)
        stream = self._c_void_p(torch.cuda.current_stream().cuda_stream)
        err = self._launch(_gate_kernel.func, self.blocks, 1, 1, 1024, 1, 1, 0, stream, self._args, None)
        if err != 0:
            raise RuntimeError(f"the timing gate did not launch (CUDA driver error {err})")

    def released(self) -> bool:
        """Whether the judge has already written this call's token."""
        return self.token is not None and int(self.control[0]) == self.token

    def release(self) -> None:
        if self.token is None:
            self.flag[0] = 1

    def wait_released(self, timeout_s: float) -> bool:
        """Spin on the host until the judge has written this call's token (or `timeout_s` passed):
        a sleep would wake tens of microseconds late, and the idle marker with it."""
        if self.token is None:
            return True
        control, token = self.control, self.token
        end = _perf_counter() + timeout_s
        while int(control[0]) != token:
            if _perf_counter() > end:
                return False
        return True


class CallTimer:
    """Times one call on `device` with full-device synchronisation. `method` says how the last
    call was timed: "gated" (behind the gate, GPU work only), "events" (events around the call,
    launch gaps included) or "cpu" (perf_counter)."""

    # Work on other streams may outlive the end event by this much beyond the host's own reaction
    # to the device going idle (`_reaction_ms`, measured at start-up) before the time runs to the
    # device's idle point instead.
    _SIDE_SLACK_MS = 0.01
    _REACTION_CAP_MS = 0.05

    def __init__(self, device: str, gate: bool = True, control_address: int | None = None):
        self.device = device
        self.method = "cpu"
        self.gate: _Gate | None = None
        self.gate_problem: str | None = None
        self.control = None  # the judge's release word (a one-element int32 view), with a control page
        self._early = False  # the judge opened this call's gate before forward had enqueued its work
        self._timeouts = 0  # consecutive calls whose forward waited for the host behind the gate
        self._reaction_ms = 0.0  # from the end of the device's work to the idle marker, with no work at all
        # The last gated call's time between its start and end markers; stop() returns more where the
        # device was busy past the end marker (side streams). None for calls timed any other way.
        self.last_stream_ms: float | None = None
        # Diagnostics of the last gated call: the idle marker's lag behind the end marker, and how
        # long the timing thread waited for a core while it waited for the device (device_busy_ms).
        self.last_lag_ms: float | None = None
        self.last_run_delay_ms: float | None = None
        self._schedstat: int | None = None  # fd of this thread's /proc schedstat (-1: unreadable)
        if device == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._idle = torch.cuda.Event(enable_timing=True)
            self._idle_again = torch.cuda.Event(enable_timing=True)
            self.method = "events"
            if gate:
                self.gate_problem = prepare_gate()
                if self.gate_problem is None:
                    try:
                        gate = _Gate(control_address)
                        self.control = gate.control
                        gate.hold()  # once through, before any candidate code can interfere
                        gate.release()
                        torch.cuda.synchronize()
                        self.gate = gate
                    except Exception as exc:
                        self.gate_problem = f"{type(exc).__name__}: {exc}"[:300]
                if self.gate is not None:
                    try:
                        self._reaction_ms = self._measure_reaction()
                    except Exception:  # no correction: a side-stream check that errs towards the longer time
                        self._reaction_ms = 0.0

    def _measure_reaction(self) -> float:
        """The idle marker lags the device's last work by the host's reaction (the synchronize
        returning, the marker's launch): the median of empty gated calls, subtracted from the idle
        point before it is compared with the end event."""
        lags = []
        for _ in range(7):
            self.start()
            self.stop()
            lags.append(self.last_lag_ms)
        return sorted(lags)[len(lags) // 2]

    def can_hold(self) -> bool:
        """Whether the next call can be held behind a gate the judge releases."""
        return self.gate is not None and self.control is not None

    def wait_release(self, token: int, timeout_s: float = JUDGE_GATE_TIMEOUT_US / 1e6) -> None:
        """Without a gate: wait on the host for the judge's release (the inputs are there after it)."""
        import time

        if self.control is None:
            return
        end = _perf_counter() + timeout_s
        while int(self.control[0]) != token and _perf_counter() < end:
            time.sleep(20e-6)

    def start(self, token: int | None = None) -> None:
        """Start timing a call; with `token`, behind a gate that the judge opens (`can_hold`)."""
        self._early = False
        if self.device == "cuda":
            torch.cuda.synchronize()
            if self.gate is not None:
                try:
                    self.gate.hold(token)
                except Exception as exc:  # time this call and the next without it
                    self.gate, self.gate_problem = None, f"{type(exc).__name__}: {exc}"[:300]
            self._start.record()
        else:
            self._t0 = _perf_counter()

    def enqueued(self) -> bool:
        """Forward returned (the judge's release): whether the judge had opened the gate already,
        i.e. forward waited on the host behind the gate until the judge's patience ran out."""
        self._early = self.gate is not None and self.gate.released()
        return self._early

    def stop(self) -> float:
        """Milliseconds since `start`, after all queued device work finished."""
        self.last_stream_ms = self.last_lag_ms = self.last_run_delay_ms = None
        if self.device != "cuda":
            return (_perf_counter() - self._t0) * 1e3
        gate = self.gate
        if gate is None:
            torch.cuda.synchronize()
            self._end.record()
            self._end.synchronize()
            self.method = "events"
            return float(self._start.elapsed_time(self._end))
        self._end.record()
        gate.release()  # a no-op where the judge releases it
        if gate.token is not None:
            # The judge's release takes a round trip (its input writes, then the word the gate
            # polls): waited for here, on the host, so the synchronize below waits only for the
            # call's own work, as with the process's release. A synchronize that waits through the
            # round trip returns later after the device goes idle than the reaction measured at
            # start-up, and the idle marker's lag then reads as work on another stream.
            gate.wait_released(JUDGE_GATE_TIMEOUT_US / 1e6)
        delay0 = self._run_delay_ms()
        torch.cuda.synchronize()
        self._idle.record()
        # How long this thread waited for a core between the device finishing and the idle marker's
        # launch (it spins in the synchronize; a loaded core preempts it): the marker is that late.
        waited = max(self._run_delay_ms() - delay0, 0.0)
        self._idle.synchronize()
        timed_out = bool(int(gate.timed_out[0])) or self._early
        gate.timed_out[0] = 0
        if timed_out:
            # The call waited for the host inside forward (a first call's allocations do: the
            # allocator asks the driver for memory), so the gate only delayed it. Its time is the
            # ungated one (the start marker ran when the gate gave up); a forward that does so on
            # every call is timed without the gate from the third on. (With the judge's release: the
            # judge opened the gate before forward returned, after RELEASE_WAIT_S.)
            self._timeouts += 1
            if self._timeouts >= 3:
                self.gate = None
                self.gate_problem = "forward synchronized with the host while the gate held the device"
        else:
            self._timeouts = 0
        # The host's reaction now, under whatever load the host has now: a second idle marker, with
        # no work at all between the first one and it.
        self._idle_again.record()
        self._idle_again.synchronize()
        stream_ms = float(self._start.elapsed_time(self._end))
        idle_ms = float(self._start.elapsed_time(self._idle))
        self.method = "events" if timed_out else "gated"
        self.last_stream_ms = stream_ms
        self.last_lag_ms, self.last_run_delay_ms = idle_ms - stream_ms, waited
        now_ms = float(self._idle.elapsed_time(self._idle_again))
        return device_busy_ms(stream_ms, idle_ms, self._reaction_ms, now_ms, waited,
                              self._SIDE_SLACK_MS, self._REACTION_CAP_MS)

    def _run_delay_ms(self) -> float:
        """This thread's time spent waiting for a core so far (the kernel's schedstat), 0 where the
        kernel does not say. The file is opened once, on the thread that times the calls."""
        if self._schedstat == -1:
            return 0.0
        try:
            if self._schedstat is None:
                self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            return int(os.pread(self._schedstat, 128, 0).split()[1]) / 1e6
        except (OSError, ValueError, IndexError):
            self._schedstat = -1
            return 0.0


def device_busy_ms(stream_ms: float, idle_ms: float, reaction_ms: float, now_ms: float, waited_ms: float,
                   side_slack_ms: float = CallTimer._SIDE_SLACK_MS,
                   reaction_cap_ms: float = CallTimer._REACTION_CAP_MS) -> float:
    """A gated call's time: from the start marker to the end marker (`stream_ms`), or, where work
    on another stream outlived the end marker, to the point the device went idle.

    That point is read from the idle marker (`idle_ms` after the start marker), launched once a
    device-wide synchronize returned, so it lags the device's last work by the host's reaction: the
    larger of the one measured at start-up (`reaction_ms`), the one just measured (`now_ms`: a second
    marker right after the first) and the start-up one plus the time the timing thread waited for a
    core meanwhile (`waited_ms`: a loaded core delays its return from the synchronize, and the marker
    with it, by up to a scheduler slice, while the second marker finds the thread running). The
    reaction taken off is capped (4 x the start-up one + `reaction_cap_ms`), so a host made slow on
    purpose hides no more side-stream work than that; the judge's outside clock bounds the rest."""
    reaction = max(reaction_ms, min(max(now_ms, reaction_ms + waited_ms), 4 * reaction_ms + reaction_cap_ms))
    busy_ms = idle_ms - reaction
    return stream_ms if busy_ms - stream_ms <= side_slack_ms + 0.05 * stream_ms else busy_ms


PAGE_STRIDE = 1 << 21  # the GPU's large page: one address translation per 2 MiB of device memory


def touch_pages(tensors) -> None:
    """Read one byte in every 2 MiB of each contiguous CUDA tensor's memory, on the current stream.

    Loads the GPU's address translations for memory a timed call is about to stream (the judge's
    own work between calls, in its own CUDA context, can leave them evicted, where a profiler's
    replay finds them warm) while putting only one cache line per page into the L2."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda and t.numel() and t.is_contiguous():
            t.detach().reshape(-1).view(torch.uint8)[::PAGE_STRIDE].max()


def largest_floating(tensors) -> torch.Tensor | None:
    """The floating-point tensor with the most elements among `tensors` (the one a probe streams)."""
    return max((t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()),
               key=lambda t: t.numel(), default=None)


def bandwidth_probe(x: torch.Tensor, flusher: "CacheFlusher", reps: int = 5) -> dict[str, float]:
    """A diagnostic of where a memory-bound kernel loses time (`timing_check.py --bandwidth-probe`):
    the median ms of `y = 2x` over the largest of a call's inputs, L2 flushed before each, timed by
    CUDA events in the calling process: read from `x` where it lies (the judge's shared region, in a
    candidate process) or from a copy in this process's own memory, back to back or after the
    flush alone. Trusted code only: the judge asks for it after the calls, never for a verdict."""
    x = x.detach().reshape(-1)
    y = torch.empty_like(x)
    own = x.clone()
    out: dict[str, float] = {}
    for name, src in (("shared", x), ("own", own)):
        for back_to_back in (False, True):
            times = []
            for _ in range(reps):
                if not back_to_back:
                    flusher.flush()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.mul(src, 2.0, out=y)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            out[f"{name}{'_b2b' if back_to_back else ''}"] = round(sorted(times)[len(times) // 2], 4)
    out["mb"] = round(x.numel() * x.element_size() / 2**20, 1)
    return out


def flushes_after_inputs(mode: str, inputs, l2_bytes: int) -> bool:
    """Whether a call's L2 is flushed again once its inputs are written (JudgeConfig.flush_after_inputs):
    "on" always, "off" never, "auto" where the inputs together exceed the L2 (`l2_bytes`). Inputs
    written after the untimed flush leave their last lines dirty in the L2: a larger input makes the
    call write them back (timed), a smaller one is read from the L2 instead of memory."""
    if mode != "auto":
        return mode == "on"
    return sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor)) > l2_bytes


class CacheFlusher:
    """Leaves the last-level cache cold before each call.

    On CUDA it *reads* a buffer twice the L2's size rather than writing it: a write leaves the
    L2 full of dirty lines, which the timed call would then pay to write back to DRAM; a read
    evicts what the last call left (its write-backs happen here, untimed) and leaves only clean
    lines the call never touches, as Nsight Compute's flush-and-invalidate does."""

    def __init__(self, device: str, enabled: bool = True):
        self.enabled = enabled
        self.buf = None
        self.l2_bytes = 0
        if not enabled:
            return
        if device == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20) or (64 << 20)
            self.l2_bytes = int(l2)
            self.buf = torch.ones(int(l2) * 2 // 4, dtype=torch.float32, device="cuda")
        else:
            self.buf = torch.empty((32 << 20) // 4, dtype=torch.float32)

    def flush(self) -> None:
        if self.buf is None:
            return
        if self.buf.is_cuda:
            self.buf.sum()
            torch.cuda.synchronize()
        else:
            self.buf.fill_(1.0)


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


# The least waiting for a core the wall-clock bound may take off one call (reconcile caps it at the
# null model's protocol cost, and at no less than this): about a scheduler slice.
WAIT_ALLOWANCE_FLOOR_MS = 1.0


def reconcile(inside_ms: list[float], outside_ms: list[float], overhead_ms: float, *,
              rel_slack: float, abs_slack_ms: float, cores: int = 1, source: str = "events",
              protocol_ms: list[float] | None = None, baseline_protocol_ms: float | None = None,
              busiest_ms: list[float] | None = None, wall_ms: list[float] | None = None,
              waited_ms: list[float | None] | None = None, wall_overhead_ms: float | None = None,
              wall_steady: list[bool] | None = None) -> Reconciled:
    """Believe the candidate's own times only if the judge's clock agrees.

    `outside_ms` are the judge's own measurements of the same calls (wall time on CUDA; on the
    CPU backend the CPU time the process consumed, which does not grow while it waits for a
    core); `overhead_ms` is what the protocol alone costs on that clock (measured with a trusted
    null model). `(outside - overhead) / cores` is then a lower bound of the work's duration.

    A busy host stretches the protocol, not the work: `protocol_ms` is the round trip of the
    untimed request just before each call (measured next to it, under the same load) and
    `baseline_protocol_ms` the same round trip when the null model was measured, so each call's
    overhead grows by what its neighbouring round trip grew (capped: a candidate that slows that
    request buys itself at most the cap). Load only ever adds time, so the bound is read from the
    lower quartile of the calls, not their median. On the CPU backend `busiest_ms` is, per call,
    the CPU time of the candidate's busiest thread: one thread runs on one core at a time, so that
    time (less the same overhead) bounds the call from below whatever `cores` is, and a
    single-threaded candidate cannot claim less than its own work.

    Both CPU-time bounds divide when serial work is handed from thread to thread in turn: the
    process then spends the work's duration in CPU time (not the cores' multiple) and no thread
    more than its share, so a claim from a clock slowed inside the process could be the cores'
    factor short. Wall time does not divide. `wall_ms` is the judge's wall time of each call and
    `waited_ms` the time the candidate's threads and the judge's waited for a core meanwhile
    (the kernel's run delay, summed over the threads; clocks.py `waits_during`): what load adds
    to an honest call is threads of its critical path waiting, so the wall time less those waits,
    less `wall_overhead_ms` (the null model's wall time per call: the protocol's cost, its waits
    included, so a null measured on a loaded host weakens the bound rather than tightening it) and
    the same protocol growth, is a third lower bound, only ever max()ed into the others.

    The waits taken off are capped at the null model's protocol cost (at least
    `WAIT_ALLOWANCE_FLOOR_MS`). A sum over threads counts waits off the critical path too, which
    a candidate can raise at will: 64 threads woken together cost about 0.3 ms of wall time and
    add about 10 ms of summed run delay on 2 cores; and on a loaded host the kernel charged run
    delay to relay threads while they slept between handoffs (Linux 6.18: about all of a relay's
    wall time, the same as an honest two-thread kernel's). The cap keeps what matters for an
    honest call: its claim already holds every wait inside its forward, so only the protocol's
    waits outside it must come off; what load adds to the protocol beyond the cap is left to
    `protocol_ms` and the slack (on 2 cores: within them with one busy process per core; with two,
    now and then past them, and the honest time is replaced by the bound). A call whose
    `wall_steady` is False lost a thread (and its waits) during the call: unless the waits still
    read reach the cap (where more would change nothing), its wall bound may replace the claim but
    not make it a lie.

    The claim is believed when it is not below the bound by more than the slack; otherwise the
    bound is the runtime. A claim under a third of the bound is a lie, not noise.
    """
    inside = statistics.median(inside_ms)
    extra = [0.0] * len(outside_ms)
    if protocol_ms is not None and baseline_protocol_ms is not None and len(protocol_ms) == len(outside_ms):
        cap = max(overhead_ms, 0.5)
        extra = [min(max(p - baseline_protocol_ms, 0.0), cap) for p in protocol_ms]
    est = [max(o - overhead_ms - x, 0.0) / cores for o, x in zip(outside_ms, extra)]
    if busiest_ms is not None and len(busiest_ms) == len(est):
        est = [max(e, b - overhead_ms - x) for e, b, x in zip(est, busiest_ms, extra)]
    sure = est  # the bounds that may call a claim a lie
    if wall_ms is not None and waited_ms is not None and wall_overhead_ms is not None \
            and len(wall_ms) == len(waited_ms) == len(est):
        allowance = max(wall_overhead_ms, WAIT_ALLOWANCE_FLOOR_MS)
        steady = wall_steady if wall_steady is not None and len(wall_steady) == len(est) else [True] * len(est)
        walled = [e if r is None else max(e, w - min(max(r, 0.0), allowance) - wall_overhead_ms - x)
                  for e, w, r, x in zip(est, wall_ms, waited_ms, extra)]
        sure = [w if s or (r is not None and r >= allowance) else e
                for e, w, s, r in zip(est, walled, steady, waited_ms)]
        est = walled

    def lower_quartile(xs: list[float]) -> float:
        ordered = sorted(xs)
        return ordered[(len(ordered) - 1) // 4] if ordered else 0.0

    outside = lower_quartile(est)
    if outside <= inside * (1 + rel_slack) + abs_slack_ms:
        return Reconciled(summarize(inside_ms, source), True, False, "")
    gross = lower_quartile(sure) > 3 * inside + 4 * abs_slack_ms
    note = (f"claimed {inside:.4f} ms per call but the judge's clock measured at least {outside:.4f} ms "
            f"(after {overhead_ms:.4f} ms of protocol cost): using the judge's clock")
    return Reconciled(summarize([max(e, 1e-6) for e in est], "outside"), False, gross, note)
