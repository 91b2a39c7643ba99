"""The pool: `submit(task, candidate) -> Future[Verdict]` over long-lived judge and compile workers.

Workers:
* one judge worker per visible GPU (on the CPU backend, `judge_workers` of them, default 1), each
  owning one `Judge`: it keeps its references, baselines and (on CPU) its zygote warm between
  candidates. A judge evaluates one candidate at a time, in sandboxed processes of its own. With
  `judges_per_gpu` > 1 several judges share each GPU and take turns for timed calls through the
  GPU's lock (`cuda_agent.judge.devlock`), as the CPU backend's judges do through the host's;
* compile workers that build the candidates waiting in the queue into the judge's content-addressed
  build cache, so that when a judge worker takes the candidate its build is a cache hit.

Scheduling (one dispatcher thread):
* the queue is bounded: `submit` blocks while `max_queue` candidates wait (back-pressure);
* an idle judge worker takes the oldest waiting candidate whose build is done (or not needed),
  else the oldest one; a prebuild that has not started by then is dropped (the judge builds);
* a task's first candidate on each GPU model runs alone until it finishes: it measures (or loads)
  the task's eager and torch.compile baselines on that model, which every later candidate of that
  task on a GPU of that model then reuses, so each task pays for torch.compile once per model;
* each candidate has a time limit on its judge worker (`time_limit_s`, plus `baseline_allowance_s`
  for a task's first candidate). A worker past it is wedged (a hung CUDA context, a stuck driver
  call): it is killed and replaced, and the candidate gets a `timeout` verdict;
* judges that share a GPU share its memory: a candidate whose judging ran out of GPU memory
  there (in the judge's own work, a baseline's or the candidate's process) is judged again alone
  on a GPU, once: that GPU's other judges finish what they hold (giving back their allocators'
  cache) and take nothing new until it is done, so a task too large to share a GPU is not judged
  against memory others hold. Its verdict says so;
* a judge worker that dies while judging is replaced and the candidate is retried on the new
  worker, up to `max_attempts` in all; a candidate that kills its worker every time gets a `crash`
  verdict. A worker that cannot start three times in a row is given up; when no judge worker is
  left, every waiting future fails with `PoolError`.

Futures resolve to a `Verdict`, or raise `JudgeError` when the judge could not work on the task
(a broken reference), or `PoolError` when the pool itself could not. The pool adds two entries to
a verdict's `phase_s`: `pool_queue` (seconds from submit until a judge worker took it) and
`prebuild` (seconds a compile worker spent on it, when one did).
"""

from __future__ import annotations

import os
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent import host
from cuda_agent.candidate import Candidate
from cuda_agent.host import visible_gpus  # noqa: F401 (re-exported by cuda_agent.pool)
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.harness import JudgeError
from cuda_agent.judge.verdict import Failure, FailureCategory, Verdict
from cuda_agent.tasks import Task

from .transport import (CompileRequest, Hello, JudgeReply, JudgeRequest, LocalTransport, PlacementError,
                        PrebuildReport, StartupFailed, Stop, Transport, WorkerGone, WorkerHandle, WorkerSpec)

MAX_SLOTS = 64          # per role; sets the range of sandbox uids a pool uses
START_ATTEMPTS = 3      # consecutive failed starts before a worker slot is given up
# How PyTorch and the CUDA runtime say a device allocation failed (OutOfMemoryError's message, the
# runtime's error name and text), wherever it happened: the judge's process, a baseline's, the candidate's
_GPU_OOM = re.compile(r"CUDA out of memory|cudaErrorMemoryAllocation|CUDA error: out of memory")
ALONE_NOTE = ("judged again alone on its GPU: the first try ran out of GPU memory while other judges "
              "of that GPU held theirs")
# the verdicts a GPU allocation that failed can end in (the judge's own, the candidate's init,
# forward, process death or memory limit); a build, load or policy failure is settled before any
_MEMORY_FAILURES = frozenset({FailureCategory.JUDGE, FailureCategory.INIT, FailureCategory.RUNTIME,
                              FailureCategory.CRASH, FailureCategory.OOM})


class PoolError(RuntimeError):
    """The pool cannot judge (no worker could start, or it was shut down)."""


class PoolFull(PoolError):
    """`submit(..., timeout=...)` found the queue full for the whole timeout."""


class PoolConfig(BaseModel):
    """Settings of the pool (the judge's own settings are its `JudgeConfig`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    judge_workers: int | None = Field(
        None, ge=1, description="judge workers; cuda: one per visible GPU (at most that many), cpu: default 1")
    judges_per_gpu: int = Field(
        1, ge=1, le=8, description="CUDA: judge workers per GPU. With more than one they check candidates at "
                                   "the same time and take turns for timed calls, which each holds the GPU "
                                   "alone for (JudgeConfig.device_lock)")
    compile_workers: int | None = Field(
        None, ge=0, description="compile workers (0: none); default cuda: one per core the judges' timing cores "
                                "leave (cores - judge workers - 1 on machines too small to give each judge two), "
                                "cpu: cores - judge workers - 1 but 0 on small machines, where they would slow "
                                "the judged calls")
    max_queue: int | None = Field(
        None, ge=1, description="candidates waiting for a judge before submit blocks; "
                                "default 4 x judge workers + 2 x compile workers")
    time_limit_s: float | None = Field(
        None, gt=0, description="limit on one candidate on a judge worker; default the judge's "
                                "total_timeout_s + build_timeout_s + 60")
    baseline_allowance_s: float | None = Field(
        None, ge=0, description="extra time for a task's first candidate, which measures the baselines; "
                                "default 3 x the judge's total_timeout_s")
    startup_timeout_s: float = Field(300.0, gt=0, description="limit on a worker's start (imports, CUDA init)")
    max_attempts: int = Field(2, ge=1, description="tries of a candidate whose judge worker died under it")
    baseline_db: Path | None = Field(None, description="results database holding the baselines (None: the "
                                                       "judge's file cache)")
    judge_factory: str = Field("cuda_agent.judge:Judge", description="module:callable(config, baseline_store) "
                                                                     "making a judge (tests use stand-ins)")


class PoolStats(BaseModel):
    submitted: int = 0
    judged: int = 0                # verdicts delivered (timeouts and crash verdicts included)
    judge_errors: int = 0          # futures failed with JudgeError
    timeouts: int = 0              # candidates whose worker wedged past the time limit
    worker_deaths: int = 0         # judge or compile workers that died or were killed
    worker_starts: int = 0
    retries: int = 0
    alone_retries: int = 0         # candidates judged again alone on a GPU after running out of its memory
    prebuilds: int = 0             # compile-worker reports
    prebuilt_in_time: int = 0      # candidates whose prebuild had finished when a judge took them
    prebuild_built: int = 0
    prebuild_cached: int = 0
    prebuild_failed: int = 0
    prebuild_s: float = 0.0        # compile-worker seconds, summed
    judge_s: float = 0.0           # judge-worker seconds on candidates, summed


@dataclass
class _Job:
    id: int
    task: Task
    candidate: Candidate
    future: Future
    submitted: float
    prebuild: Literal["none", "queued", "running", "done"] = "none"
    prebuild_s: float | None = None
    attempts: int = 0
    claimed: bool = False          # its future was marked running (done once, on the first pick)
    started: float | None = None
    deadline: float | None = None
    device_name: str = ""          # the GPU model of the judge worker it was given to
    alone: bool = False            # to be judged again alone on a GPU (it ran out of GPU memory beside others)
    alone_gpu: str | None = None   # the GPU whose judges drain for it (chosen when it is next due)

    @property
    def baseline_key(self) -> tuple[str, str]:
        return (self.task.id, self.device_name)


@dataclass
class _Slot:
    role: Literal["judge", "compile"]
    index: int
    spec: WorkerSpec
    handle: WorkerHandle | None = None
    state: Literal["starting", "idle", "busy", "dead"] = "starting"
    since: float = 0.0
    job: _Job | None = None
    device_name: str = ""
    arch: str | None = None
    start_failures: int = 0
    last_error: str = ""

    @property
    def gpu(self) -> str | None:
        """The GPU a judge worker shares with the others of its placement (None: not known here)."""
        if self.role != "judge":
            return None
        return self.spec.env.get("CUDA_VISIBLE_DEVICES") or None  # "" on the CPU backend: none


class Pool:
    """Judge candidates concurrently. Use as a context manager, or call `shutdown()`."""

    def __init__(self, config: JudgeConfig, pool_config: PoolConfig | None = None,
                 transport: Transport | None = None):
        self.config = config
        self.pool_config = pc = pool_config or PoolConfig()
        self.transport = transport or LocalTransport()
        try:
            place = self.transport.placement(config, pc.judge_workers, pc.compile_workers, pc.judges_per_gpu)
        except PlacementError as exc:
            raise PoolError(str(exc)) from None
        n_judges, n_compile, timing, rest = place.judges, place.compile_workers, place.timing_cpus, place.spare_cpus
        if n_judges > MAX_SLOTS or n_compile > MAX_SLOTS:
            raise PoolError(f"at most {MAX_SLOTS} judge and {MAX_SLOTS} compile workers")
        self.n_judges, self.n_compile = n_judges, n_compile
        self.max_queue = pc.max_queue or (4 * n_judges + 2 * n_compile)
        self.time_limit_s = pc.time_limit_s or (config.total_timeout_s + config.build_timeout_s + 60.0)
        # A prebuild may build one spec per GPU architecture; each build has the judge's own limit.
        self._compile_limit_s = 2 * config.build_timeout_s + 120.0
        self.baseline_allowance_s = (pc.baseline_allowance_s if pc.baseline_allowance_s is not None
                                     else 3 * config.total_timeout_s)

        # Distinct sandbox uids per worker (used when running as root): a judge's clean-up kills
        # every process of its uid, which must never reach another worker's candidate or build.
        # They are leased for the pool's life, so that no other process (another pool, a judge) takes
        # them; a given `sandbox_uid` numbers the judge slots instead (the caller's to keep apart).
        offsets = ([] if config.sandbox_uid is not None else list(range(n_judges))) + \
            [MAX_SLOTS + j for j in range(n_compile)]
        self._uid_lease = host.lease_uids(host.JUDGE_UIDS, offsets, os.getpid()) if offsets else None
        base = self._uid_lease.base if self._uid_lease is not None else host.JUDGE_UIDS.start
        self._slots: list[_Slot] = []
        for i in range(n_judges):
            uid = (config.sandbox_uid + i) if config.sandbox_uid is not None else base + i
            spec = WorkerSpec(role="judge", slot=i, config=config.model_copy(update={
                                  "sandbox_uid": uid, "timing_cpus": timing[i], "spare_cpus": rest}),
                              env=place.judge_env[i], baseline_db=pc.baseline_db, judge_factory=pc.judge_factory,
                              share_device=pc.judges_per_gpu > 1 if config.device == "cuda" else n_judges > 1,
                              gpu_share=1.0 / pc.judges_per_gpu)
            self._slots.append(_Slot("judge", i, spec))
        for j in range(n_compile):
            spec = WorkerSpec(role="compile", slot=j, config=config, build_uid=host.build_uid(base + MAX_SLOTS + j),
                              build_jobs=place.build_jobs,
                              cpus=rest, nice=10)
            self._slots.append(_Slot("compile", j, spec))

        self._cond = threading.Condition()
        self._queue: list[_Job] = []             # waiting for a judge worker, in submission order
        self._jobs: dict[int, _Job] = {}          # every unfinished job
        self._next_id = 0
        # Baselines are per task and GPU model: a task's first candidate on each model runs alone.
        self._warm: set[tuple[str, str]] = set()         # (task id, device name) whose first candidate finished
        self._in_flight: dict[tuple[str, str], int] = {}  # (task id, device name) -> candidates on judge workers
        self._archs: set[str | None] = {config.arch} if (config.arch or config.device == "cpu") else set()
        self._stats = PoolStats()
        self._alone_on: dict[str, int] = {}   # GPU -> id of the job judged alone there now
        self._closing = False
        self._hard_stop = False
        self._broken: str | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cuda-agent-pool", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------ public API
    def submit(self, task: Task, candidate: Candidate, timeout: float | None = None) -> Future:
        """Queue a candidate; blocks while the queue is full (raises `PoolFull` after `timeout`)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._broken:
                    raise PoolError(self._broken)
                if self._closing:
                    raise PoolError("the pool is shut down")
                if len(self._queue) < self.max_queue:
                    break
                remaining = None if end is None else end - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise PoolFull(f"{len(self._queue)} candidates waiting (max_queue {self.max_queue})")
                self._cond.wait(remaining if remaining is not None else 1.0)
            job = _Job(id=self._next_id, task=task, candidate=candidate, future=Future(),
                       submitted=time.monotonic(), prebuild="queued" if self.n_compile else "none")
            self._next_id += 1
            self._queue.append(job)
            self._jobs[job.id] = job
            self._stats.submitted += 1
            self._cond.notify_all()
        return job.future

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until a judge worker is ready (True), or the pool is broken (raises PoolError)."""
        ok = self._ready.wait(timeout)
        if self._broken:
            raise PoolError(self._broken)
        return ok

    def stats(self) -> PoolStats:
        with self._cond:
            return self._stats.model_copy()

    def workers_ready(self) -> dict[str, int]:
        """How many judge and compile workers have started and are serving (idle or busy)."""
        with self._cond:
            return {role: sum(s.role == role and s.state in ("idle", "busy") for s in self._slots)
                    for role in ("judge", "compile")}

    def device_names(self) -> list[str]:
        with self._cond:
            return sorted({s.device_name for s in self._slots if s.role == "judge" and s.device_name})

    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop accepting work. `wait`: finish what was submitted first; otherwise (or with
        `cancel_futures`) waiting candidates are cancelled and running ones fail with PoolError."""
        with self._cond:
            self._closing = True
            if cancel_futures or not wait:
                for job in self._queue:
                    if job.future.cancel() or job.future.done():
                        self._jobs.pop(job.id, None)
                self._queue = [j for j in self._queue if j.id in self._jobs]
            if not wait:
                self._hard_stop = True
            self._cond.notify_all()
        self._thread.join()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)

    # ------------------------------------------------------------------------------ dispatcher
    def _loop(self) -> None:
        now = time.monotonic()
        with self._cond:
            for slot in self._slots:
                self._start(slot, now)
        try:
            while True:
                with self._cond:
                    if self._hard_stop or (self._closing and not self._jobs) or self._broken:
                        break
                    handles = [s.handle for s in self._slots if s.handle is not None and s.state != "dead"]
                self.transport.wait(handles, 0.05)
                resolved: list[tuple[Future, object]] = []
                with self._cond:
                    now = time.monotonic()
                    for slot in self._slots:
                        if slot.handle is not None and slot.state != "dead":
                            self._service(slot, now, resolved)
                    self._assign(now)
                    self._cond.notify_all()
                _resolve(resolved)
        finally:
            resolved = []
            with self._cond:
                reason = self._broken or "the pool was shut down before this candidate finished"
                for job in list(self._jobs.values()):
                    if not job.future.done():
                        if job.started is None and job.future.cancel():
                            continue
                        resolved.append((job.future, PoolError(reason)))
                self._jobs.clear()
                self._queue.clear()
                self._closing = True
                self._cond.notify_all()
            _resolve(resolved)
            self._stop_workers()
            if self._uid_lease is not None:   # its workers are stopped: the uids may go to others
                self._uid_lease.close()
            self._ready.set()

    def _start(self, slot: _Slot, now: float) -> None:
        slot.state, slot.since, slot.job = "starting", now, None
        try:
            slot.handle = self.transport.start(slot.spec)
        except Exception as exc:  # could not even start a process (resources): count it as a failed start
            slot.handle = None
            slot.last_error = f"{type(exc).__name__}: {exc}"
            self._start_failed(slot, now)
            return
        self._stats.worker_starts += 1

    def _start_failed(self, slot: _Slot, now: float) -> None:
        slot.start_failures += 1
        if slot.handle is not None:
            slot.handle.kill()
        if slot.start_failures >= START_ATTEMPTS:
            slot.state, slot.handle = "dead", None
            if not any(s.role == "judge" and s.state != "dead" for s in self._slots):
                self._broken = f"no judge worker could start: {slot.last_error}"
                self._ready.set()
            return
        self._start(slot, now)

    def _service(self, slot: _Slot, now: float, resolved: list) -> None:
        handle = slot.handle
        try:
            while (message := handle.poll(0)) is not None:
                self._on_message(slot, message, now, resolved)
                if slot.handle is not handle:  # replaced while handling (a failed start)
                    return
        except WorkerGone:
            pass
        if slot.state == "busy" and slot.role == "judge" and slot.job and now > slot.job.deadline:
            self._wedged(slot, now, resolved)
        elif slot.state == "busy" and slot.role == "compile" and now - slot.since > self._compile_limit_s:
            handle.kill()  # the builder has its own per-build limit; this catches a stuck worker
            self._died(slot, now, resolved)
        elif slot.state == "starting" and now - slot.since > self.pool_config.startup_timeout_s:
            slot.last_error = f"no answer within {self.pool_config.startup_timeout_s:.0f} s of starting"
            self._start_failed(slot, now)
        elif slot.handle is handle and not handle.alive():
            self._died(slot, now, resolved)

    def _on_message(self, slot: _Slot, message, now: float, resolved: list) -> None:
        if isinstance(message, Hello):
            slot.state, slot.since, slot.start_failures = "idle", now, 0
            if slot.role == "judge":
                slot.device_name, slot.arch = message.device_name, message.arch
                self._archs.add(message.arch)
                self._ready.set()
        elif isinstance(message, StartupFailed):
            slot.last_error = message.message
            self._start_failed(slot, now)
        elif isinstance(message, JudgeReply):
            job = slot.job
            slot.state, slot.since, slot.job = "idle", now, None
            if job is None or job.id != message.job_id:
                return
            self._release(job)
            if self._again_alone(slot, job, message):
                return
            self._finish(job)
            self._stats.judge_s += now - (job.started or now)
            if message.verdict is not None:
                verdict = message.verdict
                if job.alone:
                    verdict.notes.append(ALONE_NOTE)
                verdict.phase_s["pool_queue"] = (job.started or now) - job.submitted
                if job.prebuild_s is not None:
                    verdict.phase_s["prebuild"] = job.prebuild_s
                self._stats.judged += 1
                resolved.append((job.future, verdict))
            else:
                self._stats.judge_errors += 1
                resolved.append((job.future, JudgeError(message.judge_error or "the judge failed")))
        elif isinstance(message, PrebuildReport):
            job = slot.job
            slot.state, slot.since, slot.job = "idle", now, None
            self._stats.prebuilds += 1
            self._stats.prebuild_built += message.built
            self._stats.prebuild_cached += message.cached
            self._stats.prebuild_failed += message.failed
            self._stats.prebuild_s += message.seconds
            if job is not None and job.id == message.job_id:
                job.prebuild, job.prebuild_s = "done", message.seconds

    def _again_alone(self, slot: _Slot, job: _Job, message: JudgeReply) -> bool:
        """Whether this reply is a try that ran out of GPU memory beside other judges of its GPU,
        and the job goes back to the front of the queue to be judged alone (once)."""
        if job.alone or slot.gpu is None:
            return False
        if not any(s is not slot and s.role == "judge" and s.gpu == slot.gpu for s in self._slots):
            return False  # the GPU was its judge's alone: memory others held is not why
        if message.verdict is None:
            text = message.judge_error or ""
        elif message.verdict.failure is not None and message.verdict.failure.category in _MEMORY_FAILURES:
            text = message.verdict.failure.message
        else:
            return False
        if not _GPU_OOM.search(text):
            return False
        job.alone, job.deadline = True, None
        self._stats.alone_retries += 1
        self._queue.insert(0, job)
        return True

    def _release(self, job: _Job) -> None:
        """The job left its judge worker (answered, wedged or died)."""
        for gpu, job_id in list(self._alone_on.items()):
            if job_id == job.id:
                del self._alone_on[gpu]
        left = self._in_flight.get(job.baseline_key, 1) - 1
        if left > 0:
            self._in_flight[job.baseline_key] = left
        else:
            self._in_flight.pop(job.baseline_key, None)

    def _finish(self, job: _Job) -> None:
        """The job has its outcome: the task's baselines are settled one way or the other."""
        self._jobs.pop(job.id, None)
        self._warm.add(job.baseline_key)

    def _pool_verdict(self, job: _Job, slot: _Slot, category: FailureCategory, message: str, now: float) -> Verdict:
        """A verdict the pool gives when the judge worker could not give one."""
        cfg = self.config
        v = Verdict(task_id=job.task.id, task_name=job.task.name, candidate_hash=job.candidate.hash,
                    device=cfg.device, device_name=slot.device_name,
                    compile_mode=None if cfg.compile_mode == "none" else cfg.compile_mode,
                    failure=Failure(category=category, message=message))
        v.judge_s = now - (job.started or now)
        v.phase_s["pool_queue"] = (job.started or now) - job.submitted
        return v

    def _wedged(self, slot: _Slot, now: float, resolved: list) -> None:
        job = slot.job
        limit = job.deadline - job.started
        slot.handle.kill()
        self._stats.worker_deaths += 1
        self._stats.timeouts += 1
        self._release(job)
        self._finish(job)
        self._stats.judged += 1
        resolved.append((job.future, self._pool_verdict(
            job, slot, FailureCategory.TIMEOUT,
            f"judging did not finish within the pool's time limit of {limit:.0f} s; the judge worker was "
            "killed and replaced", now)))
        self._start(slot, now)

    def _died(self, slot: _Slot, now: float, resolved: list) -> None:
        self._stats.worker_deaths += 1
        how = slot.handle.exit_description()
        slot.handle.kill()
        if slot.state == "starting":
            slot.last_error = f"the worker {how} while starting"
            self._start_failed(slot, now)
            return
        job, slot.job = slot.job, None
        if slot.role == "compile":
            if job is not None and job.prebuild == "running":
                job.prebuild = "none"
        elif job is not None:
            self._release(job)
            if job.attempts < self.pool_config.max_attempts + job.alone:  # the try alone is not a death
                self._stats.retries += 1
                job.deadline = None
                self._queue.insert(0, job)
            else:
                self._finish(job)
                self._stats.judged += 1
                resolved.append((job.future, self._pool_verdict(
                    job, slot, FailureCategory.CRASH,
                    f"the judge worker {how} while judging this candidate, on each of {job.attempts} "
                    "workers it was given", now)))
        self._start(slot, now)

    def _assign(self, now: float) -> None:
        if self._closing and self._hard_stop:
            return
        # Compile workers first: a candidate whose build has started is one a judge worker then
        # waits for (on the builder's lock) instead of compiling a second time.
        for slot in sorted(self._slots, key=lambda s: s.role != "compile"):
            if slot.state != "idle":
                continue
            if slot.role == "compile":
                job = next((j for j in self._queue if j.prebuild == "queued" and not j.future.cancelled()), None)
                if job is None or not self._archs:
                    continue
                try:
                    slot.handle.send(CompileRequest(job_id=job.id, candidate=job.candidate,
                                                    archs=sorted(self._archs, key=str)))
                except WorkerGone:
                    continue  # noticed as a death on the next round
                job.prebuild = "running"
                slot.state, slot.since, slot.job = "busy", now, job
            else:
                job = self._pick(slot)
                if job is None:
                    continue
                try:
                    slot.handle.send(JudgeRequest(job_id=job.id, task=job.task, candidate=job.candidate))
                except WorkerGone:
                    self._queue.insert(0, job)
                    continue
                first_try = job.attempts == 0
                job.attempts += 1
                if job.prebuild == "done" and first_try:
                    self._stats.prebuilt_in_time += 1
                elif job.prebuild == "queued":
                    job.prebuild = "none"  # too late to help: the judge builds it
                job.started, job.device_name = now, slot.device_name
                if job.alone and slot.gpu is not None:
                    self._alone_on[slot.gpu] = job.id
                warm = job.baseline_key in self._warm
                job.deadline = now + self.time_limit_s + (0.0 if warm else self.baseline_allowance_s)
                self._in_flight[job.baseline_key] = self._in_flight.get(job.baseline_key, 0) + 1
                slot.state, slot.since, slot.job = "busy", now, job

    def _pick(self, slot: _Slot) -> _Job | None:
        """The job an idle judge worker takes (removed from the queue), or None."""
        device_name, gpu = slot.device_name, slot.gpu
        if gpu is not None and gpu in self._alone_on:
            return None  # a candidate is judged alone on this GPU
        # A candidate to be judged alone: the first GPU with an idle judge drains for it (its
        # judges finish what they hold and take nothing new), then one of them takes it.
        alone = next((j for j in self._queue if j.alone and not j.future.cancelled()), None)
        if alone is not None and gpu is not None:
            if alone.alone_gpu is None or not any(s.gpu == alone.alone_gpu and s.state != "dead"
                                                  for s in self._slots if s.role == "judge"):
                alone.alone_gpu = gpu
            if alone.alone_gpu == gpu:
                if any(s.role == "judge" and s.gpu == gpu and s is not slot and s.state == "busy"
                       for s in self._slots):
                    return None
                self._queue.remove(alone)
                return alone
        while True:
            eligible = [j for j in self._queue if not j.alone and (
                        (key := (j.task.id, device_name)) in self._warm or not self._in_flight.get(key))]
            if not eligible:
                return None
            job = next((j for j in eligible if j.prebuild in ("none", "done")), eligible[0])
            self._queue.remove(job)
            if not job.claimed:
                if not job.future.set_running_or_notify_cancel():
                    self._jobs.pop(job.id, None)  # cancelled while waiting
                    continue
                job.claimed = True
            return job

    def _stop_workers(self) -> None:
        """Idle workers are asked to exit (their judge closes its zygote); the rest are killed."""
        asked = []
        for slot in self._slots:
            if slot.handle is not None and slot.state == "idle" and not self._hard_stop:
                try:
                    slot.handle.send(Stop())
                    asked.append(slot)
                except WorkerGone:
                    pass
        deadline = time.monotonic() + 10
        for slot in asked:
            while slot.handle.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        for slot in self._slots:
            if slot.handle is not None:
                slot.handle.kill()
            slot.state = "dead"


def _resolve(resolved: list[tuple[Future, object]]) -> None:
    """Set results outside the pool's lock: callbacks may call back into the pool."""
    for future, outcome in resolved:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
