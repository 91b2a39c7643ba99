"""Is GPU memory the judge shares with the candidate (CUDA IPC) as fast to stream as the
candidate's own?

The judge writes each call's inputs into memory it allocated and the candidate process mapped
(`cuda_agent/judge/cudaipc.py`). If a kernel reads that mapping more slowly than memory its own
process allocated (other page sizes, other TLB reach), memory-bound candidates and their eager
baselines are timed slower than Nsight Compute times the same kernels in one process. This script
measures it: a child process maps the parent's buffer and times a streaming copy (`y.copy_(x)`,
L2 emptied before each call by reading a buffer twice its size, CUDA events around the copy),
with `x` in the shared mapping or in the child's own memory, at several sizes.

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
out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
l2 = torch.cuda.get_device_properties(0).L2_cache_size
cold = torch.ones(2 * l2 // 4, device="cuda")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

def timed(src):
    times = []
    for _ in range(runs + 3):
        cold.sum()
        torch.cuda.synchronize()
        start.record()
        out.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[3:])

print(json.dumps({"shared": timed(shared), "own": timed(own)}))
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
        got = json.loads(res.stdout.strip().splitlines()[-1])
        row = {"mb": mb, "shared_ms": got["shared"], "own_ms": got["own"], "ratio": got["shared"] / got["own"],
               "own_gbps": 2 * nbytes / got["own"] / 1e6}
        rows.append(row)
        print(f"{mb:6d} MB  copy from the shared mapping {row['shared_ms']:.4f} ms, from own memory "
              f"{row['own_ms']:.4f} ms ({row['own_gbps']:.0f} GB/s): ratio {row['ratio']:.3f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print(f"median ratio {statistics.median(r['ratio'] for r in rows):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
