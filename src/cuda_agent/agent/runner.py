"""Runs of the agent on tasks, each in its own output folder, resumable.

A task's folder holds `workspace/` (where the agent worked), `best/` (the best candidate the
judge found correct, with the fixed infrastructure), `trajectory.jsonl` and `result.json`. A
rerun skips every task whose `result.json` records a finished run of the same task (ended by
anything but an error); an interrupted or failed task starts again from a fresh workspace.

Many tasks run in threads: model calls overlap, judge calls are serialised by the shared
`JudgeGate` (one device, clean timings).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from cuda_agent.tasks import Task

from .client import ModelClient
from .loop import Agent, AgentConfig
from .tools import JudgeGate, Toolbox
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
    if isinstance(data, dict) and data.get("task_id") == task.id and data.get("termination") != "error":
        return data
    return None


def solve_task(task: Task, out: Path, client: ModelClient, gate: JudgeGate, config: AgentConfig,
               *, resume: bool = True, stop: threading.Event | None = None) -> dict:
    """Run the agent on `task` in folder `out`; the run's summary (an earlier one when resuming)."""
    if resume and (done := finished(out, task)) is not None:
        return {**done, "resumed": True}
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT).unlink(missing_ok=True)
    for old in ("workspace", "best"):
        shutil.rmtree(out / old, ignore_errors=True)
    workspace = create_workspace(task, out / "workspace", gate.device)
    toolbox = Toolbox(task, workspace, gate, config.tools)
    try:
        with Trajectory(out / "trajectory.jsonl") as trajectory:
            result = Agent(client, toolbox, config, trajectory, stop=stop).run()
    finally:
        toolbox.close()
    if result.best is not None:
        result.best.write_workspace(out / "best")
    summary = {**result.summary(), "workspace": str(workspace),
               "best_workspace": str(out / "best") if result.best is not None else None}
    tmp = out / f".{RESULT}.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, out / RESULT)
    return summary


def run_tasks(tasks: list[Task], out: Path, client: ModelClient, gate: JudgeGate, config: AgentConfig, *,
              concurrency: int = 1, on_done=None) -> list[dict]:
    """Every task, `concurrency` at a time; summaries in task order (also written to results.jsonl).
    `on_done(summary)` is called from this thread as each task ends."""
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    summaries: dict[str, dict] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="agent")
    try:
        futures = {pool.submit(solve_task, t, out / task_folder(t), client, gate, config, stop=stop): t
                   for t in tasks}
        for fut in as_completed(futures):
            task = futures[fut]
            try:
                summary = fut.result()
            except Exception as exc:  # a bad rollout is data: record it and go on
                summary = {"task": task.name, "task_id": task.id, "termination": "error",
                           "message": f"{type(exc).__name__}: {exc}", "solved": False, "best": None}
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
