"""The two kinds of worker process: a judge worker (one per GPU, owns a `Judge`) and a compile
worker (builds candidates ahead into the judge's build cache).

Both are trusted processes: they run the judge's code, never the candidate's; candidate code runs
only in the sandboxed processes the judge and the builder start. A worker serves one request at a
time and dies with the pool (PR_SET_PDEATHSIG), so a pool killed with SIGKILL leaves no worker
holding a GPU. Ctrl-C is the pool's to handle: workers ignore SIGINT.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import time
import traceback

from .transport import CompileRequest, Hello, JudgeReply, JudgeRequest, PrebuildReport, StartupFailed, Stop, WorkerSpec

PR_SET_PDEATHSIG = 1


def _tie_to_parent(parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent_pid and os.getppid() != parent_pid:  # the pool died before the line above took effect
        os._exit(0)


def prepare_process(spec: WorkerSpec) -> None:
    """What a worker process sets before it starts serving (any transport)."""
    # Before anything imports torch's CUDA state: which GPU this worker owns.
    os.environ.update(spec.env)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    # Builds inherit both: compile workers keep off the cores of the calls being timed and give way
    # to them where they share one.
    if spec.cpus:
        os.sched_setaffinity(0, spec.cpus)
    if spec.nice:
        os.nice(spec.nice)


def make_server(spec: WorkerSpec, baseline_store=None) -> "_JudgeServer | _CompileServer | StartupFailed":
    """The worker's server, or why it could not start (e.g. no CUDA device: the pool cannot use it)."""
    try:
        return _JudgeServer(spec, baseline_store) if spec.role == "judge" else _CompileServer(spec)
    except Exception as exc:
        return StartupFailed(message=f"{type(exc).__name__}: {exc}")


def worker_main(spec: WorkerSpec, conn) -> None:
    _tie_to_parent(spec.parent_pid)
    prepare_process(spec)
    server = make_server(spec)
    if isinstance(server, StartupFailed):
        conn.send(server)
        return
    conn.send(server.hello())
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the pool closed the channel
                break
            if isinstance(message, Stop):
                break
            conn.send(server.handle(message))
    finally:
        server.close()


class _JudgeServer:
    def __init__(self, spec: WorkerSpec, baseline_store=None):
        module, _, attr = spec.judge_factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
        self.store = None
        self._own_store = baseline_store is None
        if baseline_store is not None:  # a store the transport provides (a cluster's shared one)
            self.store = baseline_store
        elif spec.baseline_db is not None:
            from cuda_agent.db import SqliteBaselineStore

            self.store = SqliteBaselineStore(spec.baseline_db)
        config = spec.config
        if spec.share_device and config.device_lock is None:
            # Judges that share a device take turns for timed calls through its lock file: the GPU
            # this process sees (set by the pool, or by Ray for its actor), or on the CPU backend
            # this host, whose cores every candidate's threads share.
            from cuda_agent.judge.devlock import gpu_lock_path, host_lock_path

            lock = gpu_lock_path(os.environ.get("CUDA_VISIBLE_DEVICES")) if config.device == "cuda" else host_lock_path()
            config = config.model_copy(update={"device_lock": lock})
        self.judge = factory(config, self.store)

    def hello(self) -> Hello:
        return Hello(pid=os.getpid(), device_name=str(getattr(self.judge, "device_name", "")),
                     arch=getattr(self.judge, "arch", None))

    def handle(self, request: JudgeRequest) -> JudgeReply:
        from cuda_agent.judge import JudgeError

        try:
            return JudgeReply(job_id=request.job_id, verdict=self.judge.evaluate(request.task, request.candidate))
        except JudgeError as exc:
            return JudgeReply(job_id=request.job_id, judge_error=str(exc))
        except Exception as exc:  # a bug of the judge: said as such, never blamed on the candidate
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]
            return JudgeReply(job_id=request.job_id, judge_error=f"the judge raised {type(exc).__name__}: {text}")

    def close(self) -> None:
        self.judge.close()
        if self.store is not None and self._own_store:
            self.store.close()


class _CompileServer:
    """Builds with the judge's own `Builder`, cache folder and work root, so its output is the
    judge's cache hit. Builds run sandboxed under this worker's own uid (when root): a builder's
    clean-up kills every process of its uid, so two builders never share one."""

    def __init__(self, spec: WorkerSpec):
        from cuda_agent.judge.sandbox import work_root_dir
        from cuda_agent.judge.supply import ZygoteHolder

        self.spec = spec
        self.config = spec.config
        self.work_root = work_root_dir()
        self.builders: dict = {}
        self.zygote = ZygoteHolder(self.config, builds=True)  # the judge's rule for build jobs

    def hello(self) -> Hello:
        return Hello(pid=os.getpid())

    def _builder(self, arch: str | None):
        from cuda_agent.judge.builds import Builder

        if arch not in self.builders:
            self.builders[arch] = Builder.for_config(self.config, self.work_root, arch=arch,
                                                     uid=self.spec.build_uid, jobs=self.spec.build_jobs,
                                                     zygote=self.zygote)
        return self.builders[arch]

    def handle(self, request: CompileRequest) -> PrebuildReport:
        from cuda_agent.judge.builds import plan_build

        from .prebuild import build_plan_ahead

        t0 = time.monotonic()
        plan = plan_build(request.candidate, self.config.device, self.config.policy)
        report = PrebuildReport(job_id=request.job_id, specs=len(plan.specs), skipped=plan.not_built)
        for arch in request.archs:
            built, cached, failed = build_plan_ahead(self._builder(arch), plan)
            report.built += built
            report.cached += cached
            report.failed += len(failed)
        report.seconds = time.monotonic() - t0
        return report

    def close(self) -> None:
        self.zygote.close()
