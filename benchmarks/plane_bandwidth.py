"""Is GPU memory the judge shares with the candidate (CUDA IPC) as fast to stream as the
candidate's own?

The judge writes each call's inputs into memory it allocated and the candidate process mapped
(`cuda_agent/judge/cudaipc.py`). If a kernel reads that mapping more slowly than memory its own
process allocated (other page sizes, other TLB reach), memory-bound candidates and their eager
baselines are timed slower than Nsight Compute times the same kernels in one process. This script
measures it: a child process maps the parent's buffer and times a streaming kernel (`y = 2x`,
L2 emptied before each call by reading a buffer twice its size, CUDA events around the copy),
with `x` in the shared mapping or in the child's own memory, at several sizes. Also, since a
memory-bound kernel can be timed slower than Nsight Compute times it for other reasons, the same
kernel with the inputs rewritten after the flush (dirty lines in L2, as when the judge writes a
call's inputs), with a fresh output each call, and under the profiler's CUDA activity (which the
judge keeps on in every call), where the profiler's own kernel duration (CUPTI, as Nsight Compute
reads it) is set beside the events'. And timing_check's own elementwise kernel, timed with events
and with the judge's CallTimer (behind the gate), to tell the kernel, the gate and the mapping apart;
then as the judge's worker makes a call: the output allocated in the block just filled with poison.
Last, with 4 GiB of other memory read between calls (as the judge's own work between calls reads
and writes several times the call's data): does a call then start with the GPU's address
translations evicted, and does touching a byte of every 2 MiB page first (JudgeConfig.touch_pages)
give the time back?

    python benchmarks/plane_bandwidth.py [--sizes-mb 128 1024] [--runs 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, statistics, sys, torch
from cuda_agent.judge.cudaipc import SharedGpuBuffer
torch.cuda.init()
handle, nbytes, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
shared = SharedGpuBuffer.open(handle, nbytes).tensor
own = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
own.copy_(shared)
other = own.clone()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
cold = torch.ones(2 * l2 // 4, device="cuda")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

big = None

def timed(src, dirty=False, fresh_out=False, profiled=False, thrash=False, touch=False):
    # y = 2x over the bytes as float32: one read and one write per element, as the ew kernels
    global big
    from cuda_agent.judge.timing import touch_pages
    x = src.view(torch.float32)
    out = torch.empty_like(x)
    times, kernel = [], []
    for _ in range(runs + 3):
        if thrash:  # 4 GiB of other memory read between calls, as the judge's own work touches
            if big is None:
                big = torch.ones(1 << 30, device="cuda")
            big.sum()
        cold.sum()
        if dirty:  # the inputs written after the flush, as the judge writes a call's inputs
            src.copy_(other)
        if touch:  # JudgeConfig.touch_pages: a byte of every 2 MiB page of the input and the output
            touch_pages([x, out])
        torch.cuda.synchronize()
        prof = None
        if profiled:
            from torch.profiler import ProfilerActivity, profile
            prof = profile(activities=[ProfilerActivity.CUDA]); prof.__enter__()
        start.record()
        if fresh_out:
            torch.mul(x, 2.0, out=torch.empty_like(x))
        else:
            torch.mul(x, 2.0, out=out)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if prof is not None:
            prof.__exit__(None, None, None)
            ks = [e.time_range.elapsed_us() for e in prof.events()
                  if str(e.device_type).endswith("CUDA") and "mul" in e.name.lower()]
            kernel.append(sum(ks) / 1e3)
    row = {"events_ms": statistics.median(times[3:])}
    if kernel:
        row["cupti_kernel_ms"] = statistics.median(kernel[3:])
    return row

# timing_check's elementwise kernel itself (float4 grid-stride, blocks capped at 132 x 16), compiled here
EW = r'''
extern "C" __global__ void scale_shift_kernel(const float4* __restrict__ x, float4* __restrict__ y, int n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        float4 v = x[i];
        y[i] = make_float4(v.x * 2.0f + 1.0f, v.y * 2.0f + 1.0f, v.z * 2.0f + 1.0f, v.w * 2.0f + 1.0f);
    }
}
'''
ew = torch.cuda._compile_kernel(EW, "scale_shift_kernel")

def ew_call(x, out):
    n4 = x.numel() // 4
    ew(grid=(min((n4 + 255) // 256, 132 * 16), 1, 1), block=(256, 1, 1), args=[x, out, n4])

def timed_kernel(src, kernel, gated=False):
    # plain events around the kernel, or the judge's own CallTimer (the gate, then events): is it
    # the gate that costs?
    from cuda_agent.judge.timing import CallTimer
    timer = CallTimer("cuda") if gated else None
    x = src.view(torch.float32)
    out = torch.empty_like(x)
    times = []
    for _ in range(runs + 3):
        cold.sum()
        torch.cuda.synchronize()
        if timer is not None:
            timer.start()
            kernel(x, out)
            times.append(timer.stop())
        else:
            start.record()
            kernel(x, out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return {"ms": statistics.median(times[3:]), "method": timer.method if timer else "events"}

def timed_like_judge(src, poison=True):
    # a call as the judge's worker makes it: an allocator block of the output's size filled with
    # 0xFF and freed (the poison), the L2 flush, then behind the gate the output allocated (in that
    # block) and the kernel launched
    from cuda_agent.judge.timing import CallTimer
    timer = CallTimer("cuda")
    x = src.view(torch.float32)
    times = []
    for _ in range(runs + 3):
        if poison:
            block = torch.full((x.numel() * 4,), 0xFF, dtype=torch.uint8, device="cuda")
            del block
        cold.sum()
        torch.cuda.synchronize()
        timer.start()
        out = torch.empty_like(x)
        ew_call(x, out)
        times.append(timer.stop())
        del out
    return {"ms": statistics.median(times[3:]), "method": timer.method}

def mul(x, out):
    torch.mul(x, 2.0, out=out)

extra = {"ew_own_events": lambda: timed_kernel(own, ew_call),
         "ew_shared_events": lambda: timed_kernel(shared, ew_call),
         "ew_shared_gated": lambda: timed_kernel(shared, ew_call, gated=True),
         "mul_shared_gated": lambda: timed_kernel(shared, mul, gated=True),
         "ew_shared_fresh_out_gated": lambda: timed_like_judge(shared, poison=False),
         "ew_shared_poisoned_gated": lambda: timed_like_judge(shared, poison=True)}
conditions = {"own": dict(src=own), "shared": dict(src=shared), "shared_dirty": dict(src=shared, dirty=True),
              "shared_fresh_out": dict(src=shared, fresh_out=True), "shared_profiled": dict(src=shared, profiled=True),
              "own_profiled": dict(src=own, profiled=True), "own_thrashed": dict(src=own, thrash=True),
              "own_thrashed_touched": dict(src=own, thrash=True, touch=True),
              "shared_thrashed": dict(src=shared, thrash=True),
              "shared_thrashed_touched": dict(src=shared, thrash=True, touch=True)}
got = {}
for name, kw in conditions.items():
    try:
        got[name] = timed(**kw)
    except Exception as exc:  # the other conditions still count
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
for name, fn in extra.items():
    try:
        got[name] = fn()
    except Exception as exc:
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
print(json.dumps(got))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", type=int, nargs="+", default=[32, 128, 1024])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("plane_bandwidth.py: needs a CUDA device", file=sys.stderr)
        return 2
    from cuda_agent.judge.cudaipc import SharedGpuBuffer

    rows = []
    for mb in args.sizes_mb:
        nbytes = mb << 20
        buf = SharedGpuBuffer.create(nbytes)
        buf.tensor.random_(0, 255)
        torch.cuda.synchronize()
        res = subprocess.run([sys.executable, "-c", CHILD, buf.handle.hex(), str(nbytes), str(args.runs)],
                             capture_output=True, text=True, timeout=300)
        buf.close()
        if res.returncode != 0:
            print(f"{mb} MB: child failed: {res.stderr.strip()[-500:]}", file=sys.stderr)
            return 1
        if res.stderr.strip():
            print(f"{mb} MB: {res.stderr.strip()[-800:]}", file=sys.stderr)
        got = json.loads(res.stdout.strip().splitlines()[-1])
        own_ms, shared_ms = got["own"]["events_ms"], got["shared"]["events_ms"]
        row = {"mb": mb, "shared_ms": shared_ms, "own_ms": own_ms, "ratio": shared_ms / own_ms,
               "own_gbps": 2 * nbytes / own_ms / 1e6, "conditions": got}
        rows.append(row)
        print(f"{mb:6d} MB  y = 2x reading the shared mapping {shared_ms:.4f} ms, own memory "
              f"{own_ms:.4f} ms ({row['own_gbps']:.0f} GB/s): ratio {row['ratio']:.3f}")
        for name, r in got.items():
            print(f"         {name:18s} " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in r.items()))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print(f"median ratio {statistics.median(r['ratio'] for r in rows):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
