"""Does the history of the GPU's memory slow a memory-bound kernel in a new process?

The judge's runtime of a 1 GB elementwise kernel (timing_check's ew-256M) is ~20% over Nsight
Compute's, and the same kernel in a plain process beside the judge is slowed once the judge's
process has freed memory (`judge_replica.py`: conditions `frees`, `bare` after `empty_cache`). One
explanation is the physical placement of the kernel's buffers: memory freed in scattered pieces
leaves a new allocation backed by scattered pages, and a streaming kernel then misses the GPU's
address translation caches more often. This script tests that without the judge: a child process
allocates x and y (BYTES each) and times `y = 2x` (CUDA events, L2 emptied before each call,
median of RUNS), after a helper process has:

- `fresh`: done nothing;
- `holes`: allocated HELD_GB in blocks of BLOCK_MB, freed every other block, and still holds the rest
  (the free memory is a comb of holes);
- `holes_exited`: done the same and exited (everything freed again);
- `churn`: allocated and freed 4 GB per call while the child's calls ran (as a busy neighbour);
- `reserve_after_holes`: the comb of holes as in `holes`, but the child first reserves one block of
  2 x BYTES + 1 GB and builds x and y inside it (one allocation: is one large request placed better
  than two?).

    python benchmarks/gpu_fragmentation.py [--mb 1024] [--runs 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, statistics, sys, torch
nbytes, runs, reserve = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
n = nbytes // 4
if reserve:
    block = torch.empty(2 * n + (1 << 28), dtype=torch.float32, device="cuda")
    x, y = block[:n], block[n:2 * n]
else:
    x = torch.empty(n, dtype=torch.float32, device="cuda")
    y = torch.empty(n, dtype=torch.float32, device="cuda")
x.normal_()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
cold = torch.ones(2 * l2 // 4, device="cuda")
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
times = []
for i in range(runs + 3):
    cold.mul_(1.0)
    s.record(); torch.mul(x, 2.0, out=y); e.record(); e.synchronize()
    if i >= 3:
        times.append(s.elapsed_time(e))
print(json.dumps({"median_ms": statistics.median(times), "min_ms": min(times)}))
"""

HELPER = r"""
import sys, time, torch
mode, held_gb, block_mb = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
if mode == "churn":
    print("ready", flush=True)
    end = time.time() + float(sys.argv[4])
    while time.time() < end:
        t = torch.empty(1 << 30, dtype=torch.float32, device="cuda"); t.fill_(1); torch.cuda.synchronize()
        del t; torch.cuda.empty_cache()
    sys.exit(0)
nblk = int(held_gb * 1024 // block_mb)
blocks = [torch.empty(block_mb << 20, dtype=torch.uint8, device="cuda") for _ in range(nblk)]
del blocks[::2]
torch.cuda.synchronize()
print("ready", flush=True)
if mode == "holes_exited":
    sys.exit(0)
sys.stdin.readline()
"""


def child(nbytes: int, runs: int, reserve: bool = False) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(nbytes), str(runs), "1" if reserve else "0"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode:
        return {"error": out.stderr.strip()[-400:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def helper(mode: str, held_gb: float, block_mb: int, seconds: float = 0) -> subprocess.Popen:
    # without the caching allocator each block is its own cudaMalloc, so freeing one frees it on the GPU
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"} if mode != "churn" else {}
    p = subprocess.Popen([sys.executable, "-c", HELPER, mode, str(held_gb), str(block_mb), str(seconds)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
    assert p.stdout.readline().strip() == "ready"
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of x and of y, MiB")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--held-gb", type=float, default=16.0, help="memory the helper allocates in blocks")
    ap.add_argument("--block-mb", type=int, default=2, help="block size of the helper's allocations")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    nbytes = args.mb << 20
    rows = []

    def row(name, r):
        r = {"condition": name, **r}
        rows.append(r)
        print(f"{name:22s} " + (f"{r['median_ms']:.4f} ms (min {r['min_ms']:.4f})" if "median_ms" in r else r["error"]),
              flush=True)

    row("fresh", child(nbytes, args.runs))
    h = helper("holes", args.held_gb, args.block_mb)
    row("holes", child(nbytes, args.runs))
    row("reserve_after_holes", child(nbytes, args.runs, reserve=True))
    h.communicate("\n", timeout=60)
    row("fresh_again", child(nbytes, args.runs))
    h = helper("holes_exited", args.held_gb, args.block_mb)
    h.wait(timeout=60)
    row("holes_exited", child(nbytes, args.runs))
    h = helper("churn", 0, 0, seconds=30)
    t0 = time.time()
    row("churn", child(nbytes, args.runs))
    h.wait(timeout=60)
    row("after_churn", child(nbytes, args.runs))
    print(f"(churn child took {time.time() - t0:.1f} s)")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
