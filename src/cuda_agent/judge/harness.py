"""The trusted side of the judge: builds, references, inputs, comparisons, timing decisions.

Data flow of one evaluation:

    static policy -> build (sandboxed compiler, cached, import table checked) -> baselines
    (trusted processes, same protocol, cached) -> candidate process starts and builds ModelNew
    (weights copied from Model) -> for every call: fresh inputs from a secret seed, reference
    output computed here, candidate output received as bytes and compared here, inputs read back
    -> the candidate's times checked against this process's clock -> Verdict -> reward

The candidate process never holds a reference output, a seed of an input it has not yet been
given, or anything that decides the verdict.
"""

from __future__ import annotations

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

from cuda_agent.candidate import Candidate
from cuda_agent.reward import reward_of
from cuda_agent.tasks import Task

from . import observer as obs
from . import policy as pol
from .baselines import Baseline as _Baseline, BaselineKey, BaselineStore, FileBaselineStore
from .build import Builder, BuildError, BuildSpec, build_arch, inline_spec, library_imports, workspace_spec
from .compare import compare_outputs, degenerate_warnings
from .config import JudgeConfig
from .cudaipc import CudaIpcError, SharedGpuBuffer
from .protocol import Channel, ChannelClosed, ChannelTimeout, DataPlane, ProtocolError, send_plane
from .sandbox import SandboxSpec, Sandboxed, Zygote, is_root, new_workdir, python_argv, work_root_dir
from .tensorio import TransportError, nbytes_of, pack, unpack
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


_HARNESS_VERSION = 6  # bump when the call protocol changes: cached baselines depend on it


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


class _Session:
    def __init__(self, proc: Sandboxed, chan: Channel, plane: DataPlane, shared: SharedGpuBuffer | None = None):
        self.proc, self.chan, self.plane, self.shared = proc, chan, plane, shared
        self.ready: dict = {}
        self.trusted = False  # the reference or a baseline: no candidate policy applies to what it runs

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
        self._cores = len(os.sched_getaffinity(0)) or 1
        # References in true fp32: TF32 matmul/convolution would make the reference itself the
        # less precise side (the fp32 tolerance is 1e-4 relative L2). Process-wide by necessity.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.arch = arch = build_arch(self.device, config.arch)
        # Two judges must not share a uid (cleaning up after one's worker would kill the other's):
        # the process id spreads processes, the instance count the judges of one process.
        Judge._instances += 1
        self.uid = (config.sandbox_uid or 61000 + (os.getpid() + 997 * Judge._instances) % 4000) if is_root() else None
        self.work_root = work_root_dir()
        self._zygote: Zygote | None = None
        self._spares: list[tuple[Sandboxed, socket.socket]] = []  # workers started ahead of need, oldest first
        self._launches = 0
        # Builds run under their own uid: cleaning up after a build kills every process of its uid,
        # which must never include the candidate process waiting for that build.
        self.builder = Builder(config.cache_dir, self.work_root, arch=arch, timeout_s=config.build_timeout_s,
                               uid=None if self.uid is None else self.uid + 5000, zygote=self._get_zygote)
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
        gets correct=False and the reason in `failure`; the reward is not computed."""
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
            v.eager = summarize(inside)
        except _Stop as stop:
            v.failure = stop.failure
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
        r = reward_of(verdict, self.config.reward)
        verdict.reward, verdict.reward_reason = r.value, r.reason
        return verdict

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
        return {self.uid + 10000 * i for i in range(self.config.spares + 1)}

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
        self._static_checks(cand, v)
        self._task_vendor = self._vendor_allowance(task)

        library = None
        if cand.kind == "workspace":
            library = self._build(self._workspace_spec(cand), v)
        else:
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
        # load_inline builds happen while the candidate starts; they count as build, not start
        v.phase_s["start"] = time.monotonic() - t_phase - ((v.phase_s.get("build") or 0.0) - built_before)
        try:
            if session.ready.get("unmatched"):
                v.notes.append(f"parameters not copied from Model (different name or shape): "
                               f"{', '.join(session.ready['unmatched'][:8])}")
            t_phase = time.monotonic()
            roles = ["check"] * cfg.n_check + ["warmup"] * cfg.n_warmup + ["timed"] * cfg.n_timed
            inside, outside = self._drive(session, ref, setup, roles, v, deadline)
            rel_slack, abs_slack = cfg.slack()
            cores = self._cores if self.device == "cpu" else 1
            rec = reconcile(inside, outside, null.overhead_ms, rel_slack=rel_slack, abs_slack_ms=abs_slack,
                            cores=cores)
            if rec.gross_lie:
                # A loaded machine can stretch the judge's clock for a while; a candidate that lies
                # about its time lies again. One more round of timed calls (fresh inputs, each
                # output checked) decides, so a burst of load does not fail an honest candidate.
                inside, outside = self._drive(session, ref, setup, ["timed"] * cfg.n_timed, v, deadline,
                                              first_index=len(roles))
                rec = reconcile(inside, outside, null.overhead_ms, rel_slack=rel_slack, abs_slack_ms=abs_slack,
                                cores=cores)
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
        if out_bytes > cfg.max_output_mb << 20:
            raise JudgeError(f"task {task.name}: reference output of {out_bytes >> 20} MiB exceeds max_output_mb")
        in_bytes = max(nbytes_of(state_values) + nbytes_of(init_args), nbytes_of(probe_inputs)) + (1 << 20)
        outputs = [(list(t.shape), str(t.dtype).removeprefix("torch.")) if isinstance(t, torch.Tensor) else None
                   for t in probe]
        return _Setup(init_seed, init_args, ref_model, state_names, state_values, in_bytes, out_bytes, outputs)

    def _start(self, task: Task, model_new: str, library: Path | None, setup: "_Setup", v: Verdict | None,
               deadline: float, trusted: bool) -> "_Session":
        """Start a process running `model_new` under the call protocol and construct its ModelNew."""
        cfg = self.config
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
            init_end = max([m["offset"] + m.get("nbytes", 0) for m in init_meta if m["t"] == "tensor"] + [0])
            start = (init_end + 63) // 64 * 64
            state_meta = pack(setup.state_values, plane.view, start, plane.in_size - start)
            chan.send({"device": self.device, "candidate_path": str(proc.spec.workdir / "model_new.py"),
                       "reference_path": str(proc.spec.workdir / "model.py"),
                       "library": str(proc.spec.workdir / "cuda_extension.so") if library else None,
                       "init_args": init_meta, "state": state_meta, "state_names": setup.state_names,
                       "init_seed": setup.init_seed, "flush": cfg.flush_l2, "trusted": trusted,
                       "observer": str(proc.spec.workdir / obs.FILE), "policy": cfg.policy,
                       "poison_bytes": setup.out_bytes if self.device == "cuda" else 0,
                       "gpu_plane": shared.handle.hex() if shared is not None else None})
            session.ready = self._serve_init(chan, proc, v if v is not None else _scratch_verdict(task),
                                             min(deadline, time.monotonic() + cfg.init_timeout_s))
            if shared is not None and session.ready.get("gpu_plane") is not True:
                # The process could not map the GPU region: calls go through the host plane.
                self._gpu_plane_problem = str(session.ready.get("gpu_plane_error"))[:300]
                shared.close()
                session.shared = None
                plane.pin()
            proc.probe_isolation()
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
            expected = None
            if judged:
                with torch.no_grad():
                    expected = _to_list(setup.ref_model(*inputs))
                if role == "check":
                    expected_checks.append([e.detach() if isinstance(e, torch.Tensor) else e for e in expected])
            if dev == "cuda":
                torch.cuda.synchronize()
            t_prepare = time.perf_counter()
            split["reference"] += t_prepare - t_ref
            if idle_mark is not None:
                # Between calls the candidate has nothing to do; CPU it burns here is work kept out
                # of the timed window (watcher threads, precomputation, starving the judge).
                idle_wall += time.perf_counter() - idle_mark[0]
                idle_cpu += (_cpu_ns(proc.pid) - idle_mark[1]) / 1e9
            chan.send({"op": "prepare"})
            ready = self._recv(chan, proc, min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
            if not ready.get("ok"):
                self._raise_reported(ready, v)
            # The clock starts before the inputs exist anywhere the candidate can read them.
            cpu_before = _cpu_ns(proc.pid) if dev == "cpu" else 0
            t_send = time.perf_counter()
            meta = pack(inputs, session.calls, 0, plane.in_size)
            if session.shared is not None:
                torch.cuda.synchronize()  # the inputs are in place before the process hears of them
            chan.send({"op": "call", "index": i, "inputs": meta})
            reply = self._recv(chan, proc, min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
            t_reply = time.perf_counter()
            wall_ms = (t_reply - t_send) * 1e3
            cpu_ms = (_cpu_ns(proc.pid) - cpu_before) / 1e6 if dev == "cpu" else None
            split["candidate"] += t_reply - t_prepare
            if not reply.get("ok"):
                self._raise_reported(reply, v)
            if dev == "cuda":
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
                self._check_call(session, i, role, inputs, meta, expected, reply, claimed, measured, v, deadline)
                split["check"] += time.perf_counter() - t_reply
            if role == "timed" and claimed is not None:
                inside.append(claimed)
                outside.append(measured)
            idle_mark = (time.perf_counter(), _cpu_ns(proc.pid))
        if judged:
            for k, x in split.items():
                v.phase_s[f"calls:{k}"] = v.phase_s.get(f"calls:{k}", 0.0) + x
            if expected_checks:
                v.task_warnings = degenerate_warnings(expected_checks, atol=cfg.atol, rtol=cfg.rtol)
            if idle_cpu > 0.3 * idle_wall + 0.02:
                raise _Stop(FC.TIMING, f"the candidate process used {idle_cpu * 1e3:.0f} ms of CPU time while it had "
                                       f"no call to serve ({idle_wall * 1e3:.0f} ms): work outside the timed calls")
        if len(inside) < 2:
            raise _Stop(FC.JUDGE, "too few timed calls to report a time")
        return inside, outside

    def _check_call(self, session: "_Session", i: int, role: str, inputs: list, meta: list, expected: list,
                    reply: dict, claimed: float | None, measured: float, v: Verdict, deadline: float) -> None:
        cfg = self.config
        plane = session.plane
        self._blocked(reply, v)
        try:
            got = unpack(reply.get("outputs"), session.calls, plane.out_offset, plane.out_size,
                         self.device if session.shared is not None else "cpu")
        except TransportError as exc:
            raise _Stop(FC.MISMATCH, f"call {i}: unusable output: {exc}") from None
        if session.shared is not None:  # views of memory the candidate can still write: snapshot first
            got = [g.clone() if isinstance(g, torch.Tensor) else
                   tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in g) if isinstance(g, tuple) else g
                   for g in got]
        cmp = compare_outputs(expected, got, atol=cfg.atol, rtol=cfg.rtol, max_rel_l2=cfg.max_rel_l2)
        if cmp.ok and len(expected) == 1 and isinstance(expected[0], torch.Tensor) \
                and reply.get("structure") != "tensor":
            cmp = type(cmp)(False, f"output is a {reply.get('structure')}, expected a single tensor")
        v.max_abs_err = max(v.max_abs_err or 0.0, cmp.max_abs_err)
        v.max_rel_l2_err = max(v.max_rel_l2_err or 0.0, cmp.rel_l2_err)
        v.calls.append(CallRecord(index=i, role=role, inside_ms=claimed, outside_ms=measured,
                                  max_abs_err=cmp.max_abs_err, rel_l2_err=cmp.rel_l2_err, ok=cmp.ok))
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
        # every call's operators and kernels, checked, warm-up and timed alike
        found = [] if session.trusted else pol.check_dispatched(_strs(reply.get("ops")), cfg.policy)
        found += [] if session.trusted else pol.check_kernels(_strs(reply.get("kernels")), cfg.policy)
        if found:
            v.policy_violations.extend(found)
            raise _Stop(FC.POLICY, found[0])
        tampered = _strs(reply.get("tampered"))
        if tampered:
            v.policy_violations.append(f"forward replaced library functions: {', '.join(tampered[:5])}")
            raise _Stop(FC.TAMPERING, v.policy_violations[-1])
        changed = _strs(reply.get("flags_changed"))
        if changed:
            v.policy_violations.append(f"forward changed global numeric settings: {', '.join(changed)}")
            raise _Stop(FC.TAMPERING, v.policy_violations[-1])

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
        base = _Baseline(timing=summarize(inside), overhead_ms=overhead)
        self._baselines[key] = base
        if cfg.cache_baselines:
            self.baseline_store.put(bkey, base)
        return base

    def _static_checks(self, cand: Candidate, v: Verdict) -> None:
        import ast

        try:
            tree = ast.parse(cand.model_new)
        except SyntaxError as exc:
            raise _Stop(FC.LOAD, f"model_new: syntax error at line {exc.lineno}: {exc.msg}") from None
        if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
            raise _Stop(FC.LOAD, "the candidate defines no class ModelNew at module level")
        violations = pol.check_python(cand.model_new, self.config.policy)
        for rel, src in cand.kernels:
            violations += pol.check_cpp(src, f"kernels/{rel}", self.config.policy)
        if violations:
            v.policy_violations.extend(violations)
            raise _Stop(FC.POLICY, violations[0])

    def _workspace_spec(self, cand: Candidate) -> BuildSpec:
        slot = f"ws:{cand.origin}" if cand.origin and cand.origin != "<memory>" else f"ws:{cand.hash}"
        try:
            return workspace_spec(cand.kernels, slot, self.device)
        except BuildError as exc:
            raise _Stop(FC.LOAD, str(exc)) from None

    def _build(self, spec: BuildSpec, v: Verdict) -> Path:
        try:
            result = self.builder.build(spec)
        except BuildError as exc:
            v.compiled = False
            raise _Stop(FC.COMPILE_TIMEOUT if exc.timeout else FC.COMPILE, str(exc)) from None
        v.compiled = True
        v.build_s = (v.build_s or 0.0) + result.seconds
        v.phase_s["build"] = v.build_s
        symbols = library_imports(result.library)
        if symbols is None:
            v.notes.append("nm not found: the compiled extension's imports were not checked")
        else:
            found = pol.check_binary(symbols, self.config.policy, self.device, vendor=self._task_vendor)
            if found:
                v.policy_violations.extend(found)
                raise _Stop(FC.POLICY, found[0])
        v.build_cached = result.cached if v.build_cached is None else (v.build_cached and result.cached)
        return result.library

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
            while len(self._spares) < self.config.spares:
                self._spares.append(self._launch())
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
            uid = self.uid + 10000 * (self._launches % (self.config.spares + 1))
        spec = SandboxSpec(
            argv=python_argv("cuda_agent.judge.worker", str(child_sock.fileno()), *map(str, plane_args)),
            workdir=workdir, uid=uid, pass_fds=(child_sock.fileno(),) + ((plane.fd,) if plane else ()), env=env,
            address_space_mb=(self.config.memory_limit_mb + 8192) if self.device == "cpu" else None,
            target="worker", target_args=list(plane_args[1:]))
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
                self._raise_reported(msg, v)
            self._blocked(msg, v)
            return msg

    def _serve_build(self, msg: dict, proc: Sandboxed, v: Verdict) -> dict:
        def text_list(x):
            if x is None:
                return []
            return [x] if isinstance(x, str) else list(x) if isinstance(x, (list, tuple)) else [str(x)]

        try:
            spec = inline_spec(
                name=str(msg.get("name")), cpp_sources=text_list(msg.get("cpp_sources")),
                cuda_sources=text_list(msg.get("cuda_sources")), functions=msg.get("functions"),
                cflags=[str(f) for f in text_list(msg.get("cflags"))],
                cuda_cflags=[str(f) for f in text_list(msg.get("cuda_cflags"))],
                ldflags=[str(f) for f in text_list(msg.get("ldflags"))],
                with_cuda=msg.get("with_cuda") if isinstance(msg.get("with_cuda"), bool) else None,
                with_pytorch_error_handling=bool(msg.get("with_pytorch_error_handling", True)))
        except BuildError as exc:
            self._build_failure = Failure(category=FC.COMPILE, message=str(exc))
            return {"ok": False, "message": str(exc)}
        if self.device == "cpu" and spec.with_cuda:
            msg_text = "CUDA sources cannot be built for the CPU backend"
            self._build_failure = Failure(category=FC.COMPILE, message=msg_text)
            return {"ok": False, "message": msg_text}
        violations = []
        for rel, src in spec.sources:
            violations += pol.check_cpp(src, f"{spec.name}/{rel}", self.config.policy)
        if violations:
            v.policy_violations.extend(violations)
            return {"ok": False, "message": "policy: " + violations[0]}
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

    def _raise_reported(self, msg: dict, v: Verdict | None) -> None:
        if v is None:  # a trusted baseline run: nothing to blame on a candidate
            raise _Stop(FC.JUDGE, str(msg.get("message", "the baseline process reported an error"))[:6000])
        self._blocked(msg, v)
        if v.policy_violations:
            raise _Stop(FC.POLICY, v.policy_violations[0])
        build_failure = self._build_failure
        if build_failure is not None:
            v.compiled = False
            raise _Stop(build_failure.category, build_failure.message)
        category = {"load": FC.LOAD, "init": FC.INIT, "runtime": FC.RUNTIME, "oom": FC.OOM}.get(
            str(msg.get("category")), FC.RUNTIME)
        raise _Stop(category, str(msg.get("message", "the candidate reported an error"))[:6000])

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
    """CPU time (ns) the process's threads have run so far, from the kernel's scheduler statistics.

    On the CPU backend this is the outside clock: unlike wall time it does not grow while the
    process waits for a core on a loaded machine, and the candidate cannot change it. Divided by
    the number of cores it is a lower bound of the wall time the work needed.
    """
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


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
