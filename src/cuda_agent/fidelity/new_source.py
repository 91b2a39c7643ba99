"""New-source throughput: published single-file solutions judged from a cold cache, per GPU-hour.

The workload of a corpus run or an RL run's first steps: every candidate a new `load_inline` source
(a build nobody has made), every task new (its eager baseline, and torch.compile's when asked, not
measured yet). The corpus is the KernelBench leaderboard layout that `cuda-agent fidelity` reads
(its corpus reader, sampling and pool are reused: `--corpus CORPUS/docs/assets`).

    python benchmarks/new_source_throughput.py --corpus CORPUS/docs/assets --out nst-h100 --sample 80
    python benchmarks/new_source_throughput.py --corpus ... --out nst-light -c light_cuda_headers=false
    python benchmarks/new_source_throughput.py --out nst-h100 --report-only

Cold: the judge's cache (builds, precompiled headers, baselines) and work folders are fresh folders
under OUT, made by this run; an OUT that already holds verdicts is refused (a resumed run is warm).
Nothing is built ahead: the pool's compile workers build what waits in the queue while the judge
workers judge, as they would for any submitted stream.

Reported (OUT/throughput.json and on stdout):
- judged candidates per GPU-hour over the whole run (pool start-up included) and over the steady
  part (first verdict to last), GPUs = the pool's judge workers / judges per GPU;
- where the time goes, seconds summed over candidates and per candidate: `pool_queue` (waiting for
  a judge worker), `prebuild` (a compile worker building it ahead, off the judge's path), and on the
  judge worker: `build` (waiting for or doing the build), `baseline` (a task's first candidate
  measures its baselines), `start` (process start, ModelNew), `calls` (verification and timing),
  `memcheck`, `other` (the judge's own rest); and the judge workers' busy share of the wall time;
- verdicts: correct, failed by category, judge or pool errors; which header the CUDA builds'
  `.cu` files were compiled with (the judge's op or light stand-in, or torch's own).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from cuda_agent import fidelity  # the corpus reader, the sample, the pool run
from cuda_agent.fidelity.run import judge_config

JUDGE_PHASES = ("build", "baseline", "start", "calls", "memcheck")
REPORT_FILE = "throughput.json"


def summarize(entries: list[dict], wall_s: float | None, gpus: int, judges: int) -> dict:
    """The report of one run from its verdict entries (the fidelity run's verdicts.jsonl lines). `wall_s`:
    the run's wall time, pool start included (None for --report-only: from the entries' timestamps)."""
    verdicts = [e["verdict"] for e in entries if e.get("verdict")]
    stamps = sorted(e["judged_at"] for e in entries if e.get("judged_at"))
    steady_s = stamps[-1] - stamps[0] if len(stamps) > 1 else None
    phase_sum = {p: 0.0 for p in ("pool_queue", "prebuild", *JUDGE_PHASES, "other")}
    judge_s = 0.0
    for v in verdicts:
        phases = v.get("phase_s") or {}
        for p in ("pool_queue", "prebuild", *JUDGE_PHASES):
            phase_sum[p] += float(phases.get(p) or 0.0)
        spent = float(v.get("judge_s") or 0.0)
        judge_s += spent
        phase_sum["other"] += max(0.0, spent - sum(float(phases.get(p) or 0.0) for p in JUDGE_PHASES))
    n = len(entries)
    categories = Counter((v.get("failure") or {}).get("category", "?") for v in verdicts if not v.get("correct"))
    errors = Counter((e.get("error") or {}).get("kind", "?") for e in entries if e.get("error"))

    def per_gpu_hour(count: int, seconds: float | None) -> float | None:
        return count / (seconds / 3600.0) / gpus if seconds and gpus else None

    return {
        "candidates": n, "verdicts": len(verdicts), "correct": sum(bool(v.get("correct")) for v in verdicts),
        "failed_by_category": dict(categories), "errors_by_kind": dict(errors),
        "tasks": len({e.get("task") for e in entries}), "gpus": gpus, "judge_workers": judges,
        "wall_s": wall_s, "steady_s": steady_s,
        "per_gpu_hour": per_gpu_hour(n, wall_s), "steady_per_gpu_hour": per_gpu_hour(max(0, n - 1), steady_s),
        "phase_s_total": {k: round(x, 1) for k, x in phase_sum.items()},
        "phase_s_per_candidate": {k: round(x / len(verdicts), 2) for k, x in phase_sum.items()} if verdicts else {},
        "judge_busy": judge_s / (wall_s * judges) if wall_s and judges else None,
        "built_ahead": sum(bool((v.get("phase_s") or {}).get("prebuild")) for v in verdicts),
        "build_cached": sum(v.get("build_cached") is True for v in verdicts),
        # which of torch's headers the CUDA builds' .cu files were compiled with (ops, light, torch)
        "build_headers": dict(Counter(h for v in verdicts for h in v.get("build_headers") or [])),
        "median_judge_s": statistics.median(float(v.get("judge_s") or 0.0) for v in verdicts) if verdicts else None,
    }


def render(report: dict) -> str:
    def num(x, fmt="{:.0f}"):
        return "-" if x is None else fmt.format(x)

    lines = [f"{report['candidates']} new sources over {report['tasks']} tasks on {report['gpus']} GPU(s), "
             f"{report['judge_workers']} judge worker(s): {report['correct']} correct, "
             f"{report['verdicts'] - report['correct']} failed {report['failed_by_category']}, "
             f"errors {report['errors_by_kind']}",
             f"judged per GPU-hour: {num(report['per_gpu_hour'])} over the whole run ({num(report['wall_s'])} s, "
             f"pool start included), {num(report['steady_per_gpu_hour'])} first to last verdict; "
             f"judge workers busy {num(report['judge_busy'] and 100 * report['judge_busy'])}%",
             f"built ahead by compile workers: {report['built_ahead']}, build cache hits on the judge: "
             f"{report['build_cached']}; CUDA builds by header {report.get('build_headers') or '-'}; "
             f"median judge time per candidate {num(report['median_judge_s'], '{:.1f}')} s",
             "seconds per candidate: " + ", ".join(f"{k} {v}" for k, v in report["phase_s_per_candidate"].items())]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/new_source_throughput.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, help="the leaderboard's docs/assets folder (or the checkout)")
    p.add_argument("--out", type=Path, required=True, help="output folder: verdicts, the cold cache, the report")
    p.add_argument("--sample", type=int, help="judge N records, stratified by level (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--policy", choices=("strict", "lenient"), default="lenient")
    p.add_argument("--compile-mode", default="none",
                   choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "none"))
    p.add_argument("-c", "--set", dest="sets", action="append", default=[], help="override one JudgeConfig field")
    p.add_argument("--workers", type=int, help="judge workers (cuda: judges per GPU x visible GPUs)")
    p.add_argument("--judges-per-gpu", type=int, default=1,
                   help="CUDA: judge workers sharing each GPU (timed calls take turns; default 1)")
    p.add_argument("--compile-workers", type=int, help="compile workers (default: the pool's)")
    p.add_argument("--time-limit", type=float, help="seconds one record may hold a judge worker")
    p.add_argument("--report-only", action="store_true", help="judge nothing: report what OUT holds")
    args = p.parse_args(argv)
    if not args.report_only and args.corpus is None:
        p.error("--corpus is needed unless --report-only")
    if args.sample is not None and args.sample < 1:
        p.error("--sample must be at least 1")
    if args.judges_per_gpu < 1:
        p.error("--judges-per-gpu must be at least 1")
    return args


def run(args: argparse.Namespace) -> dict:
    out: Path = args.out
    verdicts_file = out / fidelity.VERDICTS_FILE
    if args.report_only:
        saved = json.loads((out / REPORT_FILE).read_text()) if (out / REPORT_FILE).is_file() else {}
        entries = list(fidelity.read_results(out).values())
        wall_s = saved.get("wall_s")
        if wall_s is None and saved.get("started_at") and entries:
            # a run cut short (a time limit) wrote no report: its wall time up to the last verdict
            wall_s = max(e.get("judged_at") or 0.0 for e in entries) - saved["started_at"]
        report = summarize(entries, wall_s, saved.get("gpus") or 1, saved.get("judge_workers") or 1)
        if saved.get("settings"):
            report["settings"] = saved["settings"]
        return report
    if verdicts_file.exists():
        raise fidelity.UsageError(f"{verdicts_file} exists: a cold run needs a new --out")
    cache, work = out / "cache", out / "work"
    cache.mkdir(parents=True)
    work.mkdir()
    # Cold and private: the pool's workers inherit these (builds, baselines, candidate folders)
    os.environ["CUDA_AGENT_CACHE"] = str(cache)
    os.environ["CUDA_AGENT_WORK"] = str(work)
    corpus = fidelity.load_corpus(args.corpus)
    records = fidelity.stratified_sample(corpus.records, args.sample, args.seed)
    config = judge_config(args).model_copy(update={"cache_dir": cache})
    from cuda_agent.host import visible_gpus
    from cuda_agent.pool import PoolConfig

    pool_config = PoolConfig(judge_workers=args.workers, compile_workers=args.compile_workers,
                             time_limit_s=args.time_limit, judges_per_gpu=args.judges_per_gpu)
    gpus = max(1, len(visible_gpus())) if args.device == "cuda" else 1
    judges = args.workers or gpus * args.judges_per_gpu
    used = min(gpus, -(-judges // args.judges_per_gpu)) if args.device == "cuda" else 1  # GPUs the judges hold
    settings = fidelity.settings_of(config)["config"]
    # What the report needs, written first: a run cut short still reports its judges and its rate
    # (--report-only, wall time up to its last verdict)
    (out / REPORT_FILE).write_text(json.dumps({"started_at": time.time(), "gpus": used, "judge_workers": judges,
                                               "settings": settings}, indent=1))
    t0 = time.monotonic()
    fidelity.judge_records(records, out, config, pool_config, {})
    wall_s = time.monotonic() - t0
    report = summarize(list(fidelity.read_results(out).values()), wall_s, used, judges)
    report["settings"] = settings
    (out / REPORT_FILE).write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except fidelity.UsageError as exc:
        print(f"new_source_throughput: {exc}", file=sys.stderr)
        return fidelity.EXIT_USAGE
    print(render(report))
    return 0
