"""How long a judge worker takes to get ready, phase by phase, in a fresh interpreter.

A CUDA judge starts its workers ahead of need ("spares", JudgeConfig.spares): when evaluations come
back to back faster than a worker gets ready, the judge waits for one. This measures what a spare
does before it can take a task, the way the worker does it (cuda_agent.judge.worker):

    interpreter  python start and `import torch`
    cuda         torch.cuda.init() and a first allocation (the GPU context)
    profiler     the first CUDA profiler session (CUPTI start-up), used by the recorded calls
    dispatch     the first dispatch mode (used by the recorded calls too)
    profiler2    a second profiler session, as a recorded call pays it once warm

    python benchmarks/worker_start.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
t0 = float(sys.argv[1])
marks = {}
import torch
marks["interpreter"] = time.time() - t0
t = time.time(); torch.cuda.init(); torch.cuda.set_device(0); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
marks["cuda"] = time.time() - t
from cuda_agent.judge.worker import _warm_profiler, warm_dispatch
t = time.time(); _warm_profiler(torch); marks["profiler"] = time.time() - t
t = time.time(); warm_dispatch(torch); marks["dispatch"] = time.time() - t
from torch.profiler import ProfilerActivity, profile
t = time.time()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    torch.ones(1 << 20, device="cuda").mul_(2); torch.cuda.synchronize()
_ = {e.name for e in prof.events()}  # as the worker reads them
marks["profiler2"] = time.time() - t
print(json.dumps(marks))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the runs as JSON here")
    args = ap.parse_args()
    runs = []
    for _ in range(args.runs):
        t0 = time.time()
        res = subprocess.run([sys.executable, "-c", CHILD, repr(t0)], capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            print(res.stderr[-2000:], file=sys.stderr)
            return 1
        marks = json.loads(res.stdout.strip().splitlines()[-1])
        marks["total"] = time.time() - t0
        runs.append(marks)
        print("  " + " ".join(f"{k}={v:.2f}" for k, v in marks.items()))
    print("median: " + " ".join(f"{k}={statistics.median(r[k] for r in runs):.2f}" for k in runs[0]))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(runs, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
