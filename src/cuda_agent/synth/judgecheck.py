"""The judge's reference checks over many tasks, in parallel judge processes.

`Judge.check_reference` holds one task to the judge's own checks (its reference reproduced in an
isolated process on the judge's fresh inputs, inputs left unmodified, degenerate-output warnings).
`check_tasks` runs it over (name, source) pairs in `parallel` spawned processes, each with its own
Judge (and so its own sandbox uids), taking the visible GPUs in turn. A judge process that dies
loses only the tasks it had not reported: they are absent from the result, never counted as passed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from typing import Callable

from pydantic import BaseModel, ConfigDict


class ReferenceCheck(BaseModel):
    """What the judge said about one task."""

    model_config = ConfigDict(frozen=True)
    name: str
    ok: bool
    warned: bool = False            # the judge's task warnings (degenerate outputs) were raised
    eager_ms: float | None = None   # the reference's time under the judge's call protocol
    failure: str | None = None


def _judge_process(items: list[tuple[str, str]], device: str, gpu: str | None, results) -> None:
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu   # before this process initialises CUDA
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.tasks import Task

    # Five checked input sets as always; few timed calls: this checks the task, not a kernel's speed.
    with Judge(JudgeConfig(device=device, n_warmup=1, n_timed=5, compile_mode="none")) as judge:
        for name, source in items:
            try:
                v = judge.check_reference(Task.from_source(source, name=name))
                rec = ReferenceCheck(name=name, ok=bool(v.correct), warned=bool(v.task_warnings),
                                     eager_ms=v.eager.median_ms if v.eager else None,
                                     failure=v.failure.message[:500] if v.failure else None)
            except Exception as exc:  # noqa: BLE001 - a task the judge cannot even take fails, with why
                rec = ReferenceCheck(name=name, ok=False, failure=f"{type(exc).__name__}: {exc}"[:500])
            results.put(rec.model_dump())


def check_tasks(items: list[tuple[str, str]], device: str, parallel: int = 4,
                on_result: Callable[[ReferenceCheck], None] | None = None) -> dict[str, ReferenceCheck]:
    """The judge's reference checks of every (name, source), `parallel` judges at a time."""
    if not items:
        return {}
    from cuda_agent.pool import visible_gpus

    gpus = visible_gpus() if device == "cuda" else []
    parallel = max(1, min(parallel, len(items)))
    ctx = mp.get_context("spawn")   # a fresh interpreter: no CUDA state or threads inherited
    results = ctx.Queue()
    procs = [ctx.Process(target=_judge_process, args=(items[i::parallel], device,
                                                      gpus[i % len(gpus)] if gpus else None, results))
             for i in range(parallel)]
    for p in procs:
        p.start()
    got: dict[str, ReferenceCheck] = {}
    finished = False
    try:
        while len(got) < len(items):
            try:
                rec = ReferenceCheck(**results.get(timeout=1.0))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break   # every judge is gone: what they did not report stays unjudged
                continue
            got[rec.name] = rec
            if on_result is not None:
                on_result(rec)
        finished = True
    finally:
        for p in procs:
            if not finished:   # interrupted: no waiting (their sandboxes die with them)
                p.kill()
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return got
