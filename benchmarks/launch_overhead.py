"""What the judge's launch observer (launches.cpp) costs per kernel launch, on the host and on the GPU.

Two fresh processes launch the same small kernel back to back: one with the observer subscribed
(as every CUDA worker has it), one without. Reported per launch: the host's time to enqueue
(wall clock over N launches, no synchronisation in between) and the GPU's time for the whole
stream (CUDA events), median of five repeats.

    python benchmarks/launch_overhead.py [--launches 20000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import importlib.util, json, sys, time
    import torch
    from cuda_agent.judge import launches as ln
    from cuda_agent.judge import observer as obs

    library, n = sys.argv[1], int(sys.argv[2])
    torch.cuda.init()
    if library:
        spec = importlib.util.spec_from_file_location(ln.MODULE, library)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        token = obs.new_token()
        m.install(token, ln.cupti_library(), "")
    x = torch.zeros(256, device="cuda")
    host, gpu = [], []
    for rep in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        if rep:  # the first repeat warms up
            host.append((t1 - t0) / n * 1e6)
            gpu.append(start.elapsed_time(end) / n * 1e3)
        if library:
            m.take(token)
    print(json.dumps({"host_us": host, "gpu_us": gpu}))
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=20000, help="launches per repeat")
    args = ap.parse_args()
    from cuda_agent.judge import launches as ln
    from cuda_agent.judge.build import Builder
    from cuda_agent.judge.sandbox import work_root_dir

    spec = ln.spec()
    if spec is None:
        print("no CUPTI headers where PyTorch's CUDA is: nothing to measure", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as cache:
        library = Builder(Path(cache), work_root_dir(), arch=None, timeout_s=900, uid=None).build(spec).library
        rows = {}
        for label, lib in (("without", ""), ("with", str(library))):
            res = subprocess.run([sys.executable, "-c", CHILD, lib, str(args.launches)], capture_output=True,
                                 text=True, timeout=600)
            if res.returncode != 0:
                print(res.stderr[-2000:], file=sys.stderr)
                return 1
            got = json.loads(res.stdout.strip().splitlines()[-1])
            rows[label] = {k: statistics.median(v) for k, v in got.items()}
    for label, row in rows.items():
        print(f"{label:8s} observer: host {row['host_us']:.2f} us/launch, GPU {row['gpu_us']:.2f} us/launch")
    print(f"cost: host {rows['with']['host_us'] - rows['without']['host_us']:+.2f} us/launch, "
          f"GPU {rows['with']['gpu_us'] - rows['without']['gpu_us']:+.2f} us/launch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
