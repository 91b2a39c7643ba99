"""The judge's reference checks over many tasks, in parallel judge processes.

`Judge.check_reference` holds one task to the judge's own checks (its reference reproduced in an
isolated process on the judge's fresh inputs, inputs left unmodified, degenerate-output warnings).
`check_tasks` runs it over (name, source) pairs in `parallel` spawned processes, each with its own
Judge (and so its own sandbox uids), taking the visible GPUs in turn. A judge process that dies
loses only the tasks it had not reported: they are absent from the result, never counted as passed.

Judges sharing a GPU can run it out of memory together, which says nothing about the task: a task
that ran out of GPU memory is checked again afterwards by one judge alone on the GPU, and only
that verdict counts.

`JudgeStream` keeps such judges up while the synthesis filters run and feeds them each task as the
filters accept it (SynthConfig.judge_overlap); what it cannot answer is left to `check_tasks`.
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


def _judge_process(items, device: str, gpu: str | None, results, held=None, slot: int = 0) -> None:
    """Checks `items` (a list of (name, source)) and puts each ReferenceCheck on `results`. With
    `held` (JudgeStream's shared array), `items` is a queue of (number, name, source) ended by None,
    and the number of the task taken is written to held[slot] first: shared memory, in place at
    once, so that the task of a judge that dies on it is known (a queued message might not leave
    a process that exits abruptly)."""
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu   # before this process initialises CUDA
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.tasks import Task

    taken = iter(items) if held is None else iter(items.get, None)
    # Five checked input sets as always; few timed calls: this checks the task, not a kernel's speed.
    with Judge(JudgeConfig(device=device, n_warmup=1, n_timed=5, compile_mode="none")) as judge:
        for item in taken:
            if held is not None:
                held[slot] = item[0]
                item = item[1:]
            name, source = item
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


class JudgeStream:
    """Judge processes that stay up and take tasks as they come, so that the reference checks run
    beside the synthesis filters instead of after them (SynthConfig.judge_overlap).

    `submit` queues a task; `results` returns the verdicts that came in. A task whose check ran
    out of GPU memory (the filters hold most of it meanwhile) and a task whose judge process died
    are not answered here: they leave `in_flight` unjudged, for the checks after the filters stop
    (`check_tasks`, where an out-of-memory task gets the GPU to one judge). A judge that dies is
    started again, up to RESTARTS times per slot."""

    RESTARTS = 3

    def __init__(self, device: str, parallel: int):
        from cuda_agent.host import visible_gpus

        self.device = device
        self._ctx = mp.get_context("spawn")   # a fresh interpreter: no CUDA state or threads inherited
        self._tasks = self._ctx.Queue()
        self._results = self._ctx.Queue()
        self._gpus = visible_gpus() if device == "cuda" else []
        self._procs: list = [None] * max(1, parallel)
        self._restarts = [0] * len(self._procs)
        self._held = self._ctx.Array("q", [-1] * len(self._procs))   # slot -> number of the task taken last
        self._numbers: dict[int, str] = {}     # number -> name, of the tasks submitted
        self.in_flight: dict[str, str] = {}    # name -> source, submitted and not yet answered
        self.unjudged: list[str] = []          # out of memory, or lost with a judge: for later
        for slot in range(len(self._procs)):
            self._start(slot)

    def _start(self, slot: int) -> None:
        gpu = self._gpus[slot % len(self._gpus)] if self._gpus else None
        self._held[slot] = -1
        p = self._ctx.Process(target=_judge_process, args=(self._tasks, self.device, gpu, self._results, self._held, slot))
        p.start()
        self._procs[slot] = p

    def submit(self, name: str, source: str) -> None:
        self.in_flight[name] = source
        number = len(self._numbers)
        self._numbers[number] = name
        self._tasks.put((number, name, source))

    def alive(self) -> bool:
        return any(p is not None and p.is_alive() for p in self._procs)

    def results(self, timeout: float = 0.0) -> list[ReferenceCheck]:
        """The verdicts that came in (waiting up to `timeout` seconds for the first)."""
        out: list[ReferenceCheck] = []
        wait_s = timeout
        while True:
            try:
                msg = self._results.get(timeout=wait_s) if wait_s > 0 else self._results.get_nowait()
            except queue.Empty:
                break
            wait_s = 0.0
            rec = ReferenceCheck(**msg)
            if self.in_flight.pop(rec.name, None) is None:
                continue   # not asked for here (or already given up on)
            if rec.out_of_memory and len(self._procs) > 1:
                self.unjudged.append(rec.name)
                continue
            out.append(rec)
        self._reap()
        return out

    def _reap(self) -> None:
        for slot, p in enumerate(self._procs):
            if p is None or p.is_alive():
                continue
            # the task it held is lost (a verdict of it still on its way counts as lost too: the
            # task is checked again later, never counted twice)
            name = self._numbers.get(self._held[slot])
            self._held[slot] = -1
            if name is not None and self.in_flight.pop(name, None) is not None:
                self.unjudged.append(name)
            if self._restarts[slot] < self.RESTARTS:
                self._restarts[slot] += 1
                self._start(slot)
            else:
                self._procs[slot] = None
        if self.in_flight and not self.alive():
            # every judge is gone for good: what they had not answered stays unjudged
            self.unjudged.extend(self.in_flight)
            self.in_flight.clear()

    def close(self) -> None:
        """Stop the judges: each takes the end mark once its current task is done; a judge that
        does not stop within 30 s is killed."""
        for p in self._procs:
            if p is not None and p.is_alive():
                self._tasks.put(None)
        for p in self._procs:
            if p is not None:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=10)
        self._procs = [None] * len(self._procs)

    def kill(self) -> None:
        """Stop now (an interrupted run): their sandboxes die with them."""
        for p in self._procs:
            if p is not None and p.is_alive():
                p.kill()
        self.close()


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
