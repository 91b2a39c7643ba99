"""How the pool reaches its workers: one small interface, local processes by default.

The pool's scheduler (pool.py) decides what runs where and when a worker is given up on; a
`Transport` only starts workers and carries messages. Everything that crosses it is one of the
typed records below, so another transport (Ray actors on a cluster: `start` creates an actor,
`send`/`poll` wrap its method calls and object refs, `kill` is `ray.kill`) can replace
`LocalTransport` without the scheduler changing.

Messages travel between trusted processes only (the pool and the processes running the judge or
the builder); candidate code never sees this channel.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent import host
from cuda_agent.candidate import Candidate
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.verdict import Verdict
from cuda_agent.tasks import Task


class Placement(BaseModel):
    """How many workers of each role a pool runs, and which cores of their machine they use. The
    transport decides it: local processes count this machine's GPUs and cores, a cluster its nodes'."""

    judges: int
    judge_env: list[dict[str, str]]                  # per judge worker, set before CUDA starts
    timing_cpus: list[list[int] | None]              # per judge worker: cores of its timed calls
    spare_cpus: list[int] | None = None              # cores left for spare judge processes and builds
    compile_workers: int
    build_jobs: int = 1                              # parallel compiler jobs per compile worker


class PlacementError(RuntimeError):
    """The workers asked for do not fit what the transport can reach."""


def local_placement(config: JudgeConfig, judge_workers: int | None, compile_workers: int | None,
                    judges_per_gpu: int = 1) -> Placement:
    """This machine: `judges_per_gpu` judges per visible GPU (on the CPU backend `judge_workers`,
    default 1) and compile workers on the cores left. Raises JudgeError for CUDA without a GPU,
    PlacementError for more judges than GPUs can take."""
    from cuda_agent.judge.harness import JudgeError

    cores = host.usable_cores()
    if config.device == "cuda":
        gpus = host.visible_gpus()
        if not gpus:
            raise JudgeError("device 'cuda' requested but no GPU is visible (use --device cpu)")
        n_judges = judge_workers or len(gpus) * judges_per_gpu
        if n_judges > len(gpus) * judges_per_gpu:
            raise PlacementError(f"{n_judges} judge workers asked for, {len(gpus)} GPUs visible and "
                                 f"{judges_per_gpu} judge(s) per GPU: judges that share a GPU take turns for "
                                 "their timed calls (--judges-per-gpu)")
        # judges i, i + len(gpus), ... share GPU i, so that fewer judges than slots spread out
        envs = [{"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} for i in range(n_judges)]
        default_compile = max(1, cores - n_judges - 1)
    else:
        n_judges = judge_workers or 1
        envs = [{"CUDA_VISIBLE_DEVICES": ""} for _ in range(n_judges)]
        default_compile = max(0, cores - n_judges - 1) if cores >= 4 else 0
    n_compile = compile_workers if compile_workers is not None else default_compile
    # On CUDA, two cores per GPU for the judge and the candidate it is timing, where at least as
    # many are left for compiling: a loaded core delays the judge's clock and the candidate's launches.
    allowed = host.usable_cpus()
    timing: list[list[int] | None] = [None] * n_judges
    rest: list[int] | None = None
    if config.device == "cuda" and len(allowed) >= 4 * n_judges:
        timing = [allowed[2 * i:2 * i + 2] for i in range(n_judges)]
        rest = allowed[2 * n_judges:]
        if compile_workers is None:
            # one per core left: they run at a lower priority than the judges' spare processes,
            # which start on these cores too, so a spare core would only idle between spares
            n_compile = max(1, len(rest))
    return Placement(judges=n_judges, judge_env=envs, timing_cpus=timing, spare_cpus=rest,
                     compile_workers=n_compile, build_jobs=max(1, len(rest or range(cores)) // max(1, n_compile)))


class WorkerSpec(BaseModel):
    """What a worker process is: its role, its slot, its judge settings and environment."""

    model_config = ConfigDict(frozen=True)
    role: Literal["judge", "compile"]
    slot: int
    config: JudgeConfig
    env: dict[str, str] = Field(default_factory=dict)   # set before anything touches CUDA
    baseline_db: Path | None = None                     # results database holding baselines (None: files)
    build_uid: int | None = None                        # compile workers: uid of their sandboxed builds
    build_jobs: int | None = None                       # compile workers: parallel compiler jobs per build
    cpus: list[int] | None = None                       # compile workers: the cores they (and their builds) use
    nice: int = 0                                       # compile workers: lower priority than the timed calls
    judge_factory: str = "cuda_agent.judge:Judge"      # module:callable(config, baseline_store) -> Judge
    share_device: bool = False                          # judges: others judge on the same GPU (or CPU host)
    gpu_share: float = 1.0                              # judges: the share of a GPU each holds (a Ray actor's)
    parent_pid: int = 0


# --- messages, pool -> worker ----------------------------------------------------------------------

class JudgeRequest(BaseModel):
    job_id: int
    task: Task
    candidate: Candidate


class CompileRequest(BaseModel):
    job_id: int
    candidate: Candidate
    archs: list[str | None]     # build for each (the judge workers' GPU architectures)


class Stop(BaseModel):
    pass


# --- messages, worker -> pool ----------------------------------------------------------------------

class Hello(BaseModel):
    """A worker is ready. Judge workers say which device they judge on."""

    pid: int
    device_name: str = ""
    arch: str | None = None


class StartupFailed(BaseModel):
    message: str


class JudgeReply(BaseModel):
    job_id: int
    verdict: Verdict | None = None
    judge_error: str | None = None    # the judge could not work on this task (JudgeError)


class PrebuildReport(BaseModel):
    job_id: int
    specs: int = 0
    built: int = 0          # compiled here
    cached: int = 0         # already in the cache
    failed: int = 0         # the compiler failed (the judge will report it)
    seconds: float = 0.0
    skipped: list[str] = Field(default_factory=list)


class WorkerHandle(Protocol):
    """One started worker. `poll` returns the next message, or None if none arrived in time."""

    spec: WorkerSpec

    def send(self, message: BaseModel) -> None: ...

    def poll(self, timeout: float = 0.0) -> BaseModel | None: ...

    def alive(self) -> bool: ...

    def exit_description(self) -> str: ...

    def kill(self) -> None: ...


class Transport(Protocol):
    def placement(self, config: JudgeConfig, judge_workers: int | None,
                  compile_workers: int | None, judges_per_gpu: int = 1) -> Placement: ...

    def start(self, spec: WorkerSpec) -> WorkerHandle: ...

    def wait(self, handles: list[WorkerHandle], timeout: float) -> None:
        """Return when one of `handles` has a message or has died, or after `timeout` seconds."""
        ...


class WorkerGone(Exception):
    """The worker's channel closed (it died or exited)."""


class _LocalHandle:
    def __init__(self, spec: WorkerSpec, proc, conn):
        self.spec = spec
        self.proc = proc
        self.conn = conn

    def send(self, message: BaseModel) -> None:
        try:
            self.conn.send(message)
        except (OSError, EOFError, ValueError):
            raise WorkerGone(self.exit_description()) from None

    def poll(self, timeout: float = 0.0) -> BaseModel | None:
        try:
            if not self.conn.poll(timeout):
                return None
            return self.conn.recv()
        except (OSError, EOFError, ValueError):
            raise WorkerGone(self.exit_description()) from None

    def alive(self) -> bool:
        return self.proc.is_alive()

    def exit_description(self) -> str:
        return host.exit_description(self.proc.exitcode)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        # A process stuck in the GPU driver may not die at once; do not wait for it forever.
        self.proc.join(timeout=10)
        self.conn.close()


class LocalTransport:
    """Workers as local processes started with `spawn` (a clean interpreter: no CUDA state or
    threads inherited from the pool's process)."""

    def __init__(self):
        self.ctx = multiprocessing.get_context("spawn")

    def placement(self, config: JudgeConfig, judge_workers: int | None, compile_workers: int | None,
                  judges_per_gpu: int = 1) -> Placement:
        return local_placement(config, judge_workers, compile_workers, judges_per_gpu)

    def start(self, spec: WorkerSpec) -> _LocalHandle:
        from .workers import worker_main

        ours, theirs = self.ctx.Pipe(duplex=True)
        spec = spec.model_copy(update={"parent_pid": os.getpid()})
        proc = self.ctx.Process(target=worker_main, args=(spec, theirs), daemon=True,
                                name=f"cuda-agent-{spec.role}-{spec.slot}")
        proc.start()
        theirs.close()
        return _LocalHandle(spec, proc, ours)

    def wait(self, handles: list[_LocalHandle], timeout: float) -> None:
        objs = []
        for h in handles:
            if not h.conn.closed:
                objs += [h.conn, h.proc.sentinel]
        if objs:
            multiprocessing.connection.wait(objs, timeout)
        elif timeout > 0:
            import time

            time.sleep(timeout)
