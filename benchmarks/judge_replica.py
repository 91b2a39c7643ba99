"""Which part of a judge's call cycle slows a memory-bound kernel in the candidate's process?

Inside the judge, timing_check's 1 GB elementwise kernel runs 0.645 ms by CUDA's own activity
records; the same kernel in a plain process takes 0.54 ms, as Nsight Compute says, whether that
process reads the judge's shared GPU memory or its own, runs in the judge's sandbox or not, and
whatever the idle gaps between calls (plane_bandwidth.py, clock_ramp.py). What a plain process
does not do is the rest of the judge's cycle around each call. This script plays that cycle with two
plain processes, a "judge" and a "worker" sharing a GPU buffer as the judge and its candidate
process do, adding one part at a time:

- `bare`: the worker flushes the L2 and times the kernel behind the judge's gate (CallTimer) on
  the same inputs every call;
- `judge_writes`: before each call the judge draws fresh inputs and copies them into the shared
  buffer from its own CUDA context, then tells the worker to go (as `pack` does);
- `worker_writes`: the same inputs written by the worker itself, after its flush;
- `out_alive`: `judge_writes`, with the worker's last output still alive while the next is made
  (the judge's worker keeps it until the next call returns);
- `packed`: `out_alive`, and after the call the worker copies its output into the shared buffer;
- `judged`: `packed`, and the judge runs the reference on the inputs before the call and compares
  the output after it, in its own context (the judge's whole cycle);
- `judged_profiled`: `judged` with the profiler's CUDA activity around each call (checked calls).

With `--judge-build`, the same kernel as the judge builds it (timing_check's workspace, nvcc, the
binding) instead of NVRTC's, `bare` and `judged` (`so_bare`, `so_judged`), then with the judge's
operator observer installed in the worker (`observer_so_bare`, `observer_so_judged`), then also
the rest of a worker's set-up (a spare's profiler warm-up and dispatch-mode warm-up, true fp32:
`setup_so_bare`, `setup_so_judged`), then also the allocator's poisoned block before each call (the
judge's `prepare`: a block of the output's size filled with 0xFF and freed, so the output lands in it;
`poison_so_judged`), then also the judge's data plane in the worker (a host mapping of the
calls' size whose last page is registered with CUDA, the gate built on it as the worker builds it:
`control_so_bare`, `control_so_judged`). `frees`: `bare`, and before each call this script's own
process allocates, writes and frees (`empty_cache`) 4 GB of GPU memory, as a judge that drops its
cache would. `--conditions` runs some of them only.

`--beside-judge`: is the slowdown a state of the GPU while a judge lives, or of the processes the
judge starts? The `bare` condition in this script's own worker, then the real judge evaluates
timing_check's 1 GB workspace candidate (its runtime and its kernels' CUDA activity time), then,
with that judge still alive and idle, `bare` again in the same worker and in a second plain
worker started now (its memory allocated while the judge holds its own), again after the judge's
process drops its cached GPU memory, and once more after the judge is closed.

    python benchmarks/judge_replica.py [--mb 1024] [--runs 15] [--judge-build] [--out FILE]
    python benchmarks/judge_replica.py --beside-judge [--conditions bare] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_check import EW_PROBE, workspace  # noqa: E402  (timing_check's kernel and workspace)

CONDITIONS = ("bare", "judge_writes", "worker_writes", "out_alive", "packed", "judged", "judged_profiled", "frees")
BUILT = ("so_bare", "so_judged", "observer_so_bare", "observer_so_judged", "setup_so_bare", "setup_so_judged",
         "poison_so_judged", "control_so_bare", "control_so_judged")
# what each prefix of a built condition has loaded in the worker, in order: the judge's build, its
# operator observer, a worker's set-up
LAYERS = {"so_": 1, "observer_": 2, "setup_": 3, "poison_": 3, "control_": 4}

WORKER = r"""
import json, socket, sys, torch
from cuda_agent.judge.cudaipc import SharedGpuBuffer
from cuda_agent.judge.timing import CallTimer
torch.cuda.init()
fd, handle, nbytes = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
sock = socket.socket(fileno=fd)
f = sock.makefile("rw")
shared = SharedGpuBuffer.open(handle, 2 * nbytes).tensor
n = nbytes // 4
x = shared[:nbytes].view(torch.float32)
out_region = shared[nbytes:].view(torch.float32)
l2 = torch.cuda.get_device_properties(0).L2_cache_size
cold = torch.ones(2 * l2 // 4, device="cuda")
own_inputs = torch.randn(n, device="cuda")
# __EW_PROBE__
timer = CallTimer("cuda")
last = None
ext = None
for line in f:
    msg = json.loads(line)
    if msg["op"] == "exit":
        break
    if msg["op"] == "load":
        import importlib.util
        def load(name, path):
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); return mod
        if msg.get("library"):
            ext = load("cuda_extension", msg["library"])
        if msg.get("observer"):
            from cuda_agent.judge import observer as obs
            load(obs.MODULE, msg["observer"]).install(obs.new_token())
        if msg.get("setup"):
            from cuda_agent.host import true_fp32
            from cuda_agent.judge.worker import _warm_profiler, warm_dispatch
            _warm_profiler(torch); warm_dispatch(torch); true_fp32(torch)
        if msg.get("control"):
            from cuda_agent.judge.protocol import DataPlane
            plane = DataPlane.create(nbytes, nbytes)
            timer = CallTimer("cuda", control_address=plane.control_address())
        f.write("{}\n"); f.flush()
        continue
    if msg["op"] == "prepare":
        if msg.get("poison"):
            poisoned = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda")
            del poisoned
        if msg.get("worker_writes"):
            cold.sum(); torch.cuda.synchronize()
            x.copy_(own_inputs)
        else:
            cold.sum()
        torch.cuda.synchronize()
        f.write("{}\n"); f.flush()
        continue
    # call
    prof = None
    if msg.get("profiled"):
        from torch.profiler import ProfilerActivity, profile
        prof = profile(activities=[ProfilerActivity.CUDA]); prof.__enter__()
    keep = last if msg.get("out_alive") else None
    last = None
    timer.start()
    if msg.get("so"):
        y = ext.scale_shift_forward(x)
    else:
        y = torch.empty_like(x)
        ew_call(x, y)
    ms = timer.stop()
    if prof is not None:
        prof.__exit__(None, None, None)
    if msg.get("pack"):
        out_region.copy_(y)
        torch.cuda.synchronize()
    last = y
    del keep
    f.write(json.dumps({"ms": ms}) + "\n"); f.flush()
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=1024)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--judge-build", action="store_true",
                   help="also the kernel as the judge builds it, then with the judge's observer in the worker")
    p.add_argument("--conditions", nargs="+", choices=CONDITIONS + BUILT, metavar="CONDITION",
                   help="only these (default: all; the built ones need --judge-build)")
    p.add_argument("--beside-judge", action="store_true",
                   help="then `bare` again beside a live judge that has just judged the same kernel (see above)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("judge_replica.py: needs a CUDA device", file=sys.stderr)
        return 2
    from cuda_agent.judge.cudaipc import SharedGpuBuffer

    nbytes = args.mb << 20
    buf = SharedGpuBuffer.create(2 * nbytes)
    region = buf.tensor[:nbytes].view(torch.float32)
    out_region = buf.tensor[nbytes:].view(torch.float32)
    region.copy_(torch.randn(nbytes // 4, device="cuda"))
    torch.cuda.synchronize()
    source = WORKER.replace("# __EW_PROBE__\n", EW_PROBE)

    def start_worker():
        mine, theirs = socket.socketpair()
        child = subprocess.Popen([sys.executable, "-c", source, str(theirs.fileno()), buf.handle.hex(), str(nbytes)],
                                 pass_fds=(theirs.fileno(),))
        theirs.close()
        return child, mine.makefile("rw")

    def stop_worker(child, f) -> None:
        try:
            f.write(json.dumps({"op": "exit"}) + "\n")
            f.flush()
        except OSError:
            pass
        child.wait(timeout=60)

    child, f = start_worker()

    def ask(msg: dict, f=f) -> dict:
        f.write(json.dumps(msg) + "\n")
        f.flush()
        return json.loads(f.readline())

    def row_of(label: str, times: list[float], width: int = 16) -> dict:
        """A condition's median and minimum, the first 3 calls (warm-up) left out; printed as it ends."""
        row = {"condition": label, "ms": statistics.median(times[3:]), "min_ms": min(times[3:])}
        print(f"{label:{width}s} {row['ms']:.4f} ms (min {row['min_ms']:.4f})", flush=True)
        return row

    def bare(label: str, f=f) -> dict:
        """The `bare` condition: the worker's own flush, the same inputs every call."""
        times = []
        for _ in range(args.runs + 3):
            ask({"op": "prepare"}, f)
            times.append(ask({"op": "call"}, f)["ms"])
        return row_of(label, times, 34)

    library = observer = None
    if args.judge_build:
        import tempfile

        from cuda_agent.candidate import Candidate
        from cuda_agent.judge import Judge, JudgeConfig
        from cuda_agent.judge.build import workspace_spec

        with Judge(JudgeConfig(device="cuda", compile_mode="none", spares=0)) as judge:
            ws = workspace(Path(tempfile.mkdtemp(prefix="replica-")), "ew")
            library = str(judge.builder.build(workspace_spec(Candidate.from_path(ws).kernels, "ws:timing-ew",
                                                             "cuda")).library)
            observer = str(judge.builds.observer_library())

    rows = []
    try:
        loaded = 0
        for cond in CONDITIONS + (BUILT if library else ()):
            if args.conditions and cond not in args.conditions:
                continue
            layer = next((n for prefix, n in LAYERS.items() if cond.startswith(prefix)), 0)
            for step, what in ((1, {"library": library}), (2, {"observer": observer}), (3, {"setup": True}),
                               (4, {"control": True})):
                if loaded < step <= layer:
                    ask({"op": "load", **what})
                    loaded = step
            base = cond.removeprefix("control_").removeprefix("poison_").removeprefix("setup_").removeprefix("observer_").removeprefix("so_")
            writes = base not in ("bare", "worker_writes", "frees")
            flags = {"out_alive": base in ("out_alive", "packed", "judged", "judged_profiled"),
                     "pack": base in ("packed", "judged", "judged_profiled"),
                     "profiled": base == "judged_profiled", "so": layer > 0}
            judged = base in ("judged", "judged_profiled")
            times = []
            for _ in range(args.runs + 3):
                expected = None
                fresh = torch.randn(nbytes // 4, device="cuda") if writes else None
                if judged:
                    expected = fresh * 2.0 + 1.0
                    _ = fresh.double() * 2.0 + 1.0  # the float64 reference of the checked calls
                if cond == "frees":
                    churn = torch.ones((4 << 30) // 4, device="cuda")
                    del churn
                    torch.cuda.empty_cache()
                torch.cuda.synchronize()
                ask({"op": "prepare", "worker_writes": cond == "worker_writes", "poison": cond.startswith("poison_")})
                if writes:
                    region.copy_(fresh)
                    torch.cuda.synchronize()  # in place before the worker hears of them
                got = ask({"op": "call", **flags})
                times.append(got["ms"])
                if judged:
                    assert torch.allclose(out_region, expected)
                del fresh, expected
            rows.append(row_of(cond, times))
        if args.beside_judge:
            rows += beside_judge(args, bare, start_worker, stop_worker)
    finally:
        stop_worker(child, f)
        buf.close()
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "mb": args.mb, "rows": rows},
                                       indent=1))
    return 0


def beside_judge(args, bare, start_worker, stop_worker) -> list[dict]:
    """`--beside-judge`: `bare` before, beside and after a live judge (see the module's text)."""
    import tempfile

    import torch

    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.tasks import load_task_file
    from timing_check import ew_task, markers

    tmp = Path(tempfile.mkdtemp(prefix="replica-judge-"))
    task_file = tmp / "task_ew.py"
    task_file.write_text(ew_task((args.mb << 20) // 4))
    ws = workspace(tmp, "ew")
    rows = [bare("before the judge")]
    second = None
    with Judge(JudgeConfig(device="cuda", compile_mode="none")) as judge:
        v = judge.evaluate(load_task_file(task_file), Candidate.from_path(ws))
        row = {"condition": "the judge's verdict", "ms": v.runtime.median_ms if v.runtime else None,
               "min_ms": v.runtime.min_ms if v.runtime else None, "correct": v.correct, **markers(v.calls),
               "failure": v.failure.message[:300] if v.failure else None}
        print(f"{row['condition']:34s} {row['ms']} ms (min {row['min_ms']}) kernel_ms={row['kernel_ms']} "
              f"stream_ms={row['stream_ms']} correct={v.correct} {row['failure'] or ''}", flush=True)
        rows.append(row)
        rows.append(bare("beside the live judge"))
        second = start_worker()
        rows.append(bare("a worker started beside the judge", f=second[1]))
        torch.cuda.empty_cache()  # this process's: the judge's references and checks
        rows.append(bare("after the judge's process freed its cache"))
        rows.append(bare("(second worker)", f=second[1]))
    rows.append(bare("after the judge closed"))
    rows.append(bare("(second worker) after the judge closed", f=second[1]))
    stop_worker(*second)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
