"""Human-readable rendering of verdicts and tables (rich)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cuda_agent.judge.verdict import Verdict
from cuda_agent.reward import Reward, RewardConfig, reward_of

# Written to a file or a pipe (a log, CI), the tables keep the width of a wide terminal instead of
# rich's default 80 columns (or a narrow $COLUMNS), which would fold every row of the 13-column
# verdict table.
_columns = os.environ.get("COLUMNS", "")
console = Console(width=None if sys.stdout.isatty() else max(180, int(_columns) if _columns.isdigit() else 0))


def fmt_ms(x: float | None) -> str:
    """A time in ms for tables (the unit is in the column header)."""
    return "-" if x is None else f"{x:.3f}"


def fmt_x(x: float | None) -> str:
    """A speed-up."""
    return "-" if x is None else f"{x:.2f}x"


def print_verdict(v: Verdict, reward: Reward) -> None:
    """A verdict and its reward (scored by the caller: the judge does not score)."""
    status = "[green]correct[/green]" if v.correct else "[red]rejected[/red]"
    console.print(f"[bold]{v.task_name}[/bold] ({v.device}: {v.device_name}) {status}  reward {reward.value:g}: "
                  f"{reward.reason}")
    if v.failure:
        console.print(f"[red]{v.failure.category.value}[/red]: {v.failure.message}")
    for p in v.policy_violations[:10]:
        console.print(f"  policy: {p}")
    if v.runtime:
        console.print(f"  runtime {fmt_ms(v.runtime_ms)} ms (p10 {v.runtime.p10_ms:.3f}, p90 {v.runtime.p90_ms:.3f}, "
                      f"{v.runtime.source}), eager {fmt_ms(v.eager_ms)} ms, torch.compile {fmt_ms(v.compile_ms)} ms")
        console.print(f"  speed-up {fmt_x(v.speedup_vs_eager)} vs eager, {fmt_x(v.speedup_vs_compile)} vs torch.compile")
    if v.speed_of_light is not None:
        console.print(f"  {sol_line(v)}")
    for w in v.task_warnings + v.notes:
        console.print(f"  [yellow]note[/yellow]: {w}")
    build = "-" if v.build_s is None else f"{v.build_s:.1f} s{' (cached)' if v.build_cached else ''}"
    console.print(f"  build {build}, judged in {v.judge_s or 0:.1f} s, {v.n_checked} outputs checked")


def sol_line(v: Verdict) -> str:
    """Where the runtimes stand against the hardware, in one line."""
    sol = v.speed_of_light
    work = sol.work
    if sol.sol_ms is None:
        return f"speed-of-light: none ({sol.reason})"
    return (f"speed-of-light {sol.sol_ms:.4f} ms on {sol.gpu_model} ({sol.bound}-bound: "
            f"{work.dram_bytes / 1e6:.1f} MB, {work.flops / 1e9:.2f} GFLOP): candidate at {fmt_pct(v.sol_share)}, "
            f"eager {fmt_pct(v.eager_sol_share)}, torch.compile {fmt_pct(v.compile_sol_share)} of it")


def fmt_pct(x: float | None) -> str:
    """A fraction as a percentage."""
    return "-" if x is None else f"{100 * x:.1f}%"


def fmt_sol_pair(m) -> str:
    """A metrics row's geomean share of speed-of-light, candidate and (eager), or '-'."""
    if not m.n_sol:
        return "-"
    return f"{fmt_pct(m.geomean_sol_share)} ({fmt_pct(m.geomean_eager_sol_share)})"


def message_summary(message: str, width: int = 60) -> str:
    """The first line of a message, and its last one when there are more (a traceback names the
    error on its last line)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if not lines:
        return ""
    if len(lines) == 1:
        return lines[0][:width]
    return f"{lines[0][:width]} ... {lines[-1][:width]}"


def solution_label(origin: str) -> str:
    """A candidate's origin as a short name: the file or folder name."""
    return Path(origin.rstrip("/")).name if origin else "-"


def verdict_table(records: list, title: str, reward: RewardConfig = RewardConfig()) -> Table:
    """One row per (task, candidate) pair: `records` are `StoredVerdict`s (a verdict with its task's
    level) and `StoredFailure`s (a pair the judge could not judge, shown with its category). Each
    verdict is scored here, under `reward`."""
    table = Table(title=title)
    for col in ("task", "solution", "level", "compiled", "correct", "runtime ms", "eager ms", "compile ms",
                "vs eager", "vs compile", "of SOL", "reward", "failure"):
        # names fold onto a second line rather than lose their ends (two solutions of one task
        # differ only there) when a narrow terminal squeezes the columns
        table.add_column(col, justify="right" if "ms" in col or col.startswith(("vs", "of ")) else "left",
                         overflow="fold" if col in ("task", "solution") else "ellipsis")
    for rec in records:
        level = "" if rec.level is None else str(rec.level)
        solution = solution_label(getattr(rec, "solution", ""))
        v = getattr(rec, "verdict", None)
        if v is None:  # the judge could not judge this pair
            table.add_row(rec.task_name, solution, level, "-", "[red]no[/red]", "-", "-", "-", "-", "-", "-", "-",
                          f"[red]not judged, {rec.category}[/red]: " + message_summary(rec.message))
            continue
        table.add_row(v.task_name, solution, level, "yes" if v.compiled else "no",
                      "[green]yes[/green]" if v.correct else "[red]no[/red]", fmt_ms(v.runtime_ms), fmt_ms(v.eager_ms),
                      fmt_ms(v.compile_ms), fmt_x(v.speedup_vs_eager), fmt_x(v.speedup_vs_compile), fmt_pct(v.sol_share),
                      f"{reward_of(v, reward).value:g}",
                      (v.failure.category.value + ": " + message_summary(v.failure.message)) if v.failure else "")
    return table


def metrics_footnote(count_missing: bool, n_missing: int) -> str:
    from cuda_agent.metrics import COUNTING_NOTE, GEOMEAN_NOTE

    counted = ("tasks without a solution count as failures" if count_missing
               else "tasks without a solution are not counted")
    return (f"{COUNTING_NOTE} Rates are over the pairs counted; {counted} ({n_missing} without one). {GEOMEAN_NOTE}; "
            "'correct only' is the geomean over correct tasks alone. fast_p: correct and > p x eager. "
            "of SOL: runtime as a share of the task's speed-of-light on the judging GPU (geomean over correct "
            "pairs with a bound; eager on the same tasks in brackets).")


def metrics_tables(table, *, count_missing: bool = False, n_missing: int = 0) -> list[Table]:
    """CUDA Agent's Table 1 (per level and overall) and KernelBench's fast_p, as rich tables: per
    (task, candidate) pair, and per task by its best candidate when some task has several."""
    from cuda_agent.metrics import FAST_P, fast_p_key

    sets = [("per (task, candidate) pair", table.levels + [table.overall])]
    if table.best_of_overall is not None:
        sets.append((f"per task, best of its candidates ({table.n_tasks} tasks)",
                     table.best_of_levels + [table.best_of_overall]))
    out = []
    for i, (unit, rows) in enumerate(sets):
        t1 = Table(title=f"CUDA Agent Table 1 metrics, {unit}",
                   caption=metrics_footnote(count_missing, n_missing) if i == len(sets) - 1 else None)
        for col in ("", "pairs" if i == 0 else "tasks", "pass rate", "not judged", "faster than eager",
                    "faster than compile", "geomean vs eager", "geomean vs compile", "vs eager (correct only)",
                    "vs compile (correct only)", "of SOL (eager)"):
            t1.add_column(col, justify="left" if not col else "right")
        for m in rows:
            t1.add_row(m.label, str(m.n), fmt_pct(m.pass_rate), str(m.n_judge_errors), fmt_pct(m.beats_eager_rate),
                       fmt_pct(m.beats_compile_rate), fmt_x(m.geomean_speedup_vs_eager),
                       fmt_x(m.geomean_speedup_vs_compile), fmt_x(m.geomean_speedup_vs_eager_correct),
                       fmt_x(m.geomean_speedup_vs_compile_correct), fmt_sol_pair(m),
                       style="bold" if m.label == "overall" else None)
        fp = Table(title=f"KernelBench fast_p (correct and speed-up vs eager > p), {unit}")
        fp.add_column("")
        for p in FAST_P:
            fp.add_column(f"fast_{p:g}", justify="right")
        for m in rows:
            fp.add_row(m.label, *[fmt_pct(m.fast_p[fast_p_key(p)]) for p in FAST_P],
                       style="bold" if m.label == "overall" else None)
        out += [t1, fp]
    return out


def summary_lines(table, judge_failures: dict[str, int] | None = None) -> list[str]:
    """The run in a few lines. `judge_failures`: category -> pairs the judge could not judge."""
    m = table.overall
    if not m.n:
        return ["no tasks judged"]
    lines = [
        f"pass rate {m.n_correct}/{m.n} ({100 * m.pass_rate:.1f}%) of (task, candidate) pairs, "
        f"faster than eager {fmt_pct(m.beats_eager_rate)}, "
        f"faster than torch.compile {fmt_pct(m.beats_compile_rate)}",
        f"geomean speed-up (failures as 1.0x): {fmt_x(m.geomean_speedup_vs_eager)} vs eager, "
        f"{fmt_x(m.geomean_speedup_vs_compile)} vs torch.compile",
    ]
    if m.n_sol:
        lines.append(f"share of speed-of-light (geomean over {m.n_sol} correct pairs with a bound): "
                     f"{fmt_pct(m.geomean_sol_share)} candidate, {fmt_pct(m.geomean_eager_sol_share)} eager")
    if m.max_floor_share is not None:
        lines.append(f"closest share of the physical floor (its DRAM bytes at the datasheet peak): "
                     f"{fmt_pct(m.max_floor_share)}")
    if table.best_of_overall is not None:
        b = table.best_of_overall
        lines.append(f"best candidate per task: pass rate {b.n_correct}/{b.n} ({100 * b.pass_rate:.1f}%), "
                     f"geomean {fmt_x(b.geomean_speedup_vs_eager)} vs eager")
    if m.n_judge_errors:
        detail = ", ".join(f"{k}: {n}" for k, n in sorted((judge_failures or {}).items()))
        lines.append(f"not judged (counted as not correct): {m.n_judge_errors} pair{'s' if m.n_judge_errors != 1 else ''}"
                     + (f" ({detail})" if detail else ""))
    return lines
