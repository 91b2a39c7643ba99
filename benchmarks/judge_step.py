"""How long one judge step (compile + verify + profile) takes, for both candidate forms.

An RL step waits on the judge, so this is the number that bounds training throughput. The task is
an L1-size task of the bundled suite (--task, or the first level-1 task that has both a single-file
and a workspace solution; failing that, the first level-1 task with each form). Two modes:

* cold: the step after an agent edits its kernels. Every run sees a new source, so nothing can
  come from the build cache: a uuid comment is added to every kernels/* file of a workspace; for
  a single file, to the first triple-quoted string assigned to a cuda/cpp source name, plus a
  '# <uuid>' line at the end of the module (a single file without such a string is reported as
  not measurable). The eager and torch.compile baselines are cached (they depend on the task,
  not on the candidate), and ninja's persistent build folder keeps the fixed binding.cpp object.
* cold-kernels (`--mode cold-kernels` or `all`, workspace form): the same, but the uuid goes only
  into the kernel files, not their kernels/*_binding.cpp: the step after an agent edits a kernel
  and leaves its binding alone, where ninja keeps the binding's object (the binding, which holds
  pybind11 and torch's headers, is the slowest file to compile).
* warm: the same candidate judged again by the long-lived `Judge` whose build and baselines are
  already cached (one priming evaluation, not counted, fills the cache).

The figure reported is `verdict.judge_s`, the judge's own clock for the whole step; the wall
time around `evaluate` is recorded as well, as a check on it.

Each record also has the judge's phases (`phase_s`: build, baseline, start, calls) and, for
builds, the seconds of each compiled file from ninja's log (`compile_units_s`).

The table gives median/min/max of judge_s, the median build time, how many runs hit the build
cache and how many were correct, next to the published ~55 s of the released CUDA Agent workspace.
All numbers, per run, also go to --out as JSON.

Example (GPU):   python benchmarks/judge_step.py --runs 5
Example (CPU):   python benchmarks/judge_step.py --device cpu --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cuda_agent.measure.steps import cold_variant

PUBLISHED_LABEL = "released CUDA Agent workspace (published figure)"
PUBLISHED_S = 55.0
PUBLISHED_FORM, PUBLISHED_MODE = "released CUDA Agent workspace", "(published figure)"
FORMS = ("file", "workspace")



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="judge_step.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="judge backend and suite variant (default: cuda; 'cpu' uses the CPU suite "
                             "and C++ kernels, for machines without a GPU)")
    parser.add_argument("--task", metavar="NAME",
                        help="suite task to use for both forms (default: the first level-1 task with "
                             "both a single-file and a workspace solution; otherwise the first level-1 "
                             "task with each)")
    parser.add_argument("--runs", type=int, default=5, metavar="N",
                        help="measured runs per form and mode (default: 5)")
    parser.add_argument("--form", choices=("both",) + FORMS, default="both",
                        help="candidate form(s) to measure (default: both)")
    parser.add_argument("--mode", choices=("both", "cold", "cold-kernels", "warm", "all"), default="both",
                        help="mode(s) to measure: both = cold and warm (default); cold-kernels = a workspace "
                             "step that edits its kernel files but not their *_binding.cpp (ninja keeps the "
                             "binding's object); all = the three")
    parser.add_argument("--out", type=Path, default=Path("runs/judge_step.json"),
                        help="where to write the JSON results (default: runs/judge_step.json)")
    parser.add_argument("--cache-root", type=Path, default=None,
                        help="folder for the cache directories this script creates (default: a "
                             "temporary folder, removed at the end)")
    parser.add_argument("--keep-cache", action="store_true",
                        help="do not remove the cache directories at the end")
    parser.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE",
                        help="override a JudgeConfig field, e.g. -c n_timed=50 -c compile_mode=none "
                             "(repeatable; device and cache_dir are set by this script)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


# --- choosing the task and solutions -------------------------------------------------------------

def form_of(path: Path) -> str:
    return "workspace" if Path(path).is_dir() else "file"


def normalise_solutions(raw: dict) -> dict[str, dict[str, Path]]:
    """{task: {form: path}} from suite_solutions(), whose values are a path (or a few of them)."""
    out: dict[str, dict[str, Path]] = {}
    for name, value in raw.items():
        if isinstance(value, dict):
            paths = list(value.values())
        elif isinstance(value, (list, tuple, set)):
            paths = list(value)
        else:
            paths = [value]
        for p in paths:
            p = Path(p)
            out.setdefault(name, {}).setdefault(form_of(p), p)
    return out


def is_level1(task) -> bool:
    return task.level == 1 or task.group == "level1"


def choose(tasks: list, solutions: dict[str, dict[str, Path]], wanted: str | None,
           forms: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """{form: task or None} and human-readable notes on the choice."""
    by_name = {t.name: t for t in tasks}
    notes: list[str] = []
    if wanted is not None:
        if wanted not in by_name:
            raise SystemExit(f"unknown task {wanted!r}; suite tasks: {', '.join(sorted(by_name))}")
        chosen = {}
        for form in forms:
            if form in solutions.get(wanted, {}):
                chosen[form] = by_name[wanted]
            else:
                chosen[form] = None
                notes.append(f"{wanted} has no {form} solution: {form} form not measured")
        return chosen, notes

    pool = [t for t in tasks if is_level1(t)]
    if not pool:
        notes.append("no level-1 task in the suite: choosing among all suite tasks")
        pool = list(tasks)
    with_sol = [t for t in pool if t.name in solutions]
    both = [t for t in with_sol if all(f in solutions[t.name] for f in forms)]
    if both:
        return {form: both[0] for form in forms}, notes
    chosen = {}
    for form in forms:
        first = next((t for t in with_sol if form in solutions[t.name]), None)
        chosen[form] = first
        if first is None:
            notes.append(f"no suite task has a {form} solution: {form} form not measured")
    if len({id(t) for t in chosen.values() if t is not None}) > 1:
        notes.append("no task has both forms: " + ", ".join(
            f"{form} on {t.name}" for form, t in chosen.items() if t is not None))
    return chosen, notes


# --- running ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def open_judge(Judge, config):
    """A Judge, closed at the end if it has something to close."""
    judge = Judge(config)
    if hasattr(judge, "__enter__") and hasattr(judge, "__exit__"):
        with judge as entered:
            yield entered if entered is not None else judge
        return
    try:
        yield judge
    finally:
        close = getattr(judge, "close", None) or getattr(judge, "shutdown", None)
        if callable(close):
            close()


def compile_units(since: float) -> dict[str, float]:
    """Seconds per compiled file of the builds that finished after `since` (from ninja's own log in
    the judge's build folders): where a cold build spends its time."""
    from cuda_agent.judge.sandbox import work_root_dir

    out: dict[str, float] = {}
    for log in (work_root_dir() / "build").glob("*/out/.ninja_log"):
        if log.stat().st_mtime < since:
            continue
        last: dict[str, float] = {}
        for line in log.read_text(errors="replace").splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
                last[parts[3]] = (int(parts[1]) - int(parts[0])) / 1e3
        for target, secs in last.items():
            obj = log.parent / target
            if obj.exists() and obj.stat().st_mtime >= since:
                out[target] = round(secs, 2)
    return out


def record(verdict, wall_s: float, since: float, **extra) -> dict:
    from cuda_agent.reward import reward_of

    summary = verdict.summary()
    return {
        "judge_s": verdict.judge_s,
        "wall_s": wall_s,
        "build_s": verdict.build_s,
        "build_cached": verdict.build_cached,
        "compiled": verdict.compiled,
        "correct": verdict.correct,
        "reward": reward_of(verdict).value,
        "failure": summary.get("failure"),
        "runtime_ms": summary.get("runtime_ms"),
        "eager_ms": summary.get("eager_ms"),
        "compile_ms": summary.get("compile_ms"),
        "candidate_hash": verdict.candidate_hash,
        "phase_s": dict(verdict.phase_s),
        "compile_units_s": compile_units(since),
        "notes": list(verdict.notes),  # e.g. calls that fell back to host memory
        **extra,
    }


def evaluate(judge, task, candidate, **extra) -> dict:
    t0 = time.perf_counter()
    since = time.time()
    try:
        verdict = judge.evaluate(task, candidate)
    except Exception as exc:  # a judge bug: keep measuring the rest, but say so
        return {"error": f"{type(exc).__name__}: {exc}", "wall_s": time.perf_counter() - t0, **extra}
    return record(verdict, time.perf_counter() - t0, since, **extra)


def run_cold(judge, task, candidate, runs: int, log, bindings: bool = True) -> dict:
    """New source every run (a build-cache miss; ninja rebuilds the changed files), baselines cached:
    the step an agent takes after editing its kernels (`bindings=False`: and not their bindings)."""
    if cold_variant(candidate, "probe", bindings=bindings) is None:
        why = ("the single-file form's sources and binding are one file" if not bindings and candidate.kind == "file"
               else "no triple-quoted C++/CUDA source string found in the module" if candidate.kind == "file"
               else "the workspace has no kernel sources" + ("" if bindings else " besides its bindings"))
        return {"measurable": False, "why": why, "runs": []}
    out = []
    for i in range(runs):
        tag = uuid.uuid4().hex
        rec = evaluate(judge, task, cold_variant(candidate, tag, bindings=bindings), run=i, tag=tag)
        out.append(rec)
        log(f"  cold{'' if bindings else ' (kernels only)'} {candidate.kind} run {i + 1}/{runs}: {describe(rec)}")
    return {"measurable": True, "runs": out}


def run_warm(judge, task, candidate, runs: int, log) -> dict:
    prime = evaluate(judge, task, candidate, run="prime")
    log(f"  warm {candidate.kind} priming run: {describe(prime)}")
    out = []
    for i in range(runs):
        rec = evaluate(judge, task, candidate, run=i)
        out.append(rec)
        log(f"  warm {candidate.kind} run {i + 1}/{runs}: {describe(rec)}")
    return {"measurable": True, "prime": prime, "runs": out}


def describe(rec: dict) -> str:
    if "error" in rec:
        return f"judge raised {rec['error']}"
    t = rec["judge_s"]
    parts = [f"judge_s={t:.2f}" if t is not None else "judge_s=None",
             f"build_s={rec['build_s']:.2f}" if rec.get("build_s") is not None else "build_s=None",
             f"cached={rec.get('build_cached')}", f"correct={rec.get('correct')}"]
    if rec.get("phase_s"):
        parts.append("phases " + " ".join(f"{k}={v:.2f}" for k, v in rec["phase_s"].items()))
    if rec.get("compile_units_s"):
        parts.append("units " + " ".join(f"{k}={v:.1f}" for k, v in rec["compile_units_s"].items()))
    if rec.get("failure"):
        parts.append(f"failure={rec['failure'].get('category')}: {rec['failure'].get('message', '')[:80]}")
    if any("host memory" in n for n in rec.get("notes", [])):
        parts.append("NOTE: per-call tensors went through host memory")
    return ", ".join(parts)


def stats(result: dict) -> dict:
    runs = [r for r in result.get("runs", []) if "error" not in r]
    times = [r["judge_s"] for r in runs if r.get("judge_s") is not None]
    builds = [r["build_s"] for r in runs if r.get("build_s") is not None]
    return {
        "n": len(result.get("runs", [])),
        "n_ok": len(times),
        "n_errors": sum("error" in r for r in result.get("runs", [])),
        "median_s": statistics.median(times) if times else None,
        "min_s": min(times) if times else None,
        "max_s": max(times) if times else None,
        "median_wall_s": statistics.median([r["wall_s"] for r in runs]) if runs else None,
        "median_build_s": statistics.median(builds) if builds else None,
        "n_build_cached": sum(bool(r.get("build_cached")) for r in runs),
        "n_correct": sum(bool(r.get("correct")) for r in runs),
    }


# --- output ----------------------------------------------------------------------------------------

def print_table(rows: list[dict], console) -> None:
    from rich.table import Table

    def s(x):
        return "-" if x is None else f"{x:.2f}"

    if console.width < 140 and not console.is_terminal:
        console.width = 140  # a redirected run is read in a file, not cut to 80 columns
    table = Table(title="One judge step (compile + verify + profile): verdict.judge_s, seconds",
                  caption="build: median build_s; cached: runs whose build came from the cache")
    table.add_column("form")
    table.add_column("mode")
    table.add_column("task")
    for col in ("runs", "median", "min", "max", "build", "cached", "correct"):
        # Numbers are never cut; the text columns wrap instead.
        table.add_column(col, justify="right", no_wrap=True, min_width=max(len(col), 5))
    for row in rows:
        if not row["measurable"]:
            table.add_row(row["form"], row["mode"], row["task"], "-", "not measurable", "", "", "", "", "",
                          style="dim")
            continue
        st = row["stats"]
        table.add_row(row["form"], row["mode"], row["task"], f"{st['n_ok']}/{st['n']}",
                      s(st["median_s"]), s(st["min_s"]), s(st["max_s"]), s(st["median_build_s"]),
                      f"{st['n_build_cached']}/{st['n_ok']}", f"{st['n_correct']}/{st['n_ok']}")
    table.add_row(PUBLISHED_FORM, PUBLISHED_MODE, "-", "-", f"~{PUBLISHED_S:.0f}", "", "", "", "", "",
                  style="italic")
    console.print(table)


def environment(device: str) -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "device": device}
    try:
        import torch

        info["torch"] = torch.__version__
        if device == "cuda" and torch.cuda.is_available():
            info["device_name"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # the record is still useful without it
        info["torch"] = f"unavailable: {exc}"
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    # Imported here so that --help works while the judge is still being written.
    from rich.console import Console

    from cuda_agent.candidate import Candidate
    from cuda_agent.settings import SettingsError, apply_overrides

    try:
        from cuda_agent.judge import Judge, JudgeConfig
        from cuda_agent.suite import suite_solutions, suite_tasks
    except ImportError as exc:
        print(f"judge_step: the judge or the suite cannot be imported: {exc}", file=sys.stderr)
        return 2

    console = Console(stderr=False)

    def log(msg: str) -> None:
        console.print(msg, markup=False, highlight=False, soft_wrap=True)

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            console.print("[red]no CUDA device here[/red]; use --device cpu for the CPU suite")
            return 2

    forms = FORMS if args.form == "both" else (args.form,)
    modes = {"both": ("cold", "warm"), "all": ("cold", "cold-kernels", "warm")}.get(args.mode, (args.mode,))
    tasks = list(suite_tasks(args.device))
    solutions = normalise_solutions(suite_solutions(args.device))
    chosen, notes = choose(tasks, solutions, args.task, forms)
    for note in notes:
        log(f"note: {note}")
    for form in forms:
        if chosen[form] is not None:
            log(f"{form} form: task {chosen[form].name} ({solutions[chosen[form].name][form]})")

    try:
        overrides = apply_overrides({}, args.config, JudgeConfig)
    except SettingsError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    for key in ("device", "cache_dir"):
        if key in overrides:
            raise SystemExit(f"--config {key}=... is set by this script; use --device / --cache-root")

    own_root = args.cache_root is None
    cache_root = Path(tempfile.mkdtemp(prefix="judge_step-")) if own_root else args.cache_root
    cache_root.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows: list[dict] = []
    base_config = JudgeConfig.model_validate(
        {**overrides, "device": args.device, "cache_dir": cache_root / "warm"})
    candidates = {form: Candidate.from_path(solutions[chosen[form].name][form])
                  for form in forms if chosen[form] is not None}

    def add_row(form: str, mode: str, result: dict) -> None:
        task = chosen[form]
        if not result["measurable"]:
            log(f"  not measurable: {result['why']}")
        rows.append({"form": form, "mode": mode, "task": task.name, "task_id": task.id,
                     "solution": str(solutions[task.name][form]),
                     "candidate_hash": candidates[form].hash, "measurable": result["measurable"],
                     "why": result.get("why"), "stats": stats(result),
                     "prime": result.get("prime"), "runs": result["runs"]})

    try:
        # One Judge: its first (priming) evaluation of each form fills the baseline cache; cold
        # runs then change the source every time, warm runs repeat it unchanged.
        with open_judge(Judge, base_config) as judge:
            for form, candidate in candidates.items():
                warm = run_warm(judge, chosen[form], candidate, args.runs if "warm" in modes else 0, log)
                if "cold" in modes:
                    log(f"{form} / cold on {chosen[form].name}:")
                    add_row(form, "cold", run_cold(judge, chosen[form], candidate, args.runs, log))
                if "cold-kernels" in modes:
                    log(f"{form} / cold, kernels only, on {chosen[form].name}:")
                    add_row(form, "cold-kernels",
                            run_cold(judge, chosen[form], candidate, args.runs, log, bindings=False))
                if "warm" in modes:
                    add_row(form, "warm", warm)
    finally:
        if own_root and not args.keep_cache:
            shutil.rmtree(cache_root, ignore_errors=True)

    console.print()
    print_table(rows, console)
    report = {
        "benchmark": "judge_step",
        "started_unix": started,
        "argv": sys.argv[1:] if argv is None else list(argv),
        "runs_per_mode": args.runs,
        "environment": environment(args.device),
        "judge_config": json.loads(base_config.model_dump_json(exclude={"cache_dir"})),
        "notes": notes,
        "results": rows,
        "reference": {"label": PUBLISHED_LABEL, "judge_step_s": PUBLISHED_S},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    log(f"wrote {args.out}")
    errors = sum(r["stats"]["n_errors"] for r in rows)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
