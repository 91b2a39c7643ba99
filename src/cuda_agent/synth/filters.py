"""Filters: static ones in the pipeline's process, execution ones in isolated worker processes.

Static (no execution, in candidate order so results do not depend on scheduling):
  invalid_source   not a KernelBench-format module
  duplicate        same normalised AST as an earlier candidate (sizes and names do not count)
  contaminated     too close to a task of the user's benchmark directory (see decontam.py)
Execution (worker.py, one sandboxed process per worker slot, reused across tasks): see worker.py
for the list. A worker that crashes, hangs past `timeout_s` or exceeds `memory_limit_mb` is
killed with its whole process group and replaced; the task is rejected as `crash`/`timeout`.

Isolation of a worker is that of the judge's sandbox (`cuda_agent.judge.sandbox`): own session,
scrubbed environment (no API keys), rlimits, a separate uid and no network when run as root.
Unlike a judge candidate it keeps fork/exec (torch.compile runs a compiler) and shares the GPU with
the other workers, so its timings are noisy under load: the runtime window is a coarse gate, the
judge measures the baselines that count.
"""

from __future__ import annotations

import json
import os
import queue
import select
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent import host
from cuda_agent.tasks import TaskError, validate_reference_source

from .compose import Composition
from .criterion import CRITERION_FILTERS
from .decontam import BenchmarkIndex, DecontamConfig, Nearest, ast_hash, contamination

# every filter, in the order a candidate meets them (the rejection table uses this order)
FILTERS: dict[str, str] = {
    "compose_error": "the composer found no valid chain / the LLM gave no usable module",
    "invalid_source": "not a KernelBench-format module",
    "duplicate": "same normalised AST as an earlier candidate",
    "contaminated": "too close to a benchmark task (AST, MinHash, static or traced operator sequence)",
    "load_error": "the module does not import",
    "eager_error": "construction or eager forward fails, or outputs are not float tensors",
    "crash": "the worker process died (segfault, abort, out of host memory)",
    "out_of_memory": "needs more GPU memory than a worker's share (gpu_memory_mb, split among the GPU's workers)",
    "timeout": "the checks ran past the per-task time limit",
    "random_op": "random ops at run time (dropout in train mode, torch.rand*, RNG consumed)",
    "nondeterministic": "two identical runs give different outputs",
    "output_too_large": "outputs larger than the judge accepts (max_output_mb)",
    "train_eval_mismatch": "train() and eval() outputs differ",
    "nonfinite": "NaN or Inf in the output",
    "constant_output": "the output is constant",
    "input_independent": "the output does not change with the inputs",
    "degenerate": "an all-zero or constant output would pass the judge's tolerance on one of the input sets, "
                  "or a constant matches nearly every element",
    "unused_parameter": "a parameter does not influence the output",
    "unused_input": "an input does not influence the output",
    "droppable_input": "an input replaced by other values still passes the judge's comparison",
    "hardcodable_parameter": "a parameter is constant at initialisation (all ones, all zeros): a kernel could hard-code it",
    "droppable_parameter": "a parameter, or a triangle or half of one, dropped or replaced still passes the judge's comparison",
    "ill_conditioned": "a 1e-6 relative input jitter or float64 arithmetic leaves the judge's tolerance (the "
                       "jitter on 300 input sets where an op jumps at a boundary or a set came near)",
    "batch_mixing": "samples of the batch influence each other (allowed only with MIXES_BATCH = True)",
    "runtime_window": "eager runtime outside the window after rescaling",
    **CRITERION_FILTERS,
    "compile_error": "torch.compile fails",
    "compile_mismatch": "torch.compile output differs from eager",
    "worker_error": "a bug in the checker itself (reported, never silently accepted)",
    "judge_reference": "the judge's reference checks fail (--judge-check: the reference does not reproduce in the judge's isolated process)",
}

# the rejections an honest kernel's rounding or an overflow causes: what hazard-aware composition
# (hazards.py) is meant to make rare, reported as a share of the candidates (SynthReport.hazard_share)
HAZARD_FILTERS = ("nonfinite", "ill_conditioned", *CRITERION_FILTERS)


class Rejection(BaseModel):
    model_config = ConfigDict(frozen=True)

    filter: str
    message: str


def usable_cores() -> int:
    """The cores this process may run on (a pinned share of a machine), not the machine's count."""
    return host.usable_cores()


def worker_layout(workers: int | None = None) -> tuple[int, int]:
    """(workers, torch threads per worker) on the usable cores: by default half as many workers as cores."""
    cores = usable_cores()
    n = workers or max(1, cores // 2)
    return n, max(1, cores // n)


class FilterConfig(BaseModel):
    """Execution-filter settings. Defaults follow the paper (1-100 ms eager window, torch.compile checked on every device)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Literal["cuda", "cpu"] = "cpu"
    min_ms: float = Field(1.0, description="shortest accepted eager runtime (CPU tests use ~0.05)")
    max_ms: float = Field(100.0, description="longest accepted eager runtime")
    target_ms: float | None = Field(None, description="rescaling target; default a quarter of the way up the window "
                                                     "on a log scale (3.2 ms for [1, 100] ms): every later check of "
                                                     "the task, and every judge evaluation of it, costs GPU time in "
                                                     "proportion, and 3x above min_ms is margin enough for another "
                                                     "GPU or a loaded one")
    max_rescales: int = Field(4, description="BATCH rescaling attempts toward the window")
    compile: bool = Field(True, description="check torch.compile against eager (on every device unless switched off)")
    timeout_s: float = Field(300.0, description="limit on all checks of one task (compile included)")
    atol: float = Field(1e-2, description="the judge's elementwise tolerance (JudgeConfig.atol)")
    rtol: float = Field(1e-2, description="the judge's elementwise tolerance (JudgeConfig.rtol)")
    max_rel_l2: dict[str, float] = Field(
        default_factory=lambda: {"float64": 1e-6, "float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2},
        description="as the judge: compile vs eager must pass the same normwise bound")
    ref_noise_multiple: float = Field(16.0, description="the judge's ref_noise_multiple (shortcut checks compare as "
                                                         "the judge's checked calls do)")
    max_rel_l2_ceiling: float = Field(1e-2, description="the judge's max_rel_l2_ceiling")
    shortcuts: bool = Field(True, description="run the shortcut checks (degenerate, droppable parameters and inputs, "
                                              "hard-codable parameters, ill-conditioning, batch mixing)")
    shortcut_cpu_ms: float = Field(10.0, ge=0, description="run the shortcut checks on the worker's CPU when a "
                                                         "forward of the composed task takes at most this many ms "
                                                         "there (cuda workers; 0: always on the device)")
    n_input_sets: int = Field(10, ge=2, description="fresh input sets the shortcut checks use")
    shortcut_seed: int = Field(5000, description="input set k of the shortcut checks is drawn under seed "
                                                 "shortcut_seed + k (an audit uses other seeds than the filter)")
    jitter_rel: float = Field(1e-6, description="relative input jitter an honest kernel's rounding must survive")
    jitter_sets: int = Field(10, description="input sets the jitter is tried on at the composed size (the first "
                                             "n_input_sets with the float64 evaluation). 10, not 30: the export "
                                             "criterion tries 30 at the exported size after the window, which "
                                             "finds more (a jump is crossed more often the more elements there are)")
    jitter_sets_suspect: int = Field(300, description="input sets the jitter is tried on when the task runs an op "
                                                      "that jumps at a boundary (floor, sign, a comparison, ...) or "
                                                      "a jittered output came within jitter_near_miss of the "
                                                      "tolerance on the first jitter_sets")
    jitter_near_miss: float = Field(0.05, description="a jittered output this close to failing marks the task as "
                                                      "suspect (the larger of |difference| / (atol + rtol "
                                                      "|expected|) over the elements and the relative L2 error over "
                                                      "its bound): a heavy tail (an ill-conditioned matrix now and "
                                                      "then) crosses it on a later set")
    near_constant_share: float = Field(0.95, description="reject when a constant matches this share of an "
                                                         "output's elements at the judge's elementwise tolerance")
    noise_headroom: float = Field(8.0, description="reject when float32 is further from float64 than "
                                                   "max_rel_l2_ceiling / this (an honest kernel's own error, "
                                                   "up to ~9x the reference's, would not fit under the ceiling)")
    criterion: bool = Field(True, description="hold the rescaled task to the export criterion (criterion.py): on "
                                              "criterion_sets judge-drawn input sets at the exported size, finite "
                                              "outputs, stable under a criterion_rel input perturbation, float64 "
                                              "within the judge's comparison")
    criterion_sets: int = Field(30, ge=1, description="input sets of the export criterion")
    criterion_rel: float = Field(1e-6, gt=0, description="relative input perturbation an honest kernel's rounding "
                                                         "must survive (x * (1 + rel * u), u uniform in [-1, 1])")
    criterion_seed: int = Field(70_000, description="input set k of the criterion is drawn under criterion_seed + k")
    criterion_sets_per_model: int = Field(5, ge=1, description="a new weight draw every this many sets (each judge "
                                                               "evaluation draws its own weights)")
    criterion_screen_rel: float = Field(1e-4, ge=0, description="the first 3 sets are also perturbed this much; "
                                                                "a failure there (a jump that is rare at "
                                                                "criterion_rel) has the task tried on "
                                                                "criterion_sets_suspect sets. 0: no screen")
    criterion_sets_suspect: int = Field(150, ge=1, description="criterion sets for a task whose screen failed")
    det_rel: float | None = Field(None, description="two runs may differ by this fraction of the largest "
                                                    "output magnitude; default 0 on cpu, 1e-5 on cuda (atomics)")
    n_warmup: int = 2
    n_timed: int = 10
    timing_budget_s: float = Field(10.0, description="stop timing early once this much time was spent")
    max_input_mb: float = Field(2048.0, description="rescaling never makes the inputs larger than this")
    max_output_mb: int = Field(2048, description="largest total output (the judge's max_output_mb default)")
    threads_per_worker: int = Field(1, description="torch CPU threads in each worker")
    memory_limit_mb: int = Field(16384, description="resident memory of one worker (killed above)")
    check_memory_multiple: float = Field(4.0, ge=0, description="on the GPU, the runtime window keeps BATCH where "
                                                                 "the checks after it, taken to hold this many times "
                                                                 "what a timed run holds, fit the worker's memory "
                                                                 "share (CheckResult.memory_mb records the ratio "
                                                                 "seen); 0: no such bound")
    gpu_memory_mb: int = Field(16384, description="GPU memory one worker may allocate; less when the GPU's "
                                                  "workers would not fit (90% of the GPU split among them)")
    startup_timeout_s: float = 120.0
    tasks_per_worker: int = Field(200, description="replace a worker after this many tasks (compile caches, "
                                                   "allocator state and leaks do not accumulate)")

    def payload(self) -> dict:
        d = self.model_dump()
        d["det_rel"] = (1e-5 if self.device == "cuda" else 0.0) if self.det_rel is None else self.det_rel
        return d


class CheckResult(BaseModel):
    """What the worker found for one task (the source is the rescaled one when accepted)."""

    accepted: bool
    rejection: Rejection | None = None
    passed: list[str] = Field(default_factory=list)
    source: str = ""
    eager_ms: float | None = None
    compile_ms: float | None = None
    batches: list[int] = Field(default_factory=list)
    input_shapes: list[list[int]] = Field(default_factory=list)
    output_shapes: list[list[int]] = Field(default_factory=list)
    n_params: int | None = None
    check_s: float = 0.0
    # seconds per stage of the check (load, trace, values, shortcuts, window, final_values, compile);
    # a rejected task's split ends at the stage that rejected it
    stage_s: dict[str, float] = Field(default_factory=dict)
    trace: list[str] | None = None   # the operators the task runs (trace.py); None: it could not be traced
    shortcut_device: str | None = None   # where the shortcut checks ran (FilterConfig.shortcut_cpu_ms)
    # GPU memory, MiB: what the window's timed runs held beyond the weights ("held"), the weights,
    # and the peak of the checks after the window ("checks"); empty on the CPU
    memory_mb: dict[str, float] = Field(default_factory=dict)


def synth_root_dir() -> Path:
    from cuda_agent.judge.sandbox import work_root_dir

    root = work_root_dir() / "synth"
    root.mkdir(exist_ok=True)
    os.chmod(root, 0o711)
    return root


class Worker:
    """One sandboxed worker process; replaced after a crash or a timeout."""

    UID_WAYS = 4       # a restarted worker takes the next of its slot's uids (see start)

    def __init__(self, config: FilterConfig, slot: int, gpu_share: int = 1, uid_base: int = host.SYNTH_UIDS.start):
        """`uid_base`: the first of the UID_WAYS uids of this worker's (leased by its pool)."""
        self.config, self.slot, self.uid_base = config, slot, uid_base
        self.gpu_share = gpu_share   # workers on this worker's GPU (they split its memory)
        self.proc = None
        self._buf = b""
        self.done = 0
        self.starts = 0

    def start(self) -> None:
        """Start the process; a start that fails is tried once more (a GPU context that has just
        faulted can take a moment to go away)."""
        try:
            self._start()
        except RuntimeError:
            time.sleep(2.0)
            self._start()

    def _start(self) -> None:
        from cuda_agent.judge.sandbox import SandboxSpec, Sandboxed, new_workdir, python_argv

        # Each start takes the next of the slot's uids: the process being replaced (stuck in the
        # driver after a fault, say) and its clean-up by uid never touch the new one.
        uid = self.uid_base + self.starts % self.UID_WAYS
        self.starts += 1
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        cfg = self.config
        spec = SandboxSpec(
            argv=python_argv("cuda_agent.synth.worker", str(req_r), str(rep_w)),
            workdir=new_workdir(synth_root_dir(), f"worker{self.slot}-"), uid=uid,
            pass_fds=(req_r, rep_w), max_procs=256,
            address_space_mb=None if cfg.device == "cuda" else cfg.memory_limit_mb * 2,
            env={"CUDA_AGENT_SYNTH_THREADS": str(cfg.threads_per_worker), "CUDA_AGENT_SYNTH_GPU_SHARE": str(self.gpu_share),
                 "CUDA_AGENT_SYNTH_GPU_MB": str(cfg.gpu_memory_mb),
                 "OMP_NUM_THREADS": str(cfg.threads_per_worker), "TORCHINDUCTOR_COMPILE_THREADS": "1",
                 **self._gpu_env()})
        try:
            self.proc = Sandboxed(spec)
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._req = os.fdopen(req_w, "w", buffering=1)
        self._rep = rep_r
        self._buf = b""
        self.done = 0
        ready = self._read_line(time.monotonic() + cfg.startup_timeout_s)
        if not isinstance(ready, dict):
            tail = self.proc.log_tail(2000)
            self.close()
            raise RuntimeError(f"synth worker {self.slot} did not start:\n{tail}")

    def _gpu_env(self) -> dict:
        """Workers take the visible GPUs in turn (slot k gets GPU k mod n): a run on a machine with
        several GPUs uses them all."""
        from cuda_agent.host import visible_gpus

        gpus = visible_gpus() if self.config.device == "cuda" else []
        if not gpus:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return {"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {}
        return {"CUDA_VISIBLE_DEVICES": gpus[self.slot % len(gpus)]}

    def _read_line(self, deadline: float) -> dict | str:
        """The next reply, or "eof" (the process closed its end: it died) or "deadline"."""
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return "deadline"
            ready, _, _ = select.select([self._rep], [], [], min(left, 0.5))
            if not ready:
                if self.proc is not None and self.proc.rss_mb() > self.config.memory_limit_mb:
                    raise MemoryError(f"worker exceeded {self.config.memory_limit_mb} MiB")
                if self.proc is not None and not self.proc.alive():
                    return "eof"
                continue
            chunk = os.read(self._rep, 1 << 20)
            if not chunk:
                return "eof"
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def check(self, source: str) -> CheckResult:
        if self.proc is None:
            self.start()
        cfg = self.config
        try:
            self._req.write(json.dumps({"source": source, "config": cfg.payload()}) + "\n")
            self._req.flush()
            reply = self._read_line(time.monotonic() + cfg.timeout_s)
        except MemoryError as exc:
            self.close()
            return CheckResult(accepted=False, rejection=Rejection(filter="crash", message=str(exc)))
        except (OSError, json.JSONDecodeError) as exc:   # broken pipe: it died while we wrote
            reply = f"{type(exc).__name__}: {exc}"
        if isinstance(reply, dict):
            self.done += 1
            if reply.get("restart") or self.done >= cfg.tasks_per_worker:
                self.close()
            return CheckResult.model_validate(reply)
        proc = self.proc
        if reply == "deadline":
            self.close()
            return CheckResult(accepted=False, rejection=Rejection(
                filter="timeout", message=f"checks ran past {cfg.timeout_s:g} s"))
        try:
            proc.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - still exiting: close() kills it
            pass
        how = proc.exit_description() if not proc.alive() else reply
        tail = proc.log_tail(1500)
        self.close()
        return CheckResult(accepted=False, rejection=Rejection(filter="crash", message=f"worker died ({how}): {tail[-800:]}"))

    def close(self) -> None:
        if self.proc is not None:
            try:
                self._req.close()
            except OSError:
                pass
            try:
                os.close(self._rep)
            except OSError:
                pass
            self.proc.cleanup()
            self.proc = None


class WorkerPool:
    """`size` workers; `check` is thread-safe (each call borrows one idle worker)."""

    def __init__(self, config: FilterConfig, size: int, reserve: int = 0):
        """`reserve`: other processes that will share the GPUs meanwhile (judges checking the
        accepted tasks), each counted as a worker when the GPUs' memory is shared out."""
        self.config = config
        self._idle: queue.Queue[Worker] = queue.Queue()
        gpus = 1
        if config.device == "cuda":
            from cuda_agent.host import visible_gpus

            gpus = max(1, len(visible_gpus()))
        # slot k runs on GPU k mod gpus (Worker._gpu_env): that many workers share each GPU
        share = -(-size // gpus) + -(-reserve // gpus)
        # Each worker's uids, leased for the pool's life: another synthesis run on the machine (whose
        # clean-up kills every process of its uids) can never take them.
        ways = Worker.UID_WAYS
        self._uid_lease = host.lease_uids(host.SYNTH_UIDS, range(size * ways), os.getpid()) if size else None
        base = self._uid_lease.base if self._uid_lease is not None else host.SYNTH_UIDS.start
        self._all = [Worker(config, i, gpu_share=share, uid_base=base + i * ways) for i in range(size)]
        for w in self._all:
            self._idle.put(w)

    def check(self, source: str) -> CheckResult:
        w = self._idle.get()
        try:
            return w.check(source)
        finally:
            self._idle.put(w)

    def close(self) -> None:
        for w in self._all:
            w.close()
        if self._uid_lease is not None:
            self._uid_lease.close()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StaticFilter:
    """Source validity, duplicates and decontamination; call in candidate order."""

    def __init__(self, benchmark: BenchmarkIndex | None = None, decontam: DecontamConfig | None = None):
        self.benchmark = benchmark
        self.decontam = decontam or DecontamConfig()
        self.seen: dict[str, str] = {}    # normalised-AST hash -> first candidate's name

    def remember(self, digest: str, name: str) -> None:
        self.seen.setdefault(digest, name)

    def check_trace(self, source: str, trace: list[str] | None) -> tuple[Rejection | None, Nearest | None]:
        """Decontamination by what the task runs, once a worker has traced it (`CheckResult.trace`)."""
        if self.benchmark is None or not len(self.benchmark):
            return None, None
        near = self.benchmark.nearest(source, self.decontam, trace=trace if self.decontam.trace else None)
        reason = contamination(near, self.decontam)
        return (Rejection(filter="contaminated", message=reason) if reason else None), near

    def check(self, comp: Composition) -> tuple[Rejection | None, Nearest | None, str]:
        try:
            validate_reference_source(comp.source, comp.name)
            digest = ast_hash(comp.source)
        except (TaskError, SyntaxError) as exc:
            return Rejection(filter="invalid_source", message=str(exc)), None, ""
        if digest in self.seen:
            return Rejection(filter="duplicate", message=f"same normalised AST as {self.seen[digest]}"), None, digest
        self.seen[digest] = comp.name
        near = None
        if self.benchmark is not None and len(self.benchmark):
            near = self.benchmark.nearest(comp.source, self.decontam)
            reason = contamination(near, self.decontam)
            if reason:
                return Rejection(filter="contaminated", message=reason), near, digest
        return None, near, digest
