"""The trusted runner of one published solution, outside the judge, run under Nsight Compute by
`cuda-agent fidelity --ncu-sample K`:

    python -m cuda_agent.fidelity.ncu_runner PROBLEM.py SOLUTION.py [--forwards 3] [--device cuda] [--build-only]

It imports nothing of the project: ncu profiles this process, and only the solution's kernels
should be in it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Trusted runner of one published solution, outside the judge (run under ncu):
    build ModelNew from the reference's init inputs, then run forwards, each between
    cudaProfilerStart/Stop with L2 flushed before it, so ncu sees the forwards' kernels only."""
    p = argparse.ArgumentParser(prog="python -m cuda_agent.fidelity.ncu_runner")
    p.add_argument("problem", type=Path)
    p.add_argument("solution", type=Path)
    p.add_argument("--forwards", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--build-only", action="store_true",
                   help="build the solution's extensions and construct ModelNew, run no forward")
    args = p.parse_args(argv)
    import torch

    device = torch.device(args.device)
    ns: dict = {"__name__": "reference"}
    exec(compile(args.problem.read_text(), str(args.problem), "exec"), ns)
    # KernelBench runs a solution with the reference's globals in reach (sizes, helper names).
    sol = dict(ns, __name__="solution")
    exec(compile(args.solution.read_text(), str(args.solution), "exec"), sol)
    torch.manual_seed(args.seed)
    init = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ns["get_init_inputs"]()]
    # in the mode the judge (and KernelBench) runs it: as constructed, training mode, under no_grad;
    # eval() would switch a BatchNorm solution to its running statistics, another kernel
    model = sol["ModelNew"](*init).to(device)
    if args.build_only:
        print(json.dumps({"built": True}), file=sys.stderr)
        return 0
    torch.manual_seed(args.seed + 1)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    flush = None
    if device.type == "cuda":
        l2 = torch.cuda.get_device_properties(device).L2_cache_size or (64 << 20)
        flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device=device)
    with torch.no_grad():
        model(*inputs)  # warm-up: first-call set-up stays out of the profile
        shapes = []
        for _ in range(args.forwards):
            if flush is not None:
                flush.zero_()
                torch.cuda.synchronize(device)
                torch.cuda.profiler.start()
            out = model(*inputs)
            if flush is not None:
                torch.cuda.synchronize(device)
                torch.cuda.profiler.stop()
            outs = out if isinstance(out, (tuple, list)) else [out]
            shapes = [list(o.shape) for o in outs if isinstance(o, torch.Tensor)]
    print(json.dumps({"forwards": args.forwards, "output_shapes": shapes}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
