"""`cuda-agent bench`: judge a task set with its solutions through the pool, into the results database.

A bench run is named (`--run`, default `<tasks>-<device>-<UTC time>`). Each verdict is committed to
the database as soon as it arrives; running the same run again judges only the (task, candidate)
pairs it does not hold a verdict for yet, so an interrupted run resumes where it stopped. A pair the
judge could not judge (the pool's future raised `JudgeError`: the reference or its baseline failed;
or `PoolError`: the pool broke) is recorded as a `StoredFailure` with a category and the message,
and is tried again by a resumed run. The table, the JSON lines and the metrics (CUDA Agent's Table 1
and KernelBench's fast_p, see `cuda_agent.metrics`) are computed from the database: one row per
(task, candidate) pair of the run, verdicts and judge failures, including those of earlier
invocations.
"""

from __future__ import annotations

import hashlib
import json
import queue
import sys
import threading
import time
from concurrent.futures import CancelledError
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from cuda_agent.candidate import Candidate, CandidateError
from cuda_agent.db import ResultsDB, StoredFailure, StoredVerdict, default_db_path
from cuda_agent.judge import JudgeConfig, JudgeError
from cuda_agent.metrics import MetricsTable, Outcome, metrics_table
from cuda_agent.pool import Pool, PoolConfig, PoolError
from cuda_agent.report import (console, message_summary, metrics_tables, solution_label, summary_lines,
                               verdict_table)
from cuda_agent.reward import RewardConfig, reward_of
from cuda_agent.tasks import Task, load_tasks

class BenchUsageError(ValueError):
    """The command asked for something that cannot be a bench run (no --solutions for a task set that
    has none bundled, a solutions folder that does not exist or matches no task): nothing is
    started and no run is created."""


# Fields that do not change what a verdict means: where files go and which uid sandboxes use.
_UNSCORED_FIELDS = {"cache_dir", "sandbox_uid", "use_zygote", "device_lock"}
# Settings added after runs were stored, with the value that keeps the judge's earlier behaviour:
# at that value they leave the digest as it was, so those runs still resume.
_LATER_DEFAULTS = {"gate_release": "process", "release_writes": "device", "flush_after_inputs": "off",
                   "touch_pages": False, "approx_rel_l2": 0.0, "keep_gpu_plane": False, "stage_inputs": False}


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
    records: list[StoredVerdict | StoredFailure]   # every pair of the run, in task order
    table: MetricsTable
    judged_now: int                     # verdicts reached by this invocation
    failed_now: int                     # pairs this invocation could not judge (recorded as failures)
    already_done: int
    pool_error: str | None = None       # the pool broke: the pairs it left are failures of category pool

    @property
    def verdicts(self) -> list[StoredVerdict]:
        return [r for r in self.records if isinstance(r, StoredVerdict)]

    @property
    def failures(self) -> list[StoredFailure]:
        return [r for r in self.records if isinstance(r, StoredFailure)]


def failure_category(exc: BaseException) -> str:
    """The category of a pair the judge could not judge, from what the pool's future raised: the
    judge's `JudgeError` carries only a message (it crosses a process boundary as text), whose
    wording the judge keeps stable: "<mode> baseline failed", "the reference does not import",
    "reference output of ... exceeds"."""
    if isinstance(exc, PoolError) or not isinstance(exc, JudgeError):
        return "pool"
    text = str(exc)
    if " baseline failed" in text:
        return "baseline"
    if "the reference does not import" in text or "reference output of" in text:
        return "reference"
    return "judge"


def find_solutions(tasks: list[Task], folder: Path) -> dict[str, Path]:
    """Solutions named by task: NAME.py or a NAME/ workspace (KernelBench names like 1_Foo.py too)."""
    if not folder.is_dir():
        raise BenchUsageError(f"{folder}: solutions folder not found")
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
            raise BenchUsageError("--solutions is required for a task set other than the bundled suite")
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
    if tasks and not paths:
        names = ", ".join(t.name for t in tasks[:3]) + (", ..." if len(tasks) > 3 else "")
        raise BenchUsageError(f"{solutions}: no solution matches a task of {spec} ({len(tasks)} tasks: {names}); "
                              "solutions are named NAME.py or NAME/ after their task")
    return BenchPlan(spec=spec, tasks=tasks, items=items, missing=missing, unreadable=unreadable)


def settings_digest(config: JudgeConfig | dict) -> str:
    """Identity of the judge settings that change what a verdict measures (resume refuses others).
    The reward is not a judge setting: a run is scored under its latest reward settings. A dict is
    a config as a run stored it (`info["config"]`); its `reward` table, where a run made before the
    reward left the judge has one, is left out like the fields that do not change a verdict."""
    values = config.model_dump(mode="json") if isinstance(config, JudgeConfig) else dict(config)
    values = {k: v for k, v in values.items() if k not in _UNSCORED_FIELDS and k != "reward"
              and not (k in _LATER_DEFAULTS and v == _LATER_DEFAULTS[k])}
    text = json.dumps(values, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _restate_old_digest(db: ResultsDB, run_name: str, digest: str) -> None:
    """A run stored before the reward left the judge's settings has a digest that covered the
    reward: where its stored judge settings, read now, give this invocation's digest, they are the
    same settings, and the run's digest is restated (so a valid run resumes)."""
    run = db.run(run_name)
    if run is None or run.settings_digest == digest:
        return
    stored = run.info.get("config")
    if isinstance(stored, dict) and "reward" in stored and settings_digest(stored) == digest:
        db.restate_settings_digest(run_name, run.settings_digest, digest)


def default_run_name(spec: str, device: str) -> str:
    label = spec.split(":", 1)[0] if spec.startswith("suite") else Path(spec.rstrip("/")).stem or "tasks"
    return f"{label}-{device}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"


def outcomes_of(records: list[StoredVerdict | StoredFailure], missing: list[Task] = ()) -> list[Outcome]:
    """One outcome per pair (a judge failure counts as not correct), plus one per missing task."""
    return ([Outcome.of(r.verdict, r.level, r.task_id) if isinstance(r, StoredVerdict)
             else Outcome.unjudged(r.level, r.task_id) for r in records]
            + [Outcome.missing(t.level, t.id) for t in missing])


def record_json(rec: StoredVerdict | StoredFailure, reward: RewardConfig = RewardConfig()) -> dict:
    """One JSON line of `--out`: a verdict (its full JSON, and its reward under `reward`) or a judge
    failure, told apart by `record`."""
    if isinstance(rec, StoredVerdict):
        r = reward_of(rec.verdict, reward)
        return ({"record": "verdict"} | rec.verdict.model_dump(mode="json")
                | {"level": rec.level, "solution": rec.solution, "reward": r.value, "reward_reason": r.reason})
    return {"record": "judge_failure", "task_id": rec.task_id, "task_name": rec.task_name,
            "candidate_hash": rec.candidate_hash, "solution": rec.solution, "level": rec.level,
            "compiled": None, "correct": False, "reward": None,
            "failure": {"category": rec.category, "message": rec.message}, "finished_at": rec.finished_at}


def judge_failure_counts(records: list) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        if isinstance(r, StoredFailure):
            counts[r.category] = counts.get(r.category, 0) + 1
    return counts


def run_bench(spec: str, solutions: Path | None, config: JudgeConfig, *, levels: list[int] | None = None,
              out: Path | None = None, db_path: Path | None = None, run_name: str | None = None,
              pool_config: PoolConfig | None = None, report: Path | None = None, count_missing: bool = False,
              reward: RewardConfig | None = None, judge=None) -> BenchResult:
    """Judge the plan's pairs into the run `run_name` (resuming it when it exists) and print the
    tables. `reward`: how the run's verdicts are scored (the table, the report, the database's
    reward column); it is recorded as the run's reward settings and is free to change between
    invocations of a run, unlike the judge's settings (`settings_digest`). `judge`: a
    `cuda_agent.serve.client.JudgeClient` to judge through a running `cuda-agent serve` instead of
    an in-process pool; the run then records the service's judge settings."""
    reward = reward or RewardConfig()
    if judge is not None:  # where its results database goes stays this machine's choice
        config = JudgeConfig.model_validate(judge.info().judge_config | {"cache_dir": str(config.cache_dir)})
    if not console.is_terminal and console.width < 160:
        console.width = 160  # a redirected run is read in a file or a log: do not cut columns to 80
    plan = plan_bench(spec, solutions, config.device, levels)
    db_path = Path(db_path) if db_path else default_db_path(config.cache_dir)
    db = ResultsDB(db_path)
    try:
        run_name = run_name or default_run_name(plan.spec, config.device)
        digest = settings_digest(config)
        _restate_old_digest(db, run_name, digest)
        run, created = db.open_run(run_name, spec=plan.spec, device=config.device,
                                   settings_digest=digest,
                                   info={"config": json.loads(config.model_dump_json()), "levels": levels,
                                         "solutions": str(solutions) if solutions else "bundled",
                                         "argv": sys.argv[1:], "started": time.time()})
        # What the report needs to count unsolved tasks later, as of this invocation.
        db.update_run_info(run_name, missing=[{"name": t.name, "level": t.level, "id": t.id} for t in plan.missing],
                           reward=reward.model_dump(mode="json"))
        done = db.finished(run_name)
        todo = [it for it in plan.items if (it.task.id, it.task.name, it.candidate.hash) not in done]
        already = len(plan.items) - len(todo)
        mixed = [] if created or not todo else _other_torch_builds(db, run_name)
        console.print(f"run [bold]{run_name}[/bold] in {db_path}: {len(plan.items)} of {len(plan.tasks)} tasks "
                      f"have a solution" + (f", {already} already judged" if already else "")
                      + f"; judging {len(todo)} on {config.device}"
                      + ("" if created else " (resumed)") + f"  [dim](resume with --run {run_name})[/dim]",
                      soft_wrap=True)
        if plan.missing:
            names = ", ".join(t.name for t in plan.missing[:20]) + (
                f" and {len(plan.missing) - 20} more" if len(plan.missing) > 20 else "")
            console.print(f"no solution for {len(plan.missing)} tasks"
                          + (" (counted as failures: --count-missing)" if count_missing else " (not counted)")
                          + f": {escape(names)}", soft_wrap=True)
        for name, why in plan.unreadable.items():
            console.print(f"[red]{escape(name)}: {escape(why)}[/red]")
        if mixed:
            now = _torch_version()
            console.print(f"[yellow]note:[/yellow] this run holds verdicts judged with torch {', '.join(mixed)}; "
                          f"the rest are judged with torch {now}, so its times mix two torch builds "
                          "(a new --run keeps them apart)", soft_wrap=True)
            db.update_run_info(run_name, torch_builds=sorted({*mixed, now}))
        counts = {"judged": 0, "failed": 0}
        pool_error: str | None = None
        if todo and judge is not None:
            judge.run = run_name  # the service stores its verdicts under the same run name
            pool_error = _judge_all(judge, todo, db, run_name, counts, reward)
        elif todo:
            pc = pool_config or PoolConfig()
            pc = pc.model_copy(update={"baseline_db": pc.baseline_db or db_path})
            with Pool(config, pc) as pool:
                pool_error = _judge_all(pool, todo, db, run_name, counts, reward)
        records = db.records(run_name)
    finally:
        db.close()
    order = {(t.id, t.name): i for i, t in enumerate(plan.tasks)}
    records.sort(key=lambda r: (order.get((r.task_id, r.task_name), len(order)), r.task_name))
    table = metrics_table(outcomes_of(records, plan.missing if count_missing else []))
    console.print(verdict_table(records, f"{run_name}: {plan.spec} on {config.device}", reward))
    for t in metrics_tables(table, count_missing=count_missing, n_missing=len(plan.missing)):
        console.print(t)
    for line in summary_lines(table, judge_failure_counts(records)):
        console.print(line)
    failures = [r for r in records if isinstance(r, StoredFailure)]
    if failures:
        console.print("[red]not judged[/red] (the task or the judge failed, not the candidate):")
        for r in failures:
            console.print(f"  {r.task_name} ({solution_label(r.solution)}): {r.category}: "
                          f"{message_summary(r.message, 160)}", soft_wrap=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(record_json(r, reward)) + "\n" for r in records))
    if report is not None:
        from cuda_agent.report_html import write_report

        write_report(db_path, [run_name], report, count_missing=count_missing)
        console.print(f"report: {report}")
    return BenchResult(run=run_name, db=db_path, records=records, table=table, judged_now=counts["judged"],
                       failed_now=counts["failed"], already_done=already, pool_error=pool_error)


def _torch_version() -> str:
    import torch

    return torch.__version__


def _other_torch_builds(db: ResultsDB, run_name: str) -> list[str]:
    """The torch versions of a run's stored verdicts that differ from this process's torch."""
    now = _torch_version()
    seen = {r.verdict.versions.get("torch") for r in db.records(run_name) if isinstance(r, StoredVerdict)}
    return sorted(v for v in seen if v and v != now)


def _pool_state(pool: Pool) -> PoolError:
    """Why the pool cancelled a waiting pair: its broken state when it broke, else its shutdown."""
    try:
        pool.wait_ready(0)
    except PoolError as exc:
        return exc
    return PoolError("the pool shut down before this pair was judged")


def _judge_all(pool: Pool, todo: list[BenchItem], db: ResultsDB, run_name: str, counts: dict[str, int],
               reward: RewardConfig) -> str | None:
    """Submit from a feeder thread (submit blocks when the pool's queue is full) and store each
    outcome from this thread the moment it arrives: a verdict, or a judge failure for a pair the
    judge or the pool could not judge. Returns why the pool broke, if it did (the pairs it left are
    recorded as failures of category `pool`)."""
    finished: queue.Queue = queue.Queue()

    def feed() -> None:
        for i, item in enumerate(todo):
            try:
                future = pool.submit(item.task, item.candidate)
            except PoolError as exc:  # the pool broke: none of the rest can be judged now
                for rest in todo[i:]:
                    finished.put((rest, None, exc))
                return
            future.add_done_callback(lambda f, item=item: finished.put((item, f, None)))

    feeder = threading.Thread(target=feed, name="bench-feeder", daemon=True)
    feeder.start()
    passed = failed = 0
    pool_error: str | None = None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                  console=console, transient=True) as progress:
        bar = progress.add_task("judging", total=len(todo), status="")
        for done in range(1, len(todo) + 1):
            item, future, error = finished.get()
            verdict = None
            if error is None:
                try:
                    verdict = future.result()
                except CancelledError:  # a broken pool cancels what waited in its queue: say why
                    error = _pool_state(pool)
                except Exception as exc:  # JudgeError: the task's fault; PoolError: the pool's
                    error = exc
            if verdict is not None:
                db.add_verdict(run_name, item.task, item.candidate, verdict, reward=reward_of(verdict, reward).value)
                counts["judged"] += 1
                if verdict.correct:
                    passed += 1
                else:
                    failed += 1
            else:
                category = failure_category(error)
                message = str(error) or type(error).__name__
                if not isinstance(error, (JudgeError, PoolError)):
                    message = f"{type(error).__name__}: {message}"
                if category == "pool":
                    pool_error = pool_error or message
                db.add_failure(run_name, item.task, item.candidate, category, message)
                counts["failed"] += 1
                failed += 1
            progress.update(bar, advance=1, description=f"judged {item.task.name}",
                            status=f"[green]{passed} correct[/green] [red]{failed} failed[/red]"
                                   + (f" ({counts['failed']} not judged)" if counts["failed"] else ""))
            if not console.is_terminal:  # a log gets no bar (rich draws none there): one line per item
                what = ("correct" if verdict.correct else f"rejected ({verdict.failure.category.value if verdict.failure else 'incorrect'})") if verdict is not None \
                    else f"not judged ({failure_category(error)})"
                console.print(f"[{done}/{len(todo)}] {item.task.name}: {what}", markup=False, highlight=False)
    feeder.join()
    return pool_error
