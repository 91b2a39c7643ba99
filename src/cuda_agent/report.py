"""Human-readable rendering of verdicts and tables (rich)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from cuda_agent.judge.verdict import Verdict

console = Console()


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def print_verdict(v: Verdict) -> None:
    status = "[green]correct[/green]" if v.correct else "[red]rejected[/red]"
    console.print(f"[bold]{v.task_name}[/bold] ({v.device}: {v.device_name}) {status}  reward {v.reward:g}: {v.reward_reason}")
    if v.failure:
        console.print(f"[red]{v.failure.category.value}[/red]: {v.failure.message}")
    for p in v.policy_violations[:10]:
        console.print(f"  policy: {p}")
    if v.runtime:
        console.print(f"  runtime {_ms(v.runtime_ms)} ms (p10 {v.runtime.p10_ms:.3f}, p90 {v.runtime.p90_ms:.3f}, "
                      f"{v.runtime.source}), eager {_ms(v.eager_ms)} ms, torch.compile {_ms(v.compile_ms)} ms")
        console.print(f"  speed-up {_x(v.speedup_vs_eager)} vs eager, {_x(v.speedup_vs_compile)} vs torch.compile")
    for w in v.task_warnings + v.notes:
        console.print(f"  [yellow]note[/yellow]: {w}")
    build = "-" if v.build_s is None else f"{v.build_s:.1f} s{' (cached)' if v.build_cached else ''}"
    console.print(f"  build {build}, judged in {v.judge_s or 0:.1f} s, {v.n_checked} outputs checked")


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def verdict_table(verdicts: list[Verdict], title: str) -> Table:
    table = Table(title=title)
    for col in ("task", "level", "compiled", "correct", "runtime ms", "eager ms", "compile ms",
                "vs eager", "vs compile", "reward", "failure"):
        table.add_column(col, justify="right" if "ms" in col or col.startswith("vs") else "left")
    for v in verdicts:
        table.add_row(v.task_name, str(v.versions.get("level", "")), "yes" if v.compiled else "no",
                      "[green]yes[/green]" if v.correct else "[red]no[/red]", _ms(v.runtime_ms), _ms(v.eager_ms),
                      _ms(v.compile_ms), _x(v.speedup_vs_eager), _x(v.speedup_vs_compile), f"{v.reward:g}",
                      (v.failure.category.value + ": " + v.failure.message.splitlines()[0][:60]) if v.failure else "")
    return table


def summary_lines(verdicts: list[Verdict]) -> list[str]:
    n = len(verdicts)
    if not n:
        return ["no tasks judged"]
    correct = [v for v in verdicts if v.correct]
    faster_eager = [v for v in correct if (v.speedup_vs_eager or 0) > 1.0]
    faster_compile = [v for v in correct if (v.speedup_vs_compile or 0) > 1.0]
    ge = geomean([v.speedup_vs_eager for v in correct if v.speedup_vs_eager])
    gc = geomean([v.speedup_vs_compile for v in correct if v.speedup_vs_compile])
    return [
        f"pass rate {len(correct)}/{n} ({100 * len(correct) / n:.1f}%), faster than eager {len(faster_eager)}/{n}, "
        f"faster than torch.compile {len(faster_compile)}/{n}",
        f"geomean speed-up over correct tasks: {_x(ge)} vs eager, {_x(gc)} vs torch.compile",
        f"mean reward {sum(v.reward for v in verdicts) / n:.2f}",
    ]
