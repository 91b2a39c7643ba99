"""Judge a task set with its solutions and print the table."""

from __future__ import annotations

import json
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from cuda_agent.candidate import Candidate, CandidateError
from cuda_agent.judge import Judge, JudgeConfig, JudgeError, Verdict
from cuda_agent.report import console, summary_lines, verdict_table
from cuda_agent.tasks import Task, load_tasks


def find_solutions(tasks: list[Task], folder: Path) -> dict[str, Path]:
    """Solutions named by task: NAME.py or a NAME/ workspace (KernelBench names like 1_Foo.py too)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: solutions folder not found")
    out = {}
    for t in tasks:
        for cand in (folder / f"{t.name}.py", folder / t.name):
            if cand.exists():
                out[t.name] = cand
                break
    return out


def run_bench(spec: str, solutions: Path | None, config: JudgeConfig, *, levels=None,
              out: Path | None = None) -> list[Verdict]:
    if spec in ("suite", "suite:cuda", "suite:cpu"):
        spec = f"suite:{config.device}"
    tasks = load_tasks(spec, levels)
    if solutions is None:
        if not spec.startswith("suite"):
            raise FileNotFoundError("--solutions is required for a task set other than the bundled suite")
        from cuda_agent.suite import suite_solutions

        sols = suite_solutions(config.device)
    else:
        sols = find_solutions(tasks, solutions)
    todo = [t for t in tasks if t.name in sols]
    if levels:
        todo = [t for t in todo if t.level in set(levels)]
    console.print(f"{len(todo)} of {len(tasks)} tasks have a solution; judging on {config.device}")
    verdicts: list[Verdict] = []
    sink = out.open("a") if out else None
    try:
        with Judge(config) as judge, Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), console=console, transient=True,
        ) as progress:
            bar = progress.add_task("judging", total=len(todo))
            for t in todo:
                progress.update(bar, description=f"judging {t.name}")
                try:
                    cand = Candidate.from_path(sols[t.name])
                except CandidateError as exc:
                    console.print(f"[red]{t.name}: {exc}[/red]")
                    progress.advance(bar)
                    continue
                try:
                    v = judge.evaluate(t, cand)
                except JudgeError as exc:  # a broken task, not a candidate's fault: say so, go on
                    console.print(f"[red]{t.name}: {exc}[/red]")
                    progress.advance(bar)
                    continue
                v.versions["level"] = str(t.level or "")
                verdicts.append(v)
                if sink:
                    sink.write(json.dumps(v.model_dump(mode="json")) + "\n")
                    sink.flush()
                progress.advance(bar)
    finally:
        if sink:
            sink.close()
    console.print(verdict_table(verdicts, f"{spec} on {config.device}"))
    for line in summary_lines(verdicts):
        console.print(line)
    return verdicts
