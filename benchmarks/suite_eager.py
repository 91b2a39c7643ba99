"""Eager (and optionally torch.compile) runtime of every bundled suite task on one device.

    python benchmarks/suite_eager.py                      # CUDA suite on the current GPU
    python benchmarks/suite_eager.py --compile            # also time torch.compile(model)
    python benchmarks/suite_eager.py --suite cpu --device cpu
    python benchmarks/suite_eager.py --filter Softmax --filter GELU --iters 20

Each task is built from its own source (seeded), its inputs are made on the CPU by `get_inputs()`
and moved to the device, then the forward pass is warmed up and timed call by call (CUDA events on
a GPU, a wall clock on the CPU); the median is reported. Tasks whose eager median falls outside the
target window (1-100 ms for the cuda suite, 0.2-20 ms for the cpu suite) are flagged. A task that fails is reported and the rest still run.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def find_suite_dir() -> Path:
    try:
        from cuda_agent.suite import suite_dir

        return suite_dir()
    except ImportError:
        return REPO / "src" / "cuda_agent" / "suite"


def natural_key(path: Path) -> tuple:
    head = path.stem.split("_", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, path.stem)


def task_files(suite: str, levels: list[int] | None, filters: list[str]) -> list[tuple[int | None, Path]]:
    root = find_suite_dir()
    found: list[tuple[int | None, Path]] = []
    if suite == "cuda":
        for level_dir in sorted((root / "cuda").glob("level*")):
            level = int(level_dir.name[5:]) if level_dir.name[5:].isdigit() else None
            for path in sorted(level_dir.glob("*.py"), key=natural_key):
                found.append((level, path))
    else:
        for path in sorted((root / "cpu").glob("*.py"), key=natural_key):
            level = None
            for line in path.read_text().splitlines()[:5]:
                if line.replace(" ", "").startswith("#level:"):
                    level = int(line.split(":", 1)[1])
            found.append((level, path))
    found = [(lv, p) for lv, p in found if not p.name.startswith("_")]
    if levels:
        found = [(lv, p) for lv, p in found if lv in levels]
    if filters:
        found = [(lv, p) for lv, p in found if any(f.lower() in p.stem.lower() for f in filters)]
    found.sort(key=lambda item: (item[0] or 0, natural_key(item[1])))
    return found


def load_namespace(path: Path) -> dict:
    namespace = {"__name__": f"suite_task_{path.stem}", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    for required in ("Model", "get_inputs", "get_init_inputs"):
        if required not in namespace:
            raise RuntimeError(f"{path.name}: missing {required}")
    return namespace


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, inputs, device: torch.device, warmup: int, iters: int) -> list[float]:
    """Per-call times in ms after `warmup` untimed calls."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*inputs)
        synchronize(device)
        times = []
        for _ in range(iters):
            if device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*inputs)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn(*inputs)
                times.append((time.perf_counter() - t0) * 1e3)
    return times


def fmt(ms: float | None) -> str:
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return "-"
    return f"{ms:.3f}" if ms < 10 else f"{ms:.2f}"


def bench_task(path: Path, device: torch.device, args) -> dict:
    row: dict = {"eager": None, "eager_min": None, "compiled": None, "in_mb": None, "error": "", "note": ""}
    namespace = load_namespace(path)
    torch.manual_seed(args.seed)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    torch.manual_seed(args.seed + 1)
    if args.inputs_on_device:  # the factories in get_inputs() allocate on the device directly (faster)
        with device:
            inputs = list(namespace["get_inputs"]())
    else:
        inputs = namespace["get_inputs"]()
    row["in_mb"] = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor)) / 1e6
    model = model.to(device)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    synchronize(device)
    try:
        times = time_calls(model, inputs, device, args.warmup, args.iters)
        row["eager"] = statistics.median(times)
        row["eager_min"] = min(times)
    except Exception as exc:  # noqa: BLE001 - one task's failure must not stop the table
        row["error"] = f"eager: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        if args.verbose:
            traceback.print_exc()
    if args.compile and not row["error"]:
        try:
            compiled = torch.compile(model, mode=args.compile_mode)
            times = time_calls(compiled, inputs, device, max(args.warmup, 3), args.iters)
            row["compiled"] = statistics.median(times)
        except Exception as exc:  # noqa: BLE001
            row["note"] = f"compile: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
            if args.verbose:
                traceback.print_exc()
        finally:
            torch._dynamo.reset()
    del model, inputs
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--suite", choices=("cuda", "cpu"), default=None,
                        help="which task set (default: cuda tasks on a GPU, cpu variants on the CPU)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile(model)")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. max-autotune")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level", type=int, action="append", dest="levels", help="only these levels")
    parser.add_argument("--filter", action="append", default=[], help="only tasks whose name contains this")
    parser.add_argument("--tf32", choices=("default", "on", "off"), default="default",
                        help="TF32 for matmul and cuDNN: leave torch's defaults, force on or force off")
    parser.add_argument("--min-ms", type=float, default=None,
                        help="flag tasks faster than this (default 1 for the cuda suite, 0.2 for the cpu suite)")
    parser.add_argument("--max-ms", type=float, default=None,
                        help="flag tasks slower than this (default 100 for the cuda suite, 20 for the cpu suite)")
    parser.add_argument("--inputs-on-device", action="store_true",
                        help="create the inputs directly on the device (get_inputs() under a device context) "
                             "instead of on the CPU and copying them; much faster for multi-GB inputs")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the CPU")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    suite = args.suite or ("cuda" if device.type == "cuda" else "cpu")
    if args.min_ms is None:
        args.min_ms = 1.0 if suite == "cuda" else 0.2
    if args.max_ms is None:
        args.max_ms = 100.0 if suite == "cuda" else 20.0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tf32 != "default":
        on = args.tf32 == "on"
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"# device {name}; torch {torch.__version__}; suite {suite}; warmup {args.warmup}, iters {args.iters}; "
          f"tf32 matmul={torch.backends.cuda.matmul.allow_tf32} cudnn={torch.backends.cudnn.allow_tf32}")

    files = task_files(suite, args.levels, args.filter)
    if not files:
        print("no tasks matched", file=sys.stderr)
        return 2
    header = f"{'task':44s} {'lvl':>3s} {'in MB':>9s} {'eager ms':>9s} {'min ms':>9s}"
    if args.compile:
        header += f" {'compile ms':>10s} {'speedup':>7s}"
    print(header + "  flag")
    flagged = failed = 0
    for level, path in files:
        t0 = time.perf_counter()
        try:
            row = bench_task(path, device, args)
        except Exception as exc:  # noqa: BLE001 - setup failed (import, constructor, inputs, OOM)
            row = {"eager": None, "eager_min": None, "compiled": None, "in_mb": None,
                   "error": f"setup: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}",
                   "note": ""}
            if args.verbose:
                traceback.print_exc()
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        flag = ""
        if row["error"]:
            flag, failed = "ERROR " + row["error"], failed + 1
        elif row["eager"] < args.min_ms:
            flag, flagged = f"FAST (< {args.min_ms:g} ms)", flagged + 1
        elif row["eager"] > args.max_ms:
            flag, flagged = f"SLOW (> {args.max_ms:g} ms)", flagged + 1
        if row["note"]:
            flag = (flag + "; " if flag else "") + row["note"]
        in_mb = f"{row['in_mb']:.1f}" if row["in_mb"] is not None else "-"
        line = f"{path.stem:44s} {level if level is not None else '-':>3} {in_mb:>9s} {fmt(row['eager']):>9s} {fmt(row['eager_min']):>9s}"
        if args.compile:
            speedup = (f"{row['eager'] / row['compiled']:.2f}x" if row["eager"] and row["compiled"] else "-")
            line += f" {fmt(row['compiled']):>10s} {speedup:>7s}"
        print(f"{line}  {flag}  [{time.perf_counter() - t0:.0f}s]", flush=True)
    print(f"# {len(files)} tasks, {flagged} outside {args.min_ms:g}-{args.max_ms:g} ms, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
