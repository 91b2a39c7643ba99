"""Profile a reference (or a built candidate) with torch.profiler: the `profile` tool's table.

Run as a child process by the tools (``python -m cuda_agent.agent.profile_run ...``), with a time
limit that kills its process group. It prints input/output shapes, the median wall time of a call
and the operators (and, on CUDA, kernels) that took the time. These numbers guide the agent; the
judge's own timing is what counts.

A candidate is loaded outside the judge's sandbox, with the user's rights, like anything the
agent runs through the shell tool: this process reads nothing the judge decides with. With
`--confine` it first shuts itself in, once torch, the GPU context and the reference are set up and
before any of the candidate's code loads: no core files, bounded file size, no new privileges and
the judge's seccomp filter (no new processes, no exec, no ptrace or cross-process memory access,
no signals to other processes, local sockets only). That is how the `profile` tool runs a
candidate under Nsight Compute: ncu is started by the tool (the judge's side) and the candidate
runs confined inside the process ncu launched. Not applied there: the judge's uid drop, network and
mount namespaces and audit hook.

`--ncu` (run under `ncu --profile-from-start off`): one warm-up call, then one call between
cudaProfilerStart and cudaProfilerStop with the L2 cache flushed before it, so ncu sees exactly the
kernels of one forward from a cold cache, as the judge times it.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import sys
import time

from cuda_agent.host import true_fp32


def confine() -> None:
    """Shut this process in before the candidate's code loads (see the module docstring).
    Exits with status 4 when the seccomp filter cannot be installed: the candidate must not run."""
    import resource

    from cuda_agent.judge.sandbox import install_seccomp

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # At most 1 GiB per file, never more than the limit this process was started under (the tool
    # runner's own, which is lower): raising a hard limit is refused, and would be wrong anyway.
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    cap = 1 << 30 if hard == resource.RLIM_INFINITY else min(hard, 1 << 30)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
    if not install_seccomp():
        print("profile_run: the seccomp filter could not be installed; the candidate was not run", file=sys.stderr)
        sys.exit(4)


def _load(name: str, path: str):
    if path.endswith(".so"):
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _describe(values) -> str:
    import torch

    values = values if isinstance(values, (list, tuple)) else [values]
    parts = []
    for v in values:
        if isinstance(v, torch.Tensor):
            parts.append(f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
                         f"{'' if v.is_contiguous() else ' non-contiguous'}")
        else:
            parts.append(repr(v)[:60])
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", required=True)
    ap.add_argument("--candidate")
    ap.add_argument("--library")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rows", type=int, default=15)
    ap.add_argument("--ncu", action="store_true", help="profile one cold-cache call between profiler start/stop")
    ap.add_argument("--confine", action="store_true", help="seccomp and limits before the candidate loads")
    args = ap.parse_args(argv)

    import torch

    dev = torch.device(args.device)
    true_fp32(torch)  # the judge's numerics
    ref = _load("model", args.reference)
    init = list(ref.get_init_inputs())
    torch.manual_seed(0)
    model = ref.Model(*init)
    label = "reference Model"
    if dev.type == "cuda":
        torch.empty(1, device=dev)  # the GPU context, before any confinement
    if args.confine:
        confine()
    if args.candidate:
        if args.library:
            _load("cuda_extension", args.library)
        cand = _load("model_new", args.candidate)
        torch.manual_seed(0)
        new = cand.ModelNew(*init)
        own = new.state_dict()
        with torch.no_grad():
            for key, value in model.state_dict().items():
                if key in own and own[key].shape == value.shape and own[key].dtype == value.dtype:
                    own[key].copy_(value)
        model, label = new, "candidate ModelNew"
    model = model.to(dev).eval()
    torch.manual_seed(1)
    with torch.device(dev):
        inputs = list(ref.get_inputs())

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if args.ncu:
        if dev.type != "cuda":
            print("profile_run: --ncu needs --device cuda", file=sys.stderr)
            return 2
        l2 = torch.cuda.get_device_properties(dev).L2_cache_size or (64 << 20)
        flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device=dev)
        with torch.no_grad():
            out = model(*inputs)  # first-call set-up stays out of the profile
            flush.zero_()
            sync()
            torch.cuda.profiler.start()
            out = model(*inputs)
            sync()
            torch.cuda.profiler.stop()
        print(f"{label} profiled under Nsight Compute: one call, L2 flushed before it; outputs: {_describe(out)}")
        return 0

    with torch.no_grad():
        out = model(*inputs)
        sync()
        times = []
        for _ in range(max(3, args.iters)):
            t0 = time.perf_counter()
            model(*inputs)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if dev.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.iters):
                model(*inputs)
            sync()
    print(f"{label} on {args.device}")
    print(f"inputs:  {_describe(inputs)}")
    print(f"outputs: {_describe(out)}")
    print(f"wall time per call (warm cache, median of {len(times)}): {statistics.median(times):.3f} ms")
    sort = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    print(f"operators and kernels over {args.iters} calls, by {sort.replace('_', ' ')}:")
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    sys.exit(main())
