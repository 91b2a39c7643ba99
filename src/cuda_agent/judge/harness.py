"""The trusted side of the judge: builds, references, inputs, comparisons, timing decisions.

Data flow of one evaluation:

    static policy -> build (sandboxed compiler, cached, import table checked) -> baselines
    (trusted processes, same protocol, cached) -> candidate process starts and builds ModelNew
    (weights copied from Model) -> for every call: fresh inputs from a secret seed, reference
    output computed here, candidate output received as bytes and compared here, inputs read back
    -> the candidate's times checked against this process's clock -> Verdict (measurements only;
    its readers score it with `cuda_agent.reward`)

The candidate process never holds a reference output, a seed of an input it has not yet been
given, or anything that decides the verdict.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import secrets
import shutil
import socket
import statistics
import time
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from cuda_agent import host
from cuda_agent.candidate import Candidate
from cuda_agent.tasks import Task

from . import observer as obs
from . import policy as pol
from .baselines import Baseline as _Baseline, BaselineKey, BaselineStore, FileBaselineStore
from .build import Builder, BuildError, BuildSpec, build_arch
from .buildplan import BuildOutcome, BuildPlan, build_planned, build_spec, inline_refusal, plan_build, spec_from_request
from .compare import compare_outputs, degenerate_warnings
from .config import JudgeConfig
from .cudaipc import CudaIpcError, SharedGpuBuffer
from .protocol import Channel, ChannelClosed, ChannelTimeout, DataPlane, ErrorCategory, ProtocolError, send_plane
from .sandbox import (SandboxError, SandboxSpec, Sandboxed, Zygote, is_root, new_workdir, pin_threads, python_argv,
                      seccomp_problem, work_root_dir)
from .tensorio import TransportError, nbytes_of, pack, packed_end, snapshot, unpack
from .timing import reconcile, summarize
from .verdict import CallRecord, Failure, FailureCategory as FC, Verdict


class JudgeError(RuntimeError):
    """The judge cannot work (bad configuration, missing device, broken task). Not a verdict."""


class _Stop(Exception):
    """Ends an evaluation early with a failure."""

    def __init__(self, category: FC, message: str):
        super().__init__(message)
        self.failure = Failure(category=category, message=message[-6000:])


def _package_files() -> dict[str, str]:
    root = Path(__file__).resolve().parent.parent
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in {".py", ".h", ".cpp"} and "suite" not in path.parts:
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


class _Reference:
    """A task's reference module, loaded once in the judge's own process."""

    def __init__(self, task: Task):
        module = types.ModuleType(f"reference_{task.id}")
        try:
            exec(compile(task.source, task.origin or task.name, "exec"), module.__dict__)
        except Exception as exc:
            raise JudgeError(f"task {task.name}: the reference does not import: {type(exc).__name__}: {exc}") from None
        self.Model = module.Model
        self.get_inputs = module.get_inputs
        self.get_init_inputs = module.get_init_inputs


_HARNESS_VERSION = 7  # bump when the call protocol changes: cached baselines depend on it


@dataclass
class _Setup:
    """One construction of the reference: its seed, arguments, weights and transport sizes."""

    init_seed: int
    init_args: list
    ref_model: torch.nn.Module
    state_names: list[str]
    state_values: list[torch.Tensor]
    in_bytes: int
    out_bytes: int
    outputs: list   # (shape, dtype name) per output, None for non-tensor outputs
    # A float64 copy of ref_model for the checked calls (made on first use), or why there is none.
    ref64: torch.nn.Module | None = None
    ref64_problem: str | None = None


class _Session:
    def __init__(self, proc: Sandboxed, chan: Channel, plane: DataPlane, shared: SharedGpuBuffer | None = None):
        self.proc, self.chan, self.plane, self.shared = proc, chan, plane, shared
        self.ready: dict = {}
        # per timed call, aligned with the times `_drive` returns: the round trip of the untimed
        # request just before it (the protocol's cost under the load of that moment) and how the
        # candidate process says it timed the call
        self.protocol_ms: list[float] = []
        self.methods: list[str] = []
        # Per output: bound on the error against the reference for calls without a float64
        # reference, the largest found on the checked calls (None: the fixed per-dtype bound).
        self.rel_l2_bounds: list | None = None
        self.reduced_isolation: list[str] = []  # what a judge that is not root cannot isolate
        self.trusted = False  # the reference or a baseline: no candidate policy applies to what it runs

    def timing_method(self) -> str:
        """How most of the timed calls were timed, as the candidate process reported it."""
        methods = self.methods
        return max(set(methods), key=methods.count) if methods else "events"

    @property
    def calls(self):
        """The region per-call inputs and outputs go through: shared GPU memory, else the host plane."""
        return self.shared.tensor if self.shared is not None else self.plane.view

    def close(self) -> None:
        try:
            self.chan.send({"op": "exit"})
        except OSError:
            pass
        self.chan.close()
        self.proc.cleanup()
        self.plane.close()
        if self.shared is not None:  # freed only now that the process that mapped it is gone
            self.shared.close()
            self.shared = None


def _scratch_verdict(task: Task) -> Verdict:
    return Verdict(task_id=task.id, task_name=task.name, candidate_hash="baseline", device="")


def _baseline_source(mode: str, outputs: list) -> str:
    """A trusted ModelNew for baseline runs: the reference itself, torch.compile of it, or a null
    model that returns correctly shaped, uncomputed outputs."""
    head = "import torch\nfrom model import Model\n\n"
    if mode == "eager":
        return head + "class ModelNew(Model):\n    pass\n"
    if mode == "null":
        shapes = [o for o in outputs if o is not None]
        lines = ", ".join(f"torch.empty({shape!r}, dtype=torch.{dtype}, device=self.dev.device)"
                          for shape, dtype in shapes)
        ret = f"({lines},)" if len(shapes) != 1 else lines
        return head + ("class ModelNew(torch.nn.Module):\n"
                       "    def __init__(self, *args, **kwargs):\n"
                       "        super().__init__()\n"
                       "        self.dev = torch.nn.Parameter(torch.empty(0), requires_grad=False)\n"
                       "    def forward(self, *inputs):\n"
                       f"        return {ret}\n")
    return head + ("class ModelNew(Model):\n"
                   "    def __init__(self, *args, **kwargs):\n"
                   "        super().__init__(*args, **kwargs)\n"
                   f"        self.compiled = torch.compile(super().forward, mode={mode!r})\n"
                   "    def forward(self, *inputs):\n"
                   "        return self.compiled(*inputs)\n")


def _to_list(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def _reference_ops(ref: "_Reference", device: str) -> set[str]:
    """The ATen operators a task's reference runs, from one pass under a dispatch mode in the judge's
    own process: on the meta device (no compute), else on `device` with the task's own inputs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.name())
            return func(*args, **(kwargs or {}))

    for where in ("meta", device):
        rec = _Ops()
        try:
            torch.manual_seed(0)
            with torch.device(where):
                model = ref.Model(*ref.get_init_inputs())
                inputs = ref.get_inputs()
            with rec, torch.no_grad():
                model(*inputs)
            return rec.names
        except Exception:  # meta kernels missing or data-dependent code: try for real
            continue
    return set()


class Judge:
    """A long-lived judge. `evaluate` never raises for a candidate's faults: it returns a Verdict."""

    _instances = 0

    def __init__(self, config: JudgeConfig | None = None, baseline_store: BaselineStore | None = None):
        """`baseline_store`: where measured baselines are kept (default: files under cache_dir/baselines)."""
        self.config = config = config or JudgeConfig()
        self.device = config.device
        if self.device == "cuda" and not torch.cuda.is_available():
            raise JudgeError("device 'cuda' requested but CUDA is not available (use --device cpu)")
        self.device_name = (torch.cuda.get_device_name(0) if self.device == "cuda"
                            else f"cpu x{os.cpu_count()}")
        if config.timing_cpus:
            # The judge and the candidate it times keep cores of their own (their processes inherit it).
            os.sched_setaffinity(0, config.timing_cpus)
        self._cores = host.usable_cores()
        # References in true fp32: TF32 matmul/convolution would make the reference itself the
        # less precise side (the fp32 tolerance is 1e-4 relative L2). Process-wide by necessity.
        host.true_fp32(torch)
        self.arch = arch = build_arch(self.device, config.arch)
        # Two judges must not share a uid (cleaning up after one's worker would kill the other's):
        # the process id spreads processes, the instance count the judges of one process.
        Judge._instances += 1
        self.uid = (config.sandbox_uid or host.judge_uid(os.getpid() + 997 * Judge._instances)) if is_root() else None
        self.work_root = work_root_dir()
        self._zygote: Zygote | None = None
        self._spares: list[tuple[Sandboxed, socket.socket]] = []  # workers started ahead of need, oldest first
        self._launches = 0
        # Builds run under their own uid: cleaning up after a build kills every process of its uid,
        # which must never include the candidate process waiting for that build.
        self.builder = Builder(config.cache_dir, self.work_root, arch=arch, timeout_s=config.build_timeout_s,
                               uid=None if self.uid is None else host.build_uid(self.uid), zygote=self._get_zygote,
                               cpus=config.spare_cpus)
        self.baseline_store = baseline_store or FileBaselineStore(config.cache_dir / "baselines")
        self._integrity = _package_files()
        self._references: dict[str, _Reference] = {}
        self._baselines: dict[str, _Baseline] = {}
        self._observer: Path | None = None
        self._vendor: dict[str, frozenset[str]] = {}   # task id -> vendor libraries its candidates may call
        self._task_vendor: frozenset[str] = frozenset()

    # -------------------------------------------------------------------------------- public
    def check_reference(self, task: Task) -> Verdict:
        """The judge's checks of a task on its own, for task sets (synthesis, imports): the
        reference loads and runs in this harness, then runs again as a trusted candidate in an
        isolated process on the judge's fresh input sets (weights through state_dict) and must
        reproduce the harness's outputs there within tolerance, leave its inputs unmodified and give
        outputs that are not degenerate (`task_warnings`). `eager` is its time under the call
        protocol. No candidate policy applies: the reference is not a candidate. A task that fails
        gets correct=False and the reason in `failure`."""
        t0 = time.monotonic()
        cfg = self.config
        v = self._new_verdict(task, "reference")
        try:
            ref = self._reference(task)
            setup = self._setup(task, ref, secrets.randbits(31))
            deadline = t0 + cfg.total_timeout_s
            session = self._start(task, _baseline_source("eager", setup.outputs), None, setup, v, deadline,
                                  trusted=True)
            try:
                roles = ["check"] * cfg.n_check + ["warmup"] * cfg.n_warmup + ["timed"] * cfg.n_timed
                inside, _ = self._drive(session, ref, setup, roles, v, deadline)
            finally:
                session.close()
            v.compiled = True
            v.eager = summarize(inside, session.timing_method())
        except _Stop as stop:
            v.failure = stop.failure
        except SandboxError as exc:  # this host cannot isolate the process: not the task's fault
            v.failure = Failure(category=FC.JUDGE, message=str(exc))
        except Exception as exc:  # the task's own code raised in the harness (or the task is malformed)
            v.failure = Failure(category=FC.RUNTIME, message=f"{type(exc).__name__}: {exc}"[:4000])
        finally:
            self._end_verdict()
        v.correct = v.failure is None
        v.judge_s = time.monotonic() - t0
        return v

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        t0 = time.monotonic()
        verdict = self._new_verdict(task, candidate.hash)
        try:
            self._evaluate(task, candidate, verdict, t0)
        except _Stop as stop:
            verdict.failure = stop.failure
            if stop.failure.category == FC.POLICY and not verdict.policy_violations:
                verdict.policy_violations.append(stop.failure.message)
        except JudgeError:
            raise
        except SandboxError as exc:  # this host cannot isolate candidates: say what to fix
            verdict.failure = Failure(category=FC.JUDGE, message=str(exc))
        except Exception as exc:  # a bug of the judge, reported as such and never blamed on the candidate
            import traceback

            verdict.failure = Failure(category=FC.JUDGE, message="".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:])
        finally:
            self._end_verdict()
        if self._gpu_plane_problem:
            verdict.notes.append(f"per-call tensors went through host memory (GPU sharing unavailable: "
                                 f"{self._gpu_plane_problem}); the judge's clock is coarser")
        if self._integrity != _package_files():
            verdict.failure = Failure(category=FC.TAMPERING, message="the judge's own files changed during the run")
            self._integrity = _package_files()
        if verdict.failure is not None:
            verdict.correct = False
        verdict.judge_s = time.monotonic() - t0
        return verdict

    def build_plan(self, candidate: Candidate) -> BuildPlan:
        """What this judge builds for `candidate` (see `cuda_agent.judge.buildplan`)."""
        return plan_build(candidate, self.device, self.config.policy)

    def build(self, candidate: Candidate) -> BuildOutcome:
        """The judge's static checks and builds for `candidate`, with nothing run: the same plan,
        build step and cache as `evaluate`, plus the load_inline specs read statically from a
        single file. A candidate's fault is a failure in the outcome, never an exception."""
        return build_planned(self.build_plan(candidate), self.builder)

    def close(self) -> None:
        self._references.clear()
        for spare in self._spares:
            self._drop_spare(spare)
        self._spares = []
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def standby_pids(self) -> set[int]:
        """Processes this judge keeps between evaluations on purpose: its spare workers (which run no
        candidate code until a task is sent to them) and its zygote."""
        pids = {proc.pid for proc, _ in self._spares if proc.alive()}
        if self._zygote is not None:
            pids.add(self._zygote.proc.pid)
        return pids

    def sandbox_uids(self) -> set[int]:
        """Every uid this judge runs candidate processes under (empty when it cannot drop privileges)."""
        if self.uid is None:
            return set()
        return {host.spare_uid(self.uid, i) for i in range(self.config.spares + 1)}

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------------- steps
    def _new_verdict(self, task: Task, candidate_hash: str) -> Verdict:
        self._live: list[Sandboxed] = []
        self._gpu_plane_problem: str | None = None
        self._build_failure: Failure | None = None  # a load_inline build the candidate asked for failed
        return Verdict(task_id=task.id, task_name=task.name, candidate_hash=candidate_hash,
                       device=self.device, device_name=self.device_name,
                       compile_mode=None if self.config.compile_mode == "none" else self.config.compile_mode,
                       versions={"torch": torch.__version__, "cuda": str(torch.version.cuda)})

    def _end_verdict(self) -> None:
        """Stop every process this verdict started, whatever happened to it."""
        for proc in self._live:
            proc.cleanup()
        self._live = []

    def _evaluate(self, task: Task, cand: Candidate, v: Verdict, t0: float):
        cfg = self.config
        deadline = t0 + cfg.total_timeout_s
        self._task_vendor = self._vendor_allowance(task)
        library = self._build_workspace(cand, v)
        if cand.kind != "workspace":
            v.compiled = True  # set back to False if a load_inline build fails

        ref = self._reference(task)
        t_phase = time.monotonic()
        eager = self._baseline(task, ref, "eager")
        null = self._baseline(task, ref, "null")
        v.eager = eager.timing
        if cfg.compile_mode != "none":
            v.compiled_ref = self._baseline(task, ref, cfg.compile_mode).timing
        v.phase_s["baseline"] = time.monotonic() - t_phase

        setup = self._setup(task, ref, secrets.randbits(31))
        v.seeds = {"init": setup.init_seed}
        t_phase = time.monotonic()
        built_before = v.phase_s.get("build") or 0.0
        session = self._start(task, cand.model_new, library, setup, v, deadline, trusted=False)
        v.isolation = session.proc.isolation
        v.reduced_isolation = session.reduced_isolation
        # load_inline builds happen while the candidate starts; they count as build, not start
        v.phase_s["start"] = time.monotonic() - t_phase - ((v.phase_s.get("build") or 0.0) - built_before)
        try:
            if session.ready.get("timing_gate") and self.device == "cuda":
                v.notes.append(f"calls timed without the timing gate (launch gaps included): "
                               f"{str(session.ready['timing_gate'])[:200]}")
            if session.ready.get("unmatched"):
                v.notes.append(f"parameters not copied from Model (different name or shape): "
                               f"{', '.join(session.ready['unmatched'][:8])}")
            t_phase = time.monotonic()
            roles = ["check"] * cfg.n_check + ["warmup"] * cfg.n_warmup + ["timed"] * cfg.n_timed
            inside, outside = self._drive(session, ref, setup, roles, v, deadline)
            rec = self._reconcile(session, inside, outside, null)
            if rec.gross_lie:
                # A loaded machine can stretch the judge's clock for a while; a candidate that lies
                # about its time lies again. One more round of timed calls (fresh inputs, each
                # output checked) decides, so a burst of load does not fail an honest candidate.
                session.protocol_ms, session.methods = [], []
                inside, outside = self._drive(session, ref, setup, ["timed"] * cfg.n_timed, v, deadline,
                                              first_index=len(roles))
                rec = self._reconcile(session, inside, outside, null)
            v.phase_s["calls"] = time.monotonic() - t_phase
        finally:
            session.close()
        v.correct = True
        v.runtime = rec.timing
        if rec.note:
            v.notes.append(rec.note)
        if rec.gross_lie:
            v.correct = False
            raise _Stop(FC.TIMING, rec.note)

    def _reconcile(self, session: "_Session", inside: list[float], outside: list[float], null: "_Baseline"):
        rel_slack, abs_slack = self.config.slack()
        return reconcile(inside, outside, null.overhead_ms, rel_slack=rel_slack, abs_slack_ms=abs_slack,
                         cores=self._cores if self.device == "cpu" else 1, source=session.timing_method(),
                         protocol_ms=session.protocol_ms, baseline_protocol_ms=null.protocol_ms)

    def _setup(self, task: Task, ref: _Reference, init_seed: int) -> "_Setup":
        """The reference model under `init_seed`, its weights and the transport sizes."""
        cfg = self.config
        torch.manual_seed(init_seed)
        init_args = list(ref.get_init_inputs())
        ref_model = ref.Model(*init_args).to(self.device)
        items = list(ref_model.state_dict().items())
        state_names = [k for k, _ in items]
        state_values = [t.detach().cpu() for _, t in items]
        probe_inputs = self._inputs(ref, secrets.randbits(63), 0)
        with torch.no_grad():
            probe = _to_list(ref_model(*probe_inputs))
        out_bytes = nbytes_of(probe)
        limit_mb = cfg.output_limit_mb()
        if out_bytes > limit_mb << 20:
            raise JudgeError(f"task {task.name}: reference output of {out_bytes >> 20} MiB exceeds the judge's output "
                             f"limit of {limit_mb} MiB; raise the setting max_output_mb (e.g. -c max_output_mb="
                             f"{(out_bytes >> 20) + 1024})")
        in_bytes = max(nbytes_of(state_values) + nbytes_of(init_args), nbytes_of(probe_inputs)) + (1 << 20)
        outputs = [(list(t.shape), str(t.dtype).removeprefix("torch.")) if isinstance(t, torch.Tensor) else None
                   for t in probe]
        return _Setup(init_seed, init_args, ref_model, state_names, state_values, in_bytes, out_bytes, outputs)

    def _expected64(self, setup: "_Setup", inputs: list) -> list | None:
        """The reference on a checked call's inputs in float64 (a double copy of the model, made once
        per setup; floating inputs cast to double), the basis of the noise-scaled bound. None where
        that is off or impossible (an op without double support, a model that breaks when cast, no
        memory for the copy): those calls keep the fixed bound."""
        if self.config.ref_noise_multiple <= 0 or setup.ref64_problem is not None:
            return None
        try:
            if setup.ref64 is None:
                setup.ref64 = copy.deepcopy(setup.ref_model).double()
            args = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            with torch.no_grad():
                out = _to_list(setup.ref64(*args))
        except Exception as exc:  # the task's code in float64: any failure means "no float64 basis"
            setup.ref64 = None
            setup.ref64_problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if self.device == "cuda":
                torch.cuda.empty_cache()
            return None
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in out]

    def _start(self, task: Task, model_new: str, library: Path | None, setup: "_Setup", v: Verdict | None,
               deadline: float, trusted: bool) -> "_Session":
        """Start a process running `model_new` under the call protocol and construct its ModelNew."""
        cfg = self.config
        if not trusted and seccomp_problem():  # the judge's own check: a candidate cannot fake it
            raise _Stop(FC.JUDGE, seccomp_problem())
        # The output half holds exactly what a correct candidate returns (plus slack); anything
        # larger is wrong anyway and is reported as such by the candidate's own harness.
        plane = DataPlane.create(setup.in_bytes, setup.out_bytes + (1 << 20))
        shared = None
        if self.device == "cuda":
            try:
                shared = SharedGpuBuffer.create(plane.size)
            except CudaIpcError as exc:
                self._gpu_plane_problem = str(exc)
                plane.pin()
        try:
            proc, chan = self._spawn(task, model_new, plane, library)
        except BaseException:
            plane.close()
            if shared is not None:
                shared.close()
            raise
        session = _Session(proc, chan, plane, shared)
        session.trusted = trusted
        try:
            init_meta = pack(setup.init_args, plane.view, 0, plane.in_size)
            init_end = packed_end(init_meta)  # tensors nested in containers count too
            start = (init_end + 63) // 64 * 64
            state_meta = pack(setup.state_values, plane.view, start, plane.in_size - start)
            chan.send({"device": self.device, "candidate_path": str(proc.spec.workdir / "model_new.py"),
                       "reference_path": str(proc.spec.workdir / "model.py"),
                       "library": str(proc.spec.workdir / "cuda_extension.so") if library else None,
                       "init_args": init_meta, "state": state_meta, "state_names": setup.state_names,
                       "init_seed": setup.init_seed, "flush": cfg.flush_l2, "trusted": trusted,
                       "observer": str(proc.spec.workdir / obs.FILE), "policy": cfg.policy,
                       "poison_bytes": setup.out_bytes if self.device == "cuda" else 0,
                       "gpu_plane": shared.handle.hex() if shared is not None else None,
                       "require": proc.required_isolation()})
            session.ready = self._serve_init(chan, proc, v if v is not None else _scratch_verdict(task),
                                             min(deadline, time.monotonic() + cfg.init_timeout_s))
            if shared is not None and session.ready.get("gpu_plane") is not True:
                # The process could not map the GPU region: calls go through the host plane.
                self._gpu_plane_problem = str(session.ready.get("gpu_plane_error"))[:300]
                shared.close()
                session.shared = None
                plane.pin()
            proc.probe_isolation()
            if not trusted:
                # The kernel's record, not the process's word: a candidate whose isolation is
                # incomplete may have done anything, so its numbers are not a verdict.
                missing, session.reduced_isolation = proc.isolation_gaps(session.ready.get("audit_hook") is True)
                if missing:
                    raise _Stop(FC.JUDGE, "isolation of the candidate process was incomplete, so its results "
                                          "cannot be trusted: missing " + "; ".join(missing))
        except BaseException:
            session.close()
            raise
        return session

    def _drive(self, session: "_Session", ref: _Reference, setup: "_Setup", roles: list[str],
               v: Verdict | None, deadline: float,
               first_index: int = 0) -> tuple[list[float], list[float]]:
        """Run the calls. Every call: fresh inputs revealed only when its clock starts, the output
        compared here (when `v` is given), the inputs read back and checked for modification.
        Returns the claimed and the outside-measured times of the timed calls. `first_index`
        numbers the calls of a later round after those of the first."""
        cfg = self.config
        dev = self.device
        proc, chan, plane = session.proc, session.chan, session.plane
        judged = v is not None
        inside: list[float] = []
        outside: list[float] = []
        expected_checks: list[list] = []
        idle_wall = idle_cpu = 0.0
        idle_mark: tuple[float, int] | None = None
        # Where the calls phase goes (reported as phase_s "calls:*"): the judge's own reference
        # work, the candidate's side of each call and the judge's checks.
        split = dict.fromkeys(("reference", "candidate", "check"), 0.0)
        for i, role in enumerate(roles, start=first_index):
            t_ref = time.perf_counter()
            seed = secrets.randbits(63)
            inputs = self._inputs(ref, seed, i)
            expected = expected64 = None
            if judged:
                with torch.no_grad():
                    expected = _to_list(setup.ref_model(*inputs))
                if role == "check":
                    expected_checks.append([e.detach() if isinstance(e, torch.Tensor) else e for e in expected])
                    expected64 = self._expected64(setup, inputs)
            if dev == "cuda":
                torch.cuda.synchronize()
            t_prepare = time.perf_counter()
            split["reference"] += t_prepare - t_ref
            if idle_mark is not None:
                # Between calls the candidate has nothing to do; CPU it burns here is work kept out
                # of the timed window (watcher threads, precomputation, starving the judge).
                idle_wall += time.perf_counter() - idle_mark[0]
                idle_cpu += (_cpu_ns(proc.pid) - idle_mark[1]) / 1e9
            t_ask = time.perf_counter()
            chan.send({"op": "prepare"})
            ready = self._recv(chan, proc, min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
            protocol_ms = (time.perf_counter() - t_ask) * 1e3
            if not ready.get("ok"):
                self._raise_reported(ready, v)
            # The clock starts before the inputs exist anywhere the candidate can read them.
            cpu_before = _cpu_ns(proc.pid) if dev == "cpu" else 0
            t_send = time.perf_counter()
            meta = pack(inputs, session.calls, 0, plane.in_size)
            if session.shared is not None:
                torch.cuda.synchronize()  # the inputs are in place before the process hears of them
            # The kernels a call launches are listed on the checked calls: CUDA's activity tracing adds
            # ~20 us of GPU time per kernel on an H200, which would be timed with the kernel. The
            # operators it runs are observed on every call (observer.cpp), at no such cost.
            chan.send({"op": "call", "index": i, "inputs": meta, "kernels": role == "check"})
            reply = self._recv(chan, proc, min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
            t_reply = time.perf_counter()
            wall_ms = (t_reply - t_send) * 1e3
            cpu_ms = (_cpu_ns(proc.pid) - cpu_before) / 1e6 if dev == "cpu" else None
            split["candidate"] += t_reply - t_prepare
            if not reply.get("ok"):
                self._raise_reported(reply, v)
            if dev == "cuda" and role == "check":
                # the kernels the call launched follow its reply, outside the call's clock (worker.py)
                listed = self._recv(chan, proc, min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
                if not listed.get("ok"):
                    self._raise_reported(listed, v)
                if listed.get("op") != "kernels":
                    raise _Stop(FC.TAMPERING, f"call {i}: the candidate process did not list its kernels")
                reply["kernels"] = listed.get("kernels")
            claimed = _num(reply.get("inside_ms"))
            measured = cpu_ms if cpu_ms is not None else wall_ms
            if judged:
                self._check_call(session, i, role, inputs, meta, expected, reply, claimed, measured, v, deadline,
                                 expected64=expected64)
                split["check"] += time.perf_counter() - t_reply
            if role == "timed" and claimed is not None:
                inside.append(claimed)
                outside.append(measured)
                session.protocol_ms.append(protocol_ms)
                session.methods.append(str(reply.get("timing") or "events")[:16])
            idle_mark = (time.perf_counter(), _cpu_ns(proc.pid))
        if judged:
            for k, x in split.items():
                v.phase_s[f"calls:{k}"] = v.phase_s.get(f"calls:{k}", 0.0) + x
            if expected_checks:
                v.task_warnings = degenerate_warnings(expected_checks, atol=cfg.atol, rtol=cfg.rtol)
            if setup.ref64_problem and cfg.ref_noise_multiple > 0:
                note = f"no float64 reference ({setup.ref64_problem}): fixed relative L2 bounds"
                if note not in v.notes:
                    v.notes.append(note)
            if idle_cpu > 0.3 * idle_wall + 0.02:
                raise _Stop(FC.TIMING, f"the candidate process used {idle_cpu * 1e3:.0f} ms of CPU time while it had "
                                       f"no call to serve ({idle_wall * 1e3:.0f} ms): work outside the timed calls")
        if len(inside) < 2:
            raise _Stop(FC.JUDGE, "too few timed calls to report a time")
        return inside, outside

    def _check_call(self, session: "_Session", i: int, role: str, inputs: list, meta: list, expected: list,
                    reply: dict, claimed: float | None, measured: float, v: Verdict, deadline: float,
                    expected64: list | None = None) -> None:
        cfg = self.config
        plane = session.plane
        # Tampering first: a changed global flag or a replaced function can also change the outputs
        # (lower matmul precision, for one, on CPUs with AMX), and then the verdict must name the cause.
        known = len(v.policy_violations)
        self._blocked(reply, v)
        if len(v.policy_violations) > known:  # the sandbox refused something during this call
            raise _Stop(FC.POLICY, v.policy_violations[known])
        tampered = _strs(reply.get("tampered"))
        if tampered:
            v.policy_violations.append(f"forward replaced library functions: {', '.join(tampered[:5])}")
            raise _Stop(FC.TAMPERING, v.policy_violations[-1])
        changed = _strs(reply.get("flags_changed"))
        if changed:
            v.policy_violations.append(f"forward changed global numeric settings: {', '.join(changed)}")
            raise _Stop(FC.TAMPERING, v.policy_violations[-1])
        try:
            got = unpack(reply.get("outputs"), session.calls, plane.out_offset, plane.out_size,
                         self.device if session.shared is not None else "cpu")
        except TransportError as exc:
            raise _Stop(FC.MISMATCH, f"call {i}: unusable output: {exc}") from None
        if session.shared is not None:  # views of memory the candidate can still write: snapshot first
            got = [snapshot(g) for g in got]
        cmp = compare_outputs(expected, got, atol=cfg.atol, rtol=cfg.rtol, max_rel_l2=cfg.max_rel_l2,
                              expected64=expected64, noise_multiple=cfg.ref_noise_multiple,
                              rel_l2_ceiling=cfg.max_rel_l2_ceiling,
                              rel_l2_bounds=None if role == "check" else session.rel_l2_bounds)
        if role == "check":
            # Later calls (no float64 reference) keep the widest bound the checked calls found.
            old = session.rel_l2_bounds or [None] * len(cmp.later_bounds)
            session.rel_l2_bounds = [b if a is None else a if b is None else max(a, b)
                                     for a, b in zip(old, cmp.later_bounds)] or None
            if cmp.rel_l2_err_f64 is not None:
                v.max_rel_l2_err_f64 = max(v.max_rel_l2_err_f64 or 0.0, cmp.rel_l2_err_f64)
            if cmp.ref_noise_rel_l2 is not None:
                v.ref_noise_rel_l2 = max(v.ref_noise_rel_l2 or 0.0, cmp.ref_noise_rel_l2)
            if cmp.rel_l2_bound is not None:
                v.rel_l2_bound = min(v.rel_l2_bound, cmp.rel_l2_bound) if v.rel_l2_bound is not None \
                    else cmp.rel_l2_bound
        if cmp.ok and len(expected) == 1 and isinstance(expected[0], torch.Tensor) \
                and reply.get("structure") != "tensor":
            cmp = type(cmp)(False, f"output is a {reply.get('structure')}, expected a single tensor")
        v.max_abs_err = max(v.max_abs_err or 0.0, cmp.max_abs_err)
        v.max_rel_l2_err = max(v.max_rel_l2_err or 0.0, cmp.rel_l2_err)
        v.calls.append(CallRecord(index=i, role=role, inside_ms=claimed, outside_ms=measured,
                                  max_abs_err=cmp.max_abs_err, rel_l2_err=cmp.rel_l2_err,
                                  rel_l2_err_f64=cmp.rel_l2_err_f64, ref_noise_rel_l2=cmp.ref_noise_rel_l2,
                                  rel_l2_bound=cmp.rel_l2_bound, ok=cmp.ok))
        if not cmp.ok:
            raise _Stop(FC.MISMATCH, f"call {i} ({'checked' if role == 'check' else role}): {cmp.message}")
        v.n_checked += 1
        # Every call's inputs come back (after its clock stopped) and are compared with what was sent:
        # read in place where the process got views of them (the shared GPU region; the host plane
        # on the CPU backend), asked for otherwise (CUDA without GPU sharing copies them over).
        if session.shared is not None:
            back = unpack(meta, session.calls, 0, plane.in_size, self.device)
        elif self.device == "cpu":
            back = unpack(meta, plane.view, 0, plane.in_size)
        else:
            session.chan.send({"op": "echo"})
            echo = self._recv(session.chan, session.proc, min(deadline, time.monotonic() + cfg.call_timeout_s),
                              f"call {i}")
            if not echo.get("ok"):
                raise _Stop(FC.RUNTIME, f"call {i}: reading back the inputs failed: {str(echo.get('message'))[:500]}")
            try:
                back = unpack(echo.get("echo"), plane.view, 0, plane.in_size)
            except TransportError:
                raise _Stop(FC.MISMATCH, f"call {i}: the candidate process did not return its inputs") from None
        self._check_echo(inputs, back, i)
        # every call's operators, checked, warm-up and timed alike; the kernels of the checked calls
        found = [] if session.trusted else pol.check_dispatched(_strs(reply.get("ops")), cfg.policy)
        found += [] if session.trusted else pol.check_kernels(_strs(reply.get("kernels")), cfg.policy)
        if found:
            v.policy_violations.extend(found)
            raise _Stop(FC.POLICY, found[0])

    def _baseline(self, task: Task, ref: _Reference, mode: str) -> "_Baseline":
        """Times of a trusted implementation under the very protocol candidates get, with no
        candidate process alive: `eager` (the reference), a torch.compile mode, or `null` (returns
        outputs of the right shape without computing: the cost of the protocol itself)."""
        cfg = self.config
        bkey = BaselineKey(harness_version=_HARNESS_VERSION, task_id=task.id, device_name=self.device_name,
                           torch_version=torch.__version__, mode=mode, flush_l2=cfg.flush_l2, n_timed=cfg.n_timed,
                           n_warmup=cfg.n_warmup)
        key = bkey.digest()
        if key in self._baselines:
            return self._baselines[key]
        if cfg.cache_baselines:
            stored = self.baseline_store.get(bkey)
            if stored is not None:
                self._baselines[key] = stored
                return stored
        setup = self._setup(task, ref, secrets.randbits(31))
        source = _baseline_source(mode, setup.outputs)
        try:
            session = self._start(task, source, None, setup, None, time.monotonic() + cfg.total_timeout_s,
                                  trusted=True)
        except _Stop as stop:
            raise JudgeError(f"task {task.name}: {mode} baseline failed: {stop.failure.message}") from None
        try:
            roles = ["warmup"] * (cfg.n_warmup + (2 if mode not in ("eager", "null") else 0)) + ["timed"] * cfg.n_timed
            try:
                inside, outside = self._drive(session, ref, setup, roles, None, time.monotonic() + cfg.total_timeout_s)
            except _Stop as stop:
                raise JudgeError(f"task {task.name}: {mode} baseline failed: {stop.failure.message}") from None
        finally:
            session.close()
        overhead = statistics.median(outside if mode == "null" else [max(o - i, 0.0) for i, o in zip(inside, outside)])
        base = _Baseline(timing=summarize(inside, session.timing_method()),
                         overhead_ms=overhead,
                         protocol_ms=statistics.median(session.protocol_ms) if session.protocol_ms else None)
        self._baselines[key] = base
        if cfg.cache_baselines:
            self.baseline_store.put(bkey, base)
        return base

    def _build_workspace(self, cand: Candidate, v: Verdict) -> Path | None:
        """The plan's refusal or a workspace's build, recorded in `v` (raises _Stop with the
        failure). A single file's load_inline builds wait until its module asks for them."""
        plan = self.build_plan(cand)
        if plan.load_error is not None:
            raise _Stop(FC.LOAD, plan.load_error)
        if plan.violations:
            v.policy_violations.extend(plan.violations)
            raise _Stop(FC.POLICY, plan.violations[0])
        return self._build(plan.specs[0], v) if cand.kind == "workspace" else None

    def _build(self, spec: BuildSpec, v: Verdict) -> Path:
        built = build_spec(self.builder, spec, policy=self.config.policy, device=self.device,
                           vendor=self._task_vendor)
        if built.library is None:
            v.compiled = False
            raise _Stop(built.failure.category, built.failure.message)
        v.compiled = True
        v.build_s = (v.build_s or 0.0) + built.seconds
        v.phase_s["build"] = v.build_s
        if built.note:
            v.notes.append(built.note)
        if built.violations:
            v.policy_violations.extend(built.violations)
            raise _Stop(FC.POLICY, built.violations[0])
        v.build_cached = built.cached if v.build_cached is None else (v.build_cached and built.cached)
        return built.library

    def _vendor_allowance(self, task: Task) -> frozenset[str]:
        """cuBLAS GEMMs if the task's reference has a GEMM, cuDNN convolutions if it has a convolution;
        learnt once per task."""
        got = self._vendor.get(task.id)
        if got is None:
            got = self._vendor[task.id] = pol.vendor_allowance(_reference_ops(self._reference(task), self.device))
        return got

    def _reference(self, task: Task) -> _Reference:
        ref = self._references.get(task.id)
        if ref is None:
            ref = self._references[task.id] = _Reference(task)
        return ref

    def _spawn(self, task: Task, model_new: str, plane: DataPlane, library: Path | None):
        zygote = self._get_zygote()
        if zygote is None:
            # The oldest spare (torch imported, GPU context made, or nearly so) takes the task;
            # replacements start now, each under a uid no other live worker has, so that cleaning
            # up after this one cannot touch them.
            spare = None
            while self._spares and spare is None:
                spare = self._spares.pop(0)
                if not spare[0].alive():
                    self._drop_spare(spare)
                    spare = None
            proc, sock = spare if spare is not None else self._launch()
            try:
                send_plane(sock, plane.fd, plane.size, plane.in_size)
            except OSError:  # the spare died after all: start one for this task
                self._drop_spare((proc, sock))
                proc, sock = self._launch()
                send_plane(sock, plane.fd, plane.size, plane.in_size)
            self._live.append(proc)
            pin_threads(proc.pid, self.config.timing_cpus)
            while len(self._spares) < self.config.spares:
                spare = self._launch()
                pin_threads(spare[0].pid, self.config.spare_cpus)  # its start-up stays off the timed cores
                self._spares.append(spare)
        else:
            proc, sock = self._launch(zygote, plane)
            self._live.append(proc)
        workdir = proc.spec.workdir
        # The judge's operator observer, loaded by the worker before anything of the task. Owned by
        # the judge (not chowned): the candidate's uid cannot rewrite it.
        shutil.copy2(self._observer_library(), workdir / obs.FILE)
        (workdir / "model_new.py").write_text(model_new)
        (workdir / "model.py").write_text(task.source)
        if library is not None:
            shutil.copy2(library, workdir / "cuda_extension.so")
        if proc.uid is not None:
            for name in ("model_new.py", "model.py", "cuda_extension.so"):
                if (workdir / name).exists():
                    os.chown(workdir / name, proc.uid, proc.uid)
        proc.reset_disk_baseline()
        return proc, Channel(sock)

    def _observer_library(self) -> Path:
        """observer.cpp built once per toolchain (the judge's own build, never a candidate's)."""
        if self._observer is None:
            try:
                self._observer = self.builder.build(obs.spec()).library
            except BuildError as exc:
                raise JudgeError(f"the judge's operator observer does not build: {exc}") from None
        return self._observer

    def _launch(self, zygote: Zygote | None = None, plane: DataPlane | None = None) -> tuple[Sandboxed, socket.socket]:
        """A worker process with nothing of a task yet. Forked from the zygote, it gets the data
        plane at once; started as a fresh interpreter, it waits for it (see `send_plane`)."""
        workdir = new_workdir(self.work_root / "runs", "cand-")
        parent_sock, child_sock = socket.socketpair()
        if self.device == "cpu":
            # idle OpenMP threads must sleep, not spin: spinning would be charged to the next call
            env = {"CUDA_VISIBLE_DEVICES": "", "OMP_WAIT_POLICY": "PASSIVE"}
        else:
            env = {"CUDA_AGENT_PREINIT": "cuda"}
        plane_args = (plane.fd, plane.size, plane.in_size) if plane is not None else (-1, 0, 0)
        uid = self.uid
        if self.uid is not None and zygote is None:
            # Live worker and spares never share a uid: at most 1 + spares are alive at once.
            self._launches += 1
            uid = host.spare_uid(self.uid, self._launches % (self.config.spares + 1))
        spec = SandboxSpec(
            argv=python_argv("cuda_agent.judge.worker", str(child_sock.fileno()), *map(str, plane_args)),
            workdir=workdir, uid=uid, pass_fds=(child_sock.fileno(),) + ((plane.fd,) if plane else ()), env=env,
            address_space_mb=(self.config.memory_limit_mb + 8192) if self.device == "cpu" else None,
            target="worker", target_args=list(plane_args[1:]), hide=(self.config.cache_dir, self.work_root))
        try:
            proc = Sandboxed(spec, zygote)
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        return proc, parent_sock

    @staticmethod
    def _drop_spare(spare) -> None:
        if spare is not None:
            spare[1].close()
            spare[0].cleanup()

    def _recv(self, chan: Channel, proc: Sandboxed, deadline: float, what: str) -> dict:
        """Wait for a message while watching the process's health and memory."""
        limit = self.config.memory_limit_mb
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Stop(FC.TIMEOUT, f"{what} did not finish within its time limit")
            try:
                return chan.recv(timeout=min(remaining, 0.25))
            except ChannelTimeout:
                pass
            except ChannelClosed:
                proc.proc.wait(timeout=5) if proc.proc.poll() is None else None
                raise _Stop(FC.CRASH, f"the candidate process died during {what} "
                                      f"({proc.exit_description()}):\n{_log_excerpt(proc)}") from None
            except ProtocolError as exc:
                raise _Stop(FC.TAMPERING, f"malformed message from the candidate process: {exc}") from None
            if not proc.alive():
                raise _Stop(FC.CRASH, f"the candidate process died during {what} "
                                      f"({proc.exit_description()}):\n{_log_excerpt(proc)}")
            if proc.rss_mb() > limit:
                raise _Stop(FC.OOM, f"the candidate process exceeded {limit} MiB of host memory during {what}")
            used = proc.disk_used_mb()
            if used > self.config.disk_limit_mb:
                raise _Stop(FC.RESOURCE, f"the candidate process used {used:.0f} MiB of disk during {what} "
                                         f"(limit {self.config.disk_limit_mb} MiB)")

    def _serve_init(self, chan: Channel, proc: Sandboxed, v: Verdict, deadline: float) -> dict:
        while True:
            msg = self._recv(chan, proc, deadline, "loading the candidate")
            if msg.get("op") == "build":
                started = time.monotonic()
                chan.send(self._serve_build(msg, proc, v))
                # compile time has its own limit (build_timeout_s); it does not count as loading time
                deadline += time.monotonic() - started
                continue
            if not msg.get("ok"):
                self._raise_reported(msg, v, setup=True)
            self._blocked(msg, v)
            return msg

    def _serve_build(self, msg: dict, proc: Sandboxed, v: Verdict) -> dict:
        try:
            spec = spec_from_request(msg)
        except BuildError as exc:
            self._build_failure = Failure(category=FC.COMPILE, message=str(exc))
            return {"ok": False, "message": str(exc)}
        refusal = inline_refusal(spec, self.device, self.config.policy)
        if refusal is not None:
            if refusal.category == "policy":
                v.policy_violations.extend(refusal.violations)
            else:
                self._build_failure = Failure(category=FC.COMPILE, message=refusal.message)
            return {"ok": False, "message": refusal.message}
        try:
            library = self._build(spec, v)
        except _Stop as stop:
            self._build_failure = stop.failure
            return {"ok": False, "message": stop.failure.message}
        dest = proc.spec.workdir / f"lib_{spec.name}.so"
        shutil.copy2(library, dest)
        if proc.uid is not None:
            os.chown(dest, proc.uid, proc.uid)
        return {"ok": True, "library": str(dest)}

    def _raise_reported(self, msg: dict, v: Verdict | None, setup: bool = False) -> None:
        if v is None:  # a trusted baseline run: nothing to blame on a candidate
            raise _Stop(FC.JUDGE, str(msg.get("message", "the baseline process reported an error"))[:6000])
        self._blocked(msg, v)
        if v.policy_violations:
            raise _Stop(FC.POLICY, v.policy_violations[0])
        build_failure = self._build_failure
        if build_failure is not None:
            v.compiled = False
            raise _Stop(build_failure.category, build_failure.message)
        reported = ErrorCategory.parse(msg.get("category"))
        if reported is ErrorCategory.JUDGE and not setup:  # the worker reports its set-up only before any call
            reported = ErrorCategory.RUNTIME
        raise _Stop(FC(reported.value), str(msg.get("message", "the candidate reported an error"))[:6000])

    @staticmethod
    def _blocked(msg: dict, v: Verdict) -> None:
        blocked = msg.get("blocked") or []
        if isinstance(blocked, list) and blocked:
            for b in blocked[:5]:
                text = f"the sandbox refused: {str(b)[:200]}"
                if text not in v.policy_violations:
                    v.policy_violations.append(text)

    # -------------------------------------------------------------------------------- calls
    def _inputs(self, ref: _Reference, seed: int, index: int) -> list:
        """A fresh input set: the task's own distribution under a secret seed, rescaled on some calls
        so that a kernel tuned to one value range is still checked on another."""
        torch.manual_seed(seed)
        # Drawn on the device: the task's own distribution, without a slow host-side generator.
        with torch.device(self.device):
            inputs = list(ref.get_inputs())
        if index % 3 == 1:
            rng = random.Random(seed)
            inputs = [x * rng.uniform(0.25, 1.0) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                      for x in inputs]
        return inputs

    @staticmethod
    def _check_echo(sent: list, back: list, i: int) -> None:
        if len(back) != len(sent):
            raise _Stop(FC.MISMATCH, f"call {i}: the candidate process returned {len(back)} inputs, not {len(sent)}")
        for k, (a, b) in enumerate(zip(sent, back)):
            if isinstance(a, torch.Tensor):
                a = a.detach().to(b.device) if isinstance(b, torch.Tensor) else a
                if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype \
                        or not torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)):
                    raise _Stop(FC.MISMATCH, f"call {i}: forward modified input {k} in place")

    def _get_zygote(self) -> Zygote | None:
        use = self.config.use_zygote if self.config.use_zygote is not None else self.device == "cpu"
        if not use:
            return None
        if self._zygote is None or self._zygote.proc.poll() is not None:
            self._zygote = Zygote(env={"OMP_WAIT_POLICY": "PASSIVE"} if self.device == "cpu" else {})
        return self._zygote




def _cpu_ns(pid: int) -> int:
    """CPU time (ns) the process has used so far, every thread it ever ran included.

    On the CPU backend this is the outside clock: unlike wall time it does not grow while the
    process waits for a core on a loaded machine, and the candidate cannot change it (it is read
    here, in the judge, from the kernel). Divided by the number of cores it is a lower bound of the
    wall time the work needed. The process-wide CPU clock (CPUCLOCK_SCHED of another process:
    `((~pid) << 3) | 2`) keeps the time of threads that have exited, which summing the live
    threads' schedstat misses; /proc/<pid>/stat (exited threads included, clock-tick resolution)
    is the fallback where that clock is unavailable.
    """
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except (OSError, OverflowError, AttributeError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x >= 0 else None


def _strs(x) -> list[str]:
    return [str(s)[:300] for s in x[:4096]] if isinstance(x, list) else []


def _log_excerpt(proc: Sandboxed) -> str:
    text = proc.log_tail(3000)
    lines = [ln for ln in text.splitlines() if "cuda_agent/judge" not in ln]
    return "\n".join(lines[-25:])


def judge(task: Task, candidate: Candidate, config: JudgeConfig | None = None) -> Verdict:
    """One-shot convenience wrapper around `Judge`."""
    with Judge(config) as j:
        return j.evaluate(task, candidate)
