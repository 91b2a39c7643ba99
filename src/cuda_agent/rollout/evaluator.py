"""The one way the tools and the episodes reach the judge: the `Evaluator` protocol.

    device                            the judge's backend, "cuda" or "cpu"
    local                             True when the judge builds and runs candidates in this process
                                      (per-kernel profiles need the library on this machine)
    evaluate(task, candidate)         -> Verdict; a failed candidate is a verdict, never an exception;
                                      `JudgeError` only when the judge cannot work at all
    build(candidate, task)            -> BuildOutcome; the judge's build step (the `compile` tool)
    exclusive()                       a context manager held while something else uses the device
                                      (profiling), so the judge's timings stay clean
    close()                           idempotent

Implementations: `LocalEvaluator` (a judge in this process, calls serialised), `PoolEvaluator`
(verdicts from a `cuda_agent.pool.Pool`, many in flight), `MemoEvaluator` (wraps any evaluator:
an identical (task, candidate) is judged once), `remote.RemoteEvaluator` (a `cuda-agent serve`
service) and `ray_judge.RayEvaluator` (the node's judge pool as a Ray actor). `check_evaluator`
is the conformance check every implementation passes (Gymnasium's `check_env` idea): run it on
your own evaluator with one honest and one broken candidate of a task. The tools and the episodes
ask through `candidate_verdict`, which never lets a verdict on the judge's own failure be scored as
the candidate's.
"""

from __future__ import annotations

import threading
from typing import ContextManager, Protocol, runtime_checkable

from cuda_agent.candidate import Candidate
from cuda_agent.judge import FailureCategory, Judge, JudgeConfig, JudgeError, Verdict
from cuda_agent.judge.builds import BuildOutcome
from cuda_agent.tasks import Task

DEVICES = ("cuda", "cpu")


@runtime_checkable
class Evaluator(Protocol):
    @property
    def device(self) -> str: ...

    @property
    def local(self) -> bool: ...

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict: ...

    def build(self, candidate: Candidate, task: Task) -> BuildOutcome: ...

    def exclusive(self) -> ContextManager: ...

    def close(self) -> None: ...


class LocalEvaluator:
    """One judge shared by every episode of a process. Its calls are serialised: the judge is not
    thread-safe, and timings need a device nobody else is using. Created on first use."""

    local = True

    def __init__(self, config: JudgeConfig, judge: Judge | None = None):
        self.config = config
        self._judge = judge
        self._lock = threading.Lock()

    @property
    def device(self) -> str:
        return self.config.device

    def _get(self) -> Judge:
        if self._judge is None:
            self._judge = Judge(self.config)
        return self._judge

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        with self._lock:
            return self._get().evaluate(task, candidate)

    def build(self, candidate: Candidate, task: Task | None = None) -> BuildOutcome:
        """The judge's own build step (`Judge.build`): its checks of sources and binary, its cache
        (`task` is for evaluators that judge elsewhere; a build here needs none)."""
        with self._lock:
            return self._get().build(candidate)

    def exclusive(self) -> ContextManager:
        """Hold the judge while something else uses the device (profiling), so timings stay clean."""
        return self._lock

    def close(self) -> None:
        with self._lock:
            if self._judge is not None:
                self._judge.close()
                self._judge = None


class PoolEvaluator(LocalEvaluator):
    """Verdicts from a pool: `evaluate` blocks on `pool.submit(...)`'s future without the local
    lock, so every episode thread can wait on the pool at once while it keeps its GPUs busy. Builds
    for the `compile` tool use a judge of this process (building needs no device). The pool is the
    caller's: `close` releases the local judge only."""

    def __init__(self, pool, config: JudgeConfig):
        super().__init__(config)
        self.pool = pool

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        return self.pool.submit(task, candidate).result()


def candidate_verdict(evaluator: Evaluator, task: Task, candidate: Candidate, *, retries: int = 1) -> Verdict:
    """`evaluator`'s verdict on the candidate, never one on the judge. A verdict whose failure is the
    judge's own (`FailureCategory.JUDGE`: its worker died before any candidate code ran, the GPU was
    out of memory at set-up, a bug of the judge) says nothing of the candidate and must not be scored
    as its failure: it is asked again `retries` times (such failures are often passing: memory another
    process held), then raised as `JudgeError`, which the tools turn into `JudgeFailure` (an episode
    that measured nothing, dropped from training and retried by the agent's runner). A candidate that
    provokes such a verdict on purpose gains nothing by it: its episode is dropped, never rewarded."""
    for _ in range(retries + 1):
        verdict = evaluator.evaluate(task, candidate)
        if _about_the_candidate(verdict):
            return verdict
    raise JudgeError(f"the judge failed on {task.name} (not the candidate's doing), {retries + 1} times; the last: "
                     f"{verdict.failure.message[:2000]}")


def _about_the_candidate(verdict: Verdict) -> bool:
    return verdict.failure is None or verdict.failure.category is not FailureCategory.JUDGE


class MemoEvaluator:
    """Wraps an evaluator: an identical (task id, candidate hash) is judged once per wrapper (a
    training run, where many episodes write the same kernel). Verdicts are kept in memory; a
    judge error, or a verdict on the judge's own failure, is not remembered: the next call asks again."""

    def __init__(self, inner: Evaluator):
        self.inner = inner
        self._memo: dict[tuple[str, str], Verdict] = {}
        self._lock = threading.Lock()
        self.hits = 0

    @property
    def device(self) -> str:
        return self.inner.device

    @property
    def local(self) -> bool:
        return self.inner.local

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        key = (task.id, candidate.hash)
        with self._lock:
            if key in self._memo:
                self.hits += 1
                return self._memo[key]
        verdict = self.inner.evaluate(task, candidate)   # outside the lock: judgements overlap
        if _about_the_candidate(verdict):  # the judge's own failure is asked again next time
            with self._lock:
                self._memo[key] = verdict
        return verdict

    def build(self, candidate: Candidate, task: Task) -> BuildOutcome:
        return self.inner.build(candidate, task)

    def exclusive(self) -> ContextManager:
        return self.inner.exclusive()

    def close(self) -> None:
        self.inner.close()


# ---------------------------------------------------------------------------------------------
# Conformance


class EvaluatorCheckError(AssertionError):
    """An evaluator broke the protocol's contract; the message says which part."""


def _require(ok: bool, what: str) -> None:
    if not ok:   # not `assert`: the check must hold under `python -O` too
        raise EvaluatorCheckError(what)


def check_evaluator(ev: Evaluator, task: Task, honest: Candidate, broken: Candidate) -> None:
    """Check `ev` against the protocol's contract with a real judgement: `honest` must be judged
    correct and `broken` (a candidate that loads but computes something else, or does not build)
    not. Raises EvaluatorCheckError naming the first broken promise; closes `ev` (twice: close
    must be idempotent). What it does not check: timing quality, isolation, concurrency."""
    _require(isinstance(ev, Evaluator), f"{type(ev).__name__} lacks part of the Evaluator protocol "
             "(device, local, evaluate, build, exclusive, close)")
    _require(ev.device in DEVICES, f"device is {ev.device!r}, expected one of {DEVICES}")
    _require(isinstance(ev.local, bool), f"local is {ev.local!r}, expected a bool")
    _require(honest.hash != broken.hash, "the honest and the broken candidate are the same bytes")
    good = ev.evaluate(task, honest)
    _require(isinstance(good, Verdict), f"evaluate returned {type(good).__name__}, expected Verdict")
    _require(good.task_id == task.id and good.candidate_hash == honest.hash,
             "the verdict is about another task or candidate than the one asked")
    _require(good.device == ev.device, f"the verdict's device {good.device!r} is not the evaluator's {ev.device!r}")
    _require(good.correct and good.failure is None,
             f"the honest candidate was not judged correct: {good.failure.message if good.failure else good}")
    _require(good.runtime_ms is not None and good.runtime_ms > 0, "a correct verdict without a runtime")
    bad = ev.evaluate(task, broken)
    _require(isinstance(bad, Verdict), f"evaluate returned {type(bad).__name__} for the broken candidate")
    _require(bad.candidate_hash == broken.hash, "the broken candidate's verdict is about another candidate")
    _require(not bad.correct and bad.failure is not None,
             "the broken candidate was judged correct, or failed without a failure category")
    built = ev.build(honest, task)
    _require(isinstance(built, BuildOutcome), f"build returned {type(built).__name__}, expected BuildOutcome")
    _require(built.compiled and built.failure is None,
             f"the honest candidate did not build: {built.failure.message if built.failure else built}")
    outcome = ev.build(broken, task)
    _require(isinstance(outcome, BuildOutcome) and (outcome.compiled or outcome.failure is not None),
             "a build that did not compile must say why (failure)")
    lock = ev.exclusive()
    _require(hasattr(lock, "__enter__") and hasattr(lock, "__exit__"), "exclusive() is not a context manager")
    with lock:
        pass
    ev.close()
    ev.close()   # a second close must be harmless
