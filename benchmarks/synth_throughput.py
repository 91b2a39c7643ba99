"""Throughput of `cuda-agent synth`: tasks generated and filtered per hour, and the sample itself.

    python benchmarks/synth_throughput.py --n 300 --out /tmp/synth-h200              # GPU machine
    python benchmarks/synth_throughput.py --n 20 --out /tmp/synth-cpu --device cpu --min-ms 0.05 --max-ms 50
    python benchmarks/synth_throughput.py --n 300 --out /tmp/synth-h200 --judge-check      # judge in the pipeline
    python benchmarks/synth_throughput.py --n 300 --out /tmp/synth-h200 --judge-sample 300   # judge afterwards

Runs the same pipeline as the CLI (resumable: rerunning continues the sample in --out), then
prints tasks/hour and candidates/hour of this run, the per-filter rejection table, statistics of
the accepted sample (ops per task, eager and compile times, seed-source mix, nearest-benchmark
similarity) and writes them to OUT/throughput.json. The tasks stay in OUT (never in the repo).
On a machine with several GPUs the workers (and the judge processes) take them in turn; the
figure per GPU-hour is the rate divided by the GPUs used.

--judge-check runs the pipeline with `cuda-agent synth --judge-check`: every accepted task is held
to the judge's reference checks (`Judge.check_reference`: the reference loads and runs in the
judge's harness and again in an isolated process on the judge's fresh input sets, and must
reproduce the harness's outputs there), failures are rejected as `judge_reference` and replaced,
and the rate counts the judge's time. --judge-sample K runs the same checks on K exported tasks
afterwards (for a sample made without them); the judge's own task warnings (degenerate outputs)
are counted too. --benchmark-dir decontaminates against a KernelBench checkout when one is present.

The export criterion (synth/criterion.py) is on unless --no-criterion; its cost is the "criterion"
stage of check_split and `criterion_cost` (worker-seconds per accepted task, share of the check
time). --no-hazard-guards composes as before round three (no seed probe): with the same seed, the
two runs give the share of candidates rejected for non-finite, ill-conditioned or criterion reasons
before and after (`hazard_share`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))] if xs else float("nan")


def sample_stats(out: Path) -> dict:
    from cuda_agent.tasks import iter_parquet_tasks

    tasks = list(iter_parquet_tasks(out / "tasks.parquet"))
    eager = [float(t.metadata["eager_ms"]) for t in tasks if t.metadata.get("eager_ms") not in (None, "None")]
    comp = [float(t.metadata["compile_ms"]) for t in tasks if t.metadata.get("compile_ms") not in (None, "None")]
    sim = [float(t.metadata["benchmark_similarity"]) for t in tasks
           if t.metadata.get("benchmark_similarity") not in (None, "None", "")]
    ops = Counter(len(t.ops) for t in tasks)
    kinds = Counter(op.split(".")[0] if not op.startswith("torch.") else "torch" for t in tasks for op in t.ops)
    speed = [e / c for e, c in zip(eager, comp) if c > 0] if len(comp) == len(eager) else []
    return {
        "tasks": len(tasks),
        "distinct_ops": len({op for t in tasks for op in t.ops}),
        "ops_per_task": dict(sorted(ops.items())),
        "op_sources": dict(kinds.most_common()),
        "eager_ms": {"min": min(eager, default=None), "p10": _pct(eager, 0.1), "median": _pct(eager, 0.5),
                     "p90": _pct(eager, 0.9), "max": max(eager, default=None)},
        "compile_ms_median": statistics.median(comp) if comp else None,
        "eager_over_compile_median": statistics.median(speed) if speed else None,
        "benchmark_similarity_max": max(sim, default=None),
    }


def stage_split(out: Path) -> dict:
    """Where the workers' check time went: seconds per stage of the check (load, trace, values,
    shortcuts, window, final_values, compile) summed over every candidate, their shares, the
    worker-seconds each accepted task cost (its own checks and those of the candidates rejected),
    and the check time of accepted and rejected candidates apart."""
    from cuda_agent.synth.pipeline import read_records

    totals: Counter = Counter()
    spent: dict[bool, list[float]] = {True: [], False: []}
    where: dict[str, list[float]] = {}   # the shortcut checks' seconds by the device they ran on
    ratios: list[float] = []   # GPU: the checks after the window over what its timed runs held
    # The log holds a candidate again each time its record changes (the judge's reference check
    # after the filters): its last record counts, once. Accepted or not by the filters' check
    # itself; a candidate the static filters removed was never checked (0 s).
    for rec in {r.index: r for r in read_records(out)}.values():
        check = rec.check
        spent[check.accepted if check is not None else rec.accepted].append(check.check_s if check is not None else 0.0)
        for name, sec in (check.stage_s if check is not None else {}).items():
            totals[name] += sec
        if check is not None and check.shortcut_device and "shortcuts" in check.stage_s:
            where.setdefault(check.shortcut_device, []).append(check.stage_s["shortcuts"])
        mem = check.memory_mb if check is not None else {}
        if mem.get("held", 0) >= 64:   # at smaller sizes fixed allocations decide the ratio
            ratios.append((mem["checks"] - 3 * mem["weights"]) / mem["held"])
    whole = sum(spent[True]) + sum(spent[False])
    staged = sum(totals.values())
    return {"worker_s": round(whole, 1),
            "per_accepted_task_s": round(whole / len(spent[True]), 2) if spent[True] else None,
            **{f"{kind}_s": {"n": len(xs), "sum": round(sum(xs), 1),
                             "median": round(statistics.median(xs), 2) if xs else None}
               for kind, xs in (("accepted", spent[True]), ("rejected", spent[False]))},
            "shortcuts_on": {d: {"n": len(xs), "sum": round(sum(xs), 1), "median": round(statistics.median(xs), 2)}
                             for d, xs in where.items()},
            # what check_memory_multiple stands for, as seen (tasks whose timed runs held >= 64 MiB)
            "check_memory_multiple": {"n": len(ratios), "median": round(_pct(ratios, 0.5), 2), "p90": round(
                _pct(ratios, 0.9), 2), "max": round(max(ratios), 2)} if ratios else None,
            "stages_s": {k: round(v, 1) for k, v in totals.most_common()},
            "stages_share": {k: round(v / staged, 3) for k, v in totals.most_common()} if staged else {}}


def criterion_cost(split: dict) -> dict:
    """The export criterion's part of the workers' check time (its stage in `split`): worker-seconds
    in all, per accepted task, and its share of the staged time."""
    sec = split["stages_s"].get("criterion", 0.0)
    accepted = split["accepted_s"]["n"]
    return {"worker_s": sec, "per_accepted_task_s": round(sec / accepted, 2) if accepted else None,
            "share": split["stages_share"].get("criterion", 0.0)}


def rejection_examples(out: Path, per_filter: int = 3) -> dict[str, list[str]]:
    """The first few rejection messages of each filter: what a rejection count is made of."""
    from cuda_agent.synth.pipeline import read_records

    examples: dict[str, list[str]] = {}
    for rec in read_records(out):
        if rec.rejection is not None and len(examples.setdefault(rec.rejection.filter, [])) < per_filter:
            examples[rec.rejection.filter].append(rec.rejection.message[:300])
    return examples


def judge_sample(out: Path, k: int, device: str, parallel: int) -> dict:
    """The judge's reference checks of the first `k` exported tasks, `parallel` judges at a time;
    one line per task in OUT/judge_progress.jsonl as it comes (kept if the check is cut short)."""
    from cuda_agent.synth.judgecheck import check_tasks
    from cuda_agent.tasks import iter_parquet_tasks

    items = [(t.name, t.source) for t in iter_parquet_tasks(out / "tasks.parquet")][:k]
    t0 = time.monotonic()
    with (out / "judge_progress.jsonl").open("w") as log:
        def note(rec) -> None:
            log.write(rec.model_dump_json() + "\n")
            log.flush()

        got = check_tasks(items, device, parallel, on_result=note)
    failed = [g.model_dump() for g in got.values() if not g.ok]
    return {"judged": len(got), "passed": len(got) - len(failed), "lost_to_crashed_judges": len(items) - len(got),
            "with_task_warnings": sum(g.warned for g in got.values()), "failures": failed[:20],
            "judge_s": time.monotonic() - t0, "parallel": min(parallel, len(items))}


def phase_rates(phases: list[dict]) -> dict:
    """Rates of the two kinds of phase apart: tasks the filters accepted per hour of generating and
    filtering, tasks the judge checked per hour of its own phase after the filters. With the judges
    beside the filters (--judge-overlap) most checks happen inside the filter phase and the
    accepted count there is already net of the judge's failures; the judge phase then holds only
    what the stream left (out of GPU memory, a judge that died), so its rate says little: the
    run's own figure is `judge_checked_per_gpu_hour` (every check over the whole wall time)."""
    def rate(kind: str, count: str) -> float | None:
        wall = sum(p["wall_s"] for p in phases if p["phase"] == kind)
        return sum(p.get(count, 0) for p in phases if p["phase"] == kind) / wall * 3600 if wall > 0 else None

    return {"filter_accepted_per_hour": rate("filter", "accepted"),
            "checked_beside_filters": sum(p.get("checked", 0) for p in phases if p["phase"] == "filter"),
            "judge_phase_checked_per_hour": rate("judge", "checked")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--out", type=Path, required=True, help="output folder (outside the repository)")
    ap.add_argument("--workers", type=int, default=None, help="default: cores / 2")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-ms", type=float, default=None)
    ap.add_argument("--max-ms", type=float, default=None)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="check torch.compile against eager (default: on, on every device)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds of generation: start no new candidate after this (the sample may be short)")
    ap.add_argument("--benchmark-dir", type=Path, default=None)
    ap.add_argument("--judge-check", action="store_true", help="the judge's reference checks inside the pipeline")
    ap.add_argument("--judge-sample", type=int, default=0, help="the judge's reference checks of this many exported tasks")
    ap.add_argument("--judge-parallel", type=int, default=4, help="judge processes (default 4)")
    ap.add_argument("--judge-overlap", action=argparse.BooleanOptionalAction, default=True,
                    help="with --judge-check: the judges check each task as the filters accept it, beside them "
                         "(default; --no-judge-overlap: after the filters stop)")
    ap.add_argument("--criterion", action=argparse.BooleanOptionalAction, default=True,
                    help="hold every accepted task to the export criterion (default on)")
    ap.add_argument("--hazard-guards", action=argparse.BooleanOptionalAction, default=True,
                    help="compose with the seed probe's guards (default on; off: the composer before round three)")
    ap.add_argument("--shortcut-cpu-ms", type=float, default=None,
                    help="shortcut checks on the workers' CPUs for tasks whose composed forward takes at most "
                         "this many ms there (FilterConfig.shortcut_cpu_ms, default 10; 0: on the device)")
    ap.add_argument("--target-ms", type=float, default=None,
                    help="the runtime window's rescaling target (FilterConfig.target_ms; default a quarter of the "
                         "way up the window on a log scale)")
    ap.add_argument("--check-memory-multiple", type=float, default=None,
                    help="GPU: the runtime window keeps BATCH where the later checks, taken to hold this many "
                         "times what a timed run holds, fit a worker's memory share "
                         "(FilterConfig.check_memory_multiple; 0: no such bound)")
    ap.add_argument("--split-only", action="store_true",
                    help="print where the check time of the sample already in --out went (check_split), run nothing")
    args = ap.parse_args()
    if args.split_only:
        print(json.dumps(stage_split(args.out), indent=1))
        return 0

    repo = Path(__file__).resolve().parents[1]
    if args.out.resolve().is_relative_to(repo):
        print("--out must be outside the repository (the sample is evidence, not a commit)", file=sys.stderr)
        return 2
    import torch
    from rich.console import Console

    from cuda_agent.synth.cli import _RichProgress, print_report
    from cuda_agent.synth.filters import FilterConfig, usable_cores, worker_layout
    from cuda_agent.synth.pipeline import SynthConfig, run_synth

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    workers, threads = worker_layout(args.workers)
    fkw: dict = {"device": device, "timeout_s": args.timeout, "threads_per_worker": threads,
                 "criterion": args.criterion}
    if args.min_ms is not None:
        fkw["min_ms"] = args.min_ms
    if args.max_ms is not None:
        fkw["max_ms"] = args.max_ms
    if args.compile is not None:
        fkw["compile"] = args.compile
    if args.shortcut_cpu_ms is not None:
        fkw["shortcut_cpu_ms"] = args.shortcut_cpu_ms
    if args.target_ms is not None:
        fkw["target_ms"] = args.target_ms
    if args.check_memory_multiple is not None:
        fkw["check_memory_multiple"] = args.check_memory_multiple
    bench = args.benchmark_dir if args.benchmark_dir and args.benchmark_dir.is_dir() else None
    cfg = SynthConfig(n=args.n, out=args.out, seed=args.seed, workers=workers, benchmark_dir=bench,
                      compose={"profile": device, "hazard_guards": args.hazard_guards}, filters=FilterConfig(**fkw), time_limit_s=args.time_limit,
                      judge_check=args.judge_check, judge_parallel=args.judge_parallel,
                      judge_overlap=args.judge_overlap)
    console = Console()
    t0 = time.monotonic()
    report = run_synth(cfg, _RichProgress(console))
    print_report(report, console)
    from cuda_agent.pool import visible_gpus

    n_gpus = len(visible_gpus()) if device == "cuda" else 0
    result = {"device": device, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
              "gpus": n_gpus, "tasks_per_gpu_hour": report.tasks_per_hour / n_gpus if n_gpus else None,
              "cores": usable_cores(), "workers": workers, "torch": torch.__version__, "wall_s": time.monotonic() - t0,
              "tasks_per_hour": report.tasks_per_hour, "candidates_per_hour": report.candidates_per_hour,
              "accepted": report.accepted, "candidates": report.candidates, "rejected_by": report.rejected_by,
              "accepted_not_exported": report.accepted_not_exported, "compile_check": report.compile_check,
              "shortcut_checks": report.shortcut_checks, "n_input_sets": report.n_input_sets,
              "shortcut_cpu_ms": cfg.filters.shortcut_cpu_ms, "check_memory_multiple": cfg.filters.check_memory_multiple,
              "target_ms": cfg.filters.target_ms,
              "diversity": report.diversity,
              "judge_checked": report.judge_checked, "judge_s": report.judge_s,
              "judge_checked_per_gpu_hour": report.judge_checked / report.wall_s * 3600 / n_gpus
              if n_gpus and report.wall_s > 0 else None,
              **phase_rates(report.phases), "phases": report.phases,
              "criterion": report.criterion, "hazard_guards": report.hazard_guards,
              "hazard_rejections": report.hazard_rejections, "hazard_share": report.hazard_share,
              "refused_seed_ranks": len(report.refused_seeds),
              "check_split": (split := stage_split(args.out)), "criterion_cost": criterion_cost(split),
              "sample": sample_stats(args.out),
              "rejection_examples": rejection_examples(args.out)}
    # written before the judge check as well, so a check cut short loses nothing of the run
    (args.out / "throughput.json").write_text(json.dumps(result, indent=1))
    if args.judge_sample:
        result["judge"] = judge_sample(args.out, args.judge_sample, device, args.judge_parallel)
        (args.out / "throughput.json").write_text(json.dumps(result, indent=1))
    console.print_json(json.dumps({k: v for k, v in result.items() if k != "rejected_by"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
