"""Runs of the agent on tasks, each in its own output folder, resumable.

A task's folder holds `workspace/` (where the agent worked), `best/` (the best candidate the
judge found correct, with the fixed infrastructure), `trajectory.jsonl` and `result.json`.

Retries go by the kind of error (`outcome.py`), never by its text. A rerun skips every task whose
`result.json` records a finished run of the same task: terminated, truncated, or ended by an
error that is not retryable (a bug of the agent fails the same way again). A provider error, a
judge that could not work or an interruption starts the task again from a fresh workspace, as
does an error recorded before errors had kinds. `retries` also starts a run again at once, in
the same call, after a retryable error.

Many tasks run in threads: model calls overlap, judge calls are serialised by the shared
`LocalEvaluator` (one device, clean timings), or go to a pool or a service.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from cuda_agent.tasks import Task

from cuda_agent.llm import ModelClient

from cuda_agent.rollout.evaluator import Evaluator
from cuda_agent.rollout.outcome import InternalError, Outcome

from .loop import RESULT_VERSION, Agent, AgentConfig, AgentProgress
from .tools import Toolbox
from .trajectory import Trajectory
from .workspace import create_workspace

RESULT = "result.json"


def task_folder(task: Task) -> str:
    """A folder name per task: readable, and unique through the content hash."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', task.name)[:80]}-{task.id[:8]}"


def finished(out: Path, task: Task) -> dict | None:
    """The summary of an earlier finished run of `task` in `out`, if there is one."""
    try:
        data = json.loads((out / RESULT).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("task_id") != task.id:
        return None
    if data.get("termination") != "error":
        return data
    error = data.get("error")
    if isinstance(error, dict) and error.get("retryable") is False:
        return data
    return None


def solve_task(task: Task, out: Path, client: ModelClient, gate: Evaluator, config: AgentConfig,
               *, resume: bool = True, stop: threading.Event | None = None, retries: int = 0,
               on_progress: Callable[[AgentProgress], None] | None = None) -> dict:
    """Run the agent on `task` in folder `out`; the run's summary (an earlier one when resuming).
    A run that ends with a retryable error is run again, from scratch, up to `retries` times
    (never after an interruption: whoever stopped it wants it stopped); `attempts` counts the runs.
    `on_progress` receives the loop's progress reports (`AgentProgress`), for a live view."""
    if resume and (done := finished(out, task)) is not None:
        return {**done, "resumed": True}
    attempt = 0
    while True:
        attempt += 1
        summary, outcome = _attempt(task, out, client, gate, config, stop, on_progress)
        if not outcome.retryable or attempt > retries or outcome.error.kind == "interrupted" \
                or (stop is not None and stop.is_set()):
            break
    if attempt > 1:
        summary["attempts"] = attempt
        _write_result(out, summary)
    return summary


def _attempt(task: Task, out: Path, client: ModelClient, gate: Evaluator, config: AgentConfig,
             stop: threading.Event | None, on_progress=None) -> tuple[dict, Outcome]:
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT).unlink(missing_ok=True)
    for old in ("workspace", "best"):
        shutil.rmtree(out / old, ignore_errors=True)
    workspace = create_workspace(task, out / "workspace", gate.device)
    toolbox = Toolbox(task, workspace, gate, config.tools, reward=config.reward)
    try:
        with Trajectory(out / "trajectory.jsonl") as trajectory:
            result = Agent(client, toolbox, config, trajectory, stop=stop, on_progress=on_progress).run()
    finally:
        toolbox.close()
    if result.best is not None:
        result.best.write_workspace(out / "best")
    summary = {**result.summary(), "workspace": str(workspace),
               "best_workspace": str(out / "best") if result.best is not None else None}
    _write_result(out, summary)
    return summary, result.outcome


def _write_result(out: Path, summary: dict) -> None:
    tmp = out / f".{RESULT}.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, out / RESULT)


def run_tasks(tasks: list[Task], out: Path, client: ModelClient, gate: Evaluator, config: AgentConfig, *,
              concurrency: int = 1, on_done=None, retries: int = 0) -> list[dict]:
    """Every task, `concurrency` at a time; summaries in task order (also written to results.jsonl).
    `on_done(summary)` is called from this thread as each task ends."""
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    summaries: dict[str, dict] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="agent")
    try:
        futures = {pool.submit(solve_task, t, out / task_folder(t), client, gate, config, stop=stop,
                               retries=retries): t
                   for t in tasks}
        for fut in as_completed(futures):
            task = futures[fut]
            try:
                summary = fut.result()
            except Exception as exc:  # a bad rollout is data: record it and go on
                outcome = Outcome.failed(InternalError(f"{type(exc).__name__}: {exc}"))
                summary = {"task": task.name, "task_id": task.id, "version": RESULT_VERSION, **outcome.record(),
                           "solved": False, "best": None}
            summaries[task.id] = summary
            if on_done is not None:
                on_done(summary)
    except BaseException:
        stop.set()  # running agents end at their next turn; queued ones never start
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    ordered = [summaries[t.id] for t in tasks if t.id in summaries]
    with (out / "results.jsonl").open("w") as fh:
        for s in ordered:
            fh.write(json.dumps(s) + "\n")
    return ordered
