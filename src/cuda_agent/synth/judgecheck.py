"""The judge's reference checks over many tasks, in parallel judge processes.

`Judge.check_reference` holds one task to the judge's own checks (its reference reproduced in an
isolated process on the judge's fresh inputs, inputs left unmodified, degenerate-output warnings).
`check_tasks` runs it over (name, source) pairs in `parallel` spawned processes, each with its own
Judge (and so its own sandbox uids), taking the visible GPUs in turn. A judge process that dies
loses only the tasks it had not reported: they are absent from the result, never counted as passed.

Judges sharing a GPU can run it out of memory together, which says nothing about the task: a task
that ran out of GPU memory is checked again afterwards by one judge alone on the GPU, and only
that verdict counts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from typing import Callable

from pydantic import BaseModel, ConfigDict

from cuda_agent.host import is_out_of_memory


class ReferenceCheck(BaseModel):
    """What the judge said about one task."""

    model_config = ConfigDict(frozen=True)
    name: str
    ok: bool
    warned: bool = False            # the judge's task warnings (degenerate outputs) were raised
    eager_ms: float | None = None   # the reference's time under the judge's call protocol
    failure: str | None = None
    out_of_memory: bool = False     # failed for want of GPU memory (checked again alone)


def _brief(message: str, limit: int = 800) -> str:
    """The first line (what failed) and the end (the exception that says why) of a long message."""
    if len(message) <= limit:
        return message
    head = message.splitlines()[0][:200]
    return f"{head} [...] {message[-(limit - len(head) - 7):]}"


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
                cause, failure = v.failure, (v.failure.message if v.failure else None)
                rec = ReferenceCheck(name=name, ok=bool(v.correct), warned=bool(v.task_warnings),
                                     eager_ms=v.eager.median_ms if v.eager else None)
            except Exception as exc:  # noqa: BLE001 - a task the judge cannot even take fails, with why
                cause = failure = f"{type(exc).__name__}: {exc}"
                rec = ReferenceCheck(name=name, ok=False)
            if failure is not None:
                rec = rec.model_copy(update={"failure": _brief(failure), "out_of_memory": is_out_of_memory(cause)})
            results.put(rec.model_dump())
            if device == "cuda":   # what this task's check cached is not held while the next one runs
                import torch

                torch.cuda.empty_cache()


def check_tasks(items: list[tuple[str, str]], device: str, parallel: int = 4,
                on_result: Callable[[ReferenceCheck], None] | None = None) -> dict[str, ReferenceCheck]:
    """The judge's reference checks of every (name, source), `parallel` judges at a time; the tasks
    that ran out of GPU memory among them again with one judge (their first verdict is not
    reported). `on_result` hears each verdict that counts as it comes."""
    def first(rec: ReferenceCheck) -> None:
        if on_result is not None and not (rec.out_of_memory and parallel > 1):
            on_result(rec)

    got = _run_judges(items, device, parallel, first)
    again = [(name, source) for name, source in items if name in got and got[name].out_of_memory]
    if again and parallel > 1:
        for name, _ in again:
            del got[name]
        got.update(_run_judges(again, device, 1, on_result))
    return got


def _run_judges(items: list[tuple[str, str]], device: str, parallel: int,
                on_result: Callable[[ReferenceCheck], None] | None) -> dict[str, ReferenceCheck]:
    if not items:
        return {}
    from cuda_agent.host import visible_gpus

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
