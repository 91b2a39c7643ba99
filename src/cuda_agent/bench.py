"""`cuda-agent bench`: judge a task set with its solutions through the pool, into the results database.

A bench run is named (`--run`, default `<tasks>-<device>-<UTC time>`). Each verdict is committed to
the database as soon as it arrives; running the same run again judges only the (task, candidate)
pairs it does not hold yet, so an interrupted run resumes where it stopped. The table and the
metrics (CUDA Agent's Table 1 and KernelBench's fast_p, see `cuda_agent.metrics`) are computed from
the database, over every task of the run, including those judged before a resume.
"""

from __future__ import annotations

import hashlib
import json
import queue
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from cuda_agent.candidate import Candidate, CandidateError
from cuda_agent.db import ResultsDB, StoredVerdict, default_db_path
from cuda_agent.judge import JudgeConfig, JudgeError
from cuda_agent.metrics import MetricsTable, Outcome, metrics_table
from cuda_agent.pool import Pool, PoolConfig, PoolError
from cuda_agent.report import console, metrics_tables, summary_lines, verdict_table
from cuda_agent.tasks import Task, load_tasks

# Fields that do not change what a verdict means: where files go and which uid sandboxes use.
_UNSCORED_FIELDS = {"cache_dir", "sandbox_uid", "use_zygote"}


class BenchItem(BaseModel):
    model_config = ConfigDict(frozen=True)
    task: Task
    candidate: Candidate


class BenchPlan(BaseModel):
    """What a bench run covers: tasks, the pairs to judge, and what could not be paired."""

    spec: str
    tasks: list[Task]
    items: list[BenchItem]
    missing: list[Task]                 # tasks without a solution
    unreadable: dict[str, str]          # task name -> why its solution could not be read


class BenchResult(BaseModel):
    run: str
    db: Path
    verdicts: list[StoredVerdict]
    table: MetricsTable
    judged_now: int
    already_done: int
    errors: dict[str, str]              # task name -> why the judge could not work on it


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


def resolve_spec(spec: str, device: str) -> str:
    return f"suite:{device}" if spec in ("suite", "suite:cuda", "suite:cpu") else spec


def plan_bench(spec: str, solutions: Path | None, device: str, levels: list[int] | None = None) -> BenchPlan:
    spec = resolve_spec(spec, device)
    tasks = load_tasks(spec, levels)
    if levels:
        tasks = [t for t in tasks if t.level in set(levels)]
    if solutions is None:
        if not spec.startswith("suite"):
            raise FileNotFoundError("--solutions is required for a task set other than the bundled suite")
        from cuda_agent.suite import suite_solutions

        paths = suite_solutions(device)
    else:
        paths = find_solutions(tasks, solutions)
    items, missing, unreadable = [], [], {}
    for t in tasks:
        if t.name not in paths:
            missing.append(t)
            continue
        try:
            items.append(BenchItem(task=t, candidate=Candidate.from_path(paths[t.name])))
        except CandidateError as exc:
            unreadable[t.name] = str(exc)
    return BenchPlan(spec=spec, tasks=tasks, items=items, missing=missing, unreadable=unreadable)


def settings_digest(config: JudgeConfig) -> str:
    """Identity of the judge settings that change what a verdict means (resume refuses others)."""
    text = json.dumps(config.model_dump(mode="json", exclude=_UNSCORED_FIELDS), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def default_run_name(spec: str, device: str) -> str:
    label = spec.split(":", 1)[0] if spec.startswith("suite") else Path(spec.rstrip("/")).stem or "tasks"
    return f"{label}-{device}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"


def outcomes_of(verdicts: list[StoredVerdict], missing: list[Task] = ()) -> list[Outcome]:
    return [Outcome.of(v.verdict, v.level) for v in verdicts] + [Outcome.missing(t.level) for t in missing]


def run_bench(spec: str, solutions: Path | None, config: JudgeConfig, *, levels: list[int] | None = None,
              out: Path | None = None, db_path: Path | None = None, run_name: str | None = None,
              pool_config: PoolConfig | None = None, report: Path | None = None, count_missing: bool = False) -> BenchResult:
    if not console.is_terminal and console.width < 160:
        console.width = 160  # a redirected run is read in a file or a log: do not cut columns to 80
    plan = plan_bench(spec, solutions, config.device, levels)
    db_path = Path(db_path) if db_path else default_db_path(config.cache_dir)
    db = ResultsDB(db_path)
    try:
        run_name = run_name or default_run_name(plan.spec, config.device)
        run, created = db.open_run(run_name, spec=plan.spec, device=config.device,
                                   settings_digest=settings_digest(config),
                                   info={"config": json.loads(config.model_dump_json()), "levels": levels,
                                         "solutions": str(solutions) if solutions else "bundled",
                                         "argv": sys.argv[1:], "started": time.time()})
        # What the report needs to count unsolved tasks later, as of this invocation.
        db.update_run_info(run_name, missing=[{"name": t.name, "level": t.level} for t in plan.missing])
        done = db.finished(run_name)
        todo = [it for it in plan.items if (it.task.id, it.candidate.hash) not in done]
        already = len(plan.items) - len(todo)
        console.print(f"run [bold]{run_name}[/bold] in {db_path}: {len(plan.items)} of {len(plan.tasks)} tasks "
                      f"have a solution" + (f", {already} already judged" if already else "")
                      + f"; judging {len(todo)} on {config.device}"
                      + ("" if created else " (resumed)") + f"  [dim](resume with --run {run_name})[/dim]",
                      soft_wrap=True)
        for name, why in plan.unreadable.items():
            console.print(f"[red]{name}: {why}[/red]")
        errors: dict[str, str] = {}
        if todo:
            pc = pool_config or PoolConfig()
            pc = pc.model_copy(update={"baseline_db": pc.baseline_db or db_path})
            with Pool(config, pc) as pool:
                _judge_all(pool, todo, db, run_name, errors)
        verdicts = db.verdicts(run_name)
    finally:
        db.close()
    order = {t.id: i for i, t in enumerate(plan.tasks)}
    verdicts.sort(key=lambda v: order.get(v.task_id, len(order)))
    table = metrics_table(outcomes_of(verdicts, plan.missing if count_missing else []))
    console.print(verdict_table(verdicts, f"{run_name}: {plan.spec} on {config.device}"))
    for t in metrics_tables(table, count_missing=count_missing, n_missing=len(plan.missing)):
        console.print(t)
    for line in summary_lines(table):
        console.print(line)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(v.verdict.model_dump(mode="json") | {"level": v.level}) + "\n"
                               for v in verdicts))
    if report is not None:
        from cuda_agent.report_html import write_report

        write_report(db_path, [run_name], report, count_missing=count_missing)
        console.print(f"report: {report}")
    return BenchResult(run=run_name, db=db_path, verdicts=verdicts, table=table, judged_now=len(todo) - len(errors),
                       already_done=already, errors=errors)


def _judge_all(pool: Pool, todo: list[BenchItem], db: ResultsDB, run_name: str, errors: dict[str, str]) -> None:
    """Submit from a feeder thread (submit blocks when the pool's queue is full) and store each verdict
    from this thread the moment it arrives."""
    finished: queue.Queue = queue.Queue()
    feeder_error: list[BaseException] = []

    def feed() -> None:
        for item in todo:
            try:
                future = pool.submit(item.task, item.candidate)
            except PoolError as exc:
                feeder_error.append(exc)
                finished.put(None)
                return
            future.add_done_callback(lambda f, item=item: finished.put((item, f)))

    feeder = threading.Thread(target=feed, name="bench-feeder", daemon=True)
    feeder.start()
    passed = failed = 0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                  console=console, transient=True) as progress:
        bar = progress.add_task("judging", total=len(todo), status="")
        for _ in range(len(todo)):
            got = finished.get()
            if got is None:
                raise feeder_error[0]
            item, future = got
            try:
                verdict = future.result()
            except JudgeError as exc:  # a broken task, not a candidate's fault: say so, go on
                errors[item.task.name] = str(exc)
                progress.console.print(f"[red]{item.task.name}: {exc}[/red]")
            else:
                db.add_verdict(run_name, item.task, item.candidate, verdict)
                if verdict.correct:
                    passed += 1
                else:
                    failed += 1
            progress.update(bar, advance=1, description=f"judged {item.task.name}",
                            status=f"[green]{passed} correct[/green] [red]{failed} failed[/red]")
    feeder.join()
