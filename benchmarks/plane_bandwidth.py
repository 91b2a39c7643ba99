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

And whether the judge's way of starting a process slows it: `--spawn` starts the child also with
only the sandbox's environment, in the judge's sandbox as root, and with the uid drop too, and
re-runs two conditions after installing the candidate's seccomp filter.

    python benchmarks/plane_bandwidth.py [--sizes-mb 128 1024] [--runs 20] [--out FILE]
        [--spawn plain env sandbox-root sandbox]
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
only = set(sys.argv[4].split(",")) if len(sys.argv) > 4 and sys.argv[4] != "all" else None
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
# __EW_PROBE__

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
    if only is not None and name not in only:
        continue
    try:
        got[name] = timed(**kw)
    except Exception as exc:  # the other conditions still count
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
for name, fn in extra.items():
    if only is not None and name not in only:
        continue
    try:
        got[name] = fn()
    except Exception as exc:
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
if only is not None and "seccomp" in only:
    # the candidate's seccomp filter, as the worker installs it before any candidate code: does a
    # kernel stream slower once the process is filtered?
    from cuda_agent.judge.sandbox import install_seccomp
    got["seccomp_installed"] = {"ok": float(install_seccomp())}
    for name in ("shared", "ew_shared_gated"):
        try:
            got[name + "_after_seccomp"] = timed(**conditions[name]) if name in conditions else extra[name]()
        except Exception as exc:
            print(f"{name} after seccomp: {type(exc).__name__}: {exc}", file=sys.stderr)
print(json.dumps(got))
"""


sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_check import EW_PROBE  # noqa: E402  (the probes' one copy of timing_check's kernel)

CHILD = CHILD.replace("# __EW_PROBE__\n", EW_PROBE)
SPAWNS = ("plain", "env", "sandbox-root", "sandbox")
# what the other ways of starting the child compare (the first two and the seccomp re-run)
SPAWN_CONDITIONS = "shared,ew_shared_gated,ew_shared_poisoned_gated,seccomp"


def run_child(how: str, child_args: list[str], timeout: float) -> tuple[int, str, str]:
    """The child started as `how`: 'plain' (this process's environment), 'env' (the environment a
    judge's sandboxed process gets, nothing else), 'sandbox-root' (the judge's sandbox: its
    environment, namespaces, private file-system view, pids cgroup and rlimits, as root) or
    'sandbox' (the same with the uid drop, as the judge starts a candidate's worker)."""
    if how == "plain":
        res = subprocess.run([sys.executable, "-c", CHILD, *child_args], capture_output=True, text=True,
                             timeout=timeout)
        return res.returncode, res.stdout, res.stderr
    import tempfile

    from cuda_agent import host
    from cuda_agent.judge.sandbox import SandboxSpec, Sandboxed, is_root, new_workdir, sandbox_env, work_root_dir

    if how == "env":
        with tempfile.TemporaryDirectory() as home:
            res = subprocess.run([sys.executable, "-I", "-c", CHILD, *child_args], capture_output=True, text=True,
                                 timeout=timeout, env=sandbox_env(Path(home)), cwd=home)
        return res.returncode, res.stdout, res.stderr
    if not is_root():
        return 2, "", f"{how}: the judge's sandbox spawn needs root here"
    uid = host.JUDGE_UIDS.start + 999 if how == "sandbox" else None
    spec = SandboxSpec(argv=[sys.executable, "-I", "-c", CHILD, *child_args],
                       workdir=new_workdir(work_root_dir() / "runs", "planebw-"), uid=uid)
    proc = Sandboxed(spec)
    try:
        rc = proc.proc.wait(timeout=timeout)
        text = proc.log_path.read_text(errors="replace")
    finally:
        proc.kill()
        proc.cleanup()
    lines = text.splitlines()
    out = [ln for ln in lines if ln.startswith("{")]
    return rc, "\n".join(out), "\n".join(ln for ln in lines if not ln.startswith("{"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", type=int, nargs="+", default=[32, 128, 1024])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", type=Path)
    p.add_argument("--spawn", nargs="+", choices=SPAWNS, default=["plain"],
                   help="how the child is started: 'plain' runs every condition; the others (the sandbox's "
                        "environment only, the judge's sandbox as root, the same with the uid drop) run the "
                        f"ones that tell them apart ({SPAWN_CONDITIONS}: the last re-runs two of them after "
                        "installing the candidate's seccomp filter)")
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
        for how in args.spawn:
            which = "all" if how == "plain" else SPAWN_CONDITIONS
            rc, stdout, stderr = run_child(how, [buf.handle.hex(), str(nbytes), str(args.runs), which], 300)
            if rc != 0 or not stdout.strip():
                print(f"{mb} MB ({how}): child failed (exit {rc}): {stderr.strip()[-500:]}", file=sys.stderr)
                continue
            if stderr.strip():
                print(f"{mb} MB ({how}): {stderr.strip()[-800:]}", file=sys.stderr)
            got = json.loads(stdout.strip().splitlines()[-1])
            row = {"mb": mb, "spawn": how, "conditions": got}
            if "own" in got and "shared" in got:
                own_ms, shared_ms = got["own"]["events_ms"], got["shared"]["events_ms"]
                row.update(shared_ms=shared_ms, own_ms=own_ms, ratio=shared_ms / own_ms,
                           own_gbps=2 * nbytes / own_ms / 1e6)
                print(f"{mb:6d} MB  y = 2x reading the shared mapping {shared_ms:.4f} ms, own memory "
                      f"{own_ms:.4f} ms ({row['own_gbps']:.0f} GB/s): ratio {row['ratio']:.3f}")
            rows.append(row)
            print(f"{mb:6d} MB  child started {how}:")
            for name, r in got.items():
                print(f"         {name:28s} " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                                         for k, v in r.items()))
        buf.close()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if ratios:
        print(f"median ratio {statistics.median(ratios):.3f}")
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
