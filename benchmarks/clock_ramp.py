"""Does the GPU's clock drop in the gaps between a judge's calls, and what brings it back before a
timed kernel?

The judge's calls are not back to back: between two of them the judge runs the reference, checks
the outputs and talks to the candidate process, and the GPU idles for milliseconds. Nsight
Compute and back-to-back benchmarks time a kernel on a GPU that is already busy. If the SM clock
falls in those gaps and takes longer than a short kernel to come back up, a memory-bound kernel
of ~0.5 ms runs slower under the judge than anywhere else (seen on the H200: 0.655 ms in the
candidate's process, by CUDA's own activity records, against 0.54 ms back to back).

This script times one streaming kernel (timing_check's elementwise kernel, 1 GB in and out by
default) behind the judge's own gate (CallTimer), with the L2 emptied before each call, after an
idle gap of several lengths, and with the gate held for a while before the kernel may start (as
a slow enqueue holds it). A probe kernel reads the SM clock (clock64 against the global timer) at
the end of the gap and right after the call.

    python benchmarks/clock_ramp.py [--mb 1024] [--runs 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_check import EW_PROBE  # noqa: E402  (timing_check's kernel, compiled at run time)

# torch's launcher passes Python ints as C ints: the span is an int
_CLOCK = r"""
extern "C" __global__ void sm_clock(unsigned long long* out, unsigned int span_ns) {
    unsigned long long t0, t, c0, c1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    c0 = clock64();
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < span_ns);
    c1 = clock64();
    out[0] = c1 - c0;
    out[1] = t - t0;
}
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=1024, help="input size in MiB (the output is as large)")
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("clock_ramp.py: needs a CUDA device", file=sys.stderr)
        return 2
    from cuda_agent.judge.timing import CallTimer

    clock = torch.cuda._compile_kernel(_CLOCK, "sm_clock")
    probe_ns = {"torch": torch}
    exec(EW_PROBE, probe_ns)
    ew_call = probe_ns["ew_call"]
    probe = torch.zeros(2, dtype=torch.int64, device="cuda")
    x = torch.randn(args.mb << 18, device="cuda")
    out = torch.empty_like(x)
    cold = torch.ones(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda")
    timer = CallTimer("cuda")

    def sm_mhz() -> float:
        clock(grid=(1, 1, 1), block=(1, 1, 1), args=[probe, 50_000])
        cycles, ns = probe.tolist()
        return cycles / ns * 1e3

    def condition(gap_s: float, held_us: float = 0.0) -> dict:
        times, before, after = [], [], []
        for _ in range(args.runs + 2):
            torch.cuda.synchronize()
            time.sleep(gap_s)
            before.append(sm_mhz())
            cold.sum()
            torch.cuda.synchronize()
            timer.start()
            ew_call(x, out)
            if held_us:  # the gate holds the GPU while the host is busy, as a slow enqueue does
                end = time.perf_counter() + held_us / 1e6
                while time.perf_counter() < end:
                    pass
            times.append(timer.stop())
            after.append(sm_mhz())
        return {"gap_ms": gap_s * 1e3, "held_us": held_us,
                "ms": statistics.median(times[2:]), "min_ms": min(times[2:]),
                "sm_mhz_after_gap": statistics.median(before[2:]), "sm_mhz_after_call": statistics.median(after[2:]),
                "method": timer.method}

    plan = [(0.0, 0), (0.002, 0), (0.01, 0), (0.05, 0), (0.2, 0), (0.05, 1000), (0.05, 5000)]
    rows = []
    for gap_s, held_us in plan:
        r = condition(gap_s, held_us)
        rows.append(r)
        print(f"gap {r['gap_ms']:5.1f} ms  held {held_us:5.0f} us: {r['ms']:.4f} ms "
              f"(min {r['min_ms']:.4f}, {r['method']})  SM clock after the gap {r['sm_mhz_after_gap']:.0f} MHz, "
              f"after the call {r['sm_mhz_after_call']:.0f} MHz", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "mb": args.mb, "rows": rows},
                                       indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
