"""The judge: one evaluation from candidate to verdict, and the calls it makes (the comparisons and
timing decisions). Its parts each have one owner:

    evaluation.py  the state of one run (candidate, reference check or baseline) and its verdict
    session.py     one worker process under the call protocol: channel, data plane, health watch
    supply.py      worker processes: spares started ahead of need, the zygote, uid rotation
    builds.py      what is built for a candidate and the policy checks around it
    reference.py   the task's reference in this process: construction, fresh inputs, float64
    baselines.py   eager / torch.compile / null baselines: keys, cache, store, trusted sources
    protocol.py    the channel and the typed messages between judge and worker
    timing.py      how times are summarised and reconciled with the judge's clock

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

import contextlib
import hashlib
import json
import math
import os
import secrets
import shutil
import statistics
import time
from pathlib import Path

import torch

from cuda_agent import host
from cuda_agent.candidate import Candidate
from cuda_agent.hardware.sol import floor_breach
from cuda_agent.tasks import Task

from . import launches as ln
from . import memcheck as mc
from . import observer as obs
from . import policy as pol
from .baselines import (Baseline as _Baseline, BaselineCache, BaselineKey, BaselineStore, FileBaselineStore,
                        baseline_source)
from .build import BuildOutcome, Builder, BuildPlan, CandidateBuilds, build_arch
from .compare import (CEILING_NOISE_MULTIPLE, NOISE_DOMINATED, PROBE_DELTA, PROBE_FLOOR, changed_input,
                      compare_outputs, degenerate_warnings, response_error)
from .sol import task_speed_of_light
from .config import JudgeConfig
from .cudaipc import CudaIpcError, SharedGpuBuffer
from .devlock import DeviceLock
from .evaluation import Evaluation, JudgeError, Stop as _Stop
from .protocol import MAX_KERNELS, CallReply, Channel, DataPlane, InitRequest, Ready
from .reference import (Reference, Setup, fresh_inputs, make_setup, perturb_state, rebuild, reference_ops,
                        to_list)
from .reference import expected64 as reference_expected64
from .reference import reference_draws, set_training
from . import stochastic
from .sandbox import SandboxError, is_root, seccomp_problem, work_root_dir
from .session import Session
from .supply import WorkerSupply, ZygoteHolder
from .tensorio import TransportError, leaves, pack, packed_end, perturbed, snapshot, staged, unpack
from .timing import RELEASE_WAIT_S, CacheFlusher, bandwidth_probe, largest_floating, reconcile, summarize
from .verdict import CallRecord, Failure, FailureCategory as FC, StochasticCheck, Verdict
from .verdict_cache import VerdictCache

__all__ = ["Judge", "JudgeError", "judge"]


def _package_files() -> dict[str, str]:
    root = Path(__file__).resolve().parent.parent
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in {".py", ".h", ".cpp"} and "suite" not in path.parts:
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


_HARNESS_VERSION = 8  # bump when the call protocol changes: cached baselines depend on it


def _scratch_verdict(task: Task) -> Verdict:
    """The verdict a baseline run fills in: never returned, only its notes and violations are read."""
    return Verdict(task_id=task.id, task_name=task.name, candidate_hash="baseline", device="")


def release_call(session: Session, inputs: list, token: int, until: float, what: str):
    """Open a call's gate as the judge (JudgeConfig.gate_release="judge"): wait for the process
    to say that forward has enqueued its work (RELEASE_WAIT_S at most: a forward that waits on
    the host behind the gate gets its release then), write the call's inputs, then the token the
    gate waits for. Returns the moment of the release and, if the process answered with anything
    but `enqueued` (a failed forward), that answer."""
    first = session.recv(min(until, time.monotonic() + RELEASE_WAIT_S), what, or_none=True)
    pack(inputs, session.calls, 0, session.plane.in_size)
    if session.shared is not None:
        torch.cuda.synchronize()  # the inputs are in place before the gate opens
    t_release = time.perf_counter()
    session.plane.release(token)
    if first is None:
        first = session.recv(until, what)
    return t_release, (None if first.get("op") == "enqueued" and first.get("ok") else first)


class Judge:
    """A long-lived judge. `evaluate` never raises for a candidate's faults: it returns a Verdict."""

    _instances = 0

    def __init__(self, config: JudgeConfig | None = None, baseline_store: BaselineStore | None = None):
        """`baseline_store`: where measured baselines are kept (default: files under cache_dir/baselines)."""
        self.config = config = config or JudgeConfig()
        self.device = config.device
        if self.device == "cuda" and not torch.cuda.is_available():
            raise JudgeError("device 'cuda' requested but CUDA is not available (use --device cpu)")
        if config.memcheck and self.device == "cuda" and mc.sanitizer_problem():
            raise JudgeError(mc.sanitizer_problem())
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
        # Worker processes: spares started ahead of need, the zygote, a uid per live worker.
        self.supply = WorkerSupply(config, self.uid, self.work_root)
        # Builds run under their own uid: cleaning up after a build kills every process of its uid,
        # which must never include the candidate process waiting for that build.
        # One zygote where workers and builds both fork from one (the CPU backend's default), else
        # the builds' own (JudgeConfig.build_zygote).
        build_zygote = ZygoteHolder(config, builds=True)
        self._build_zygote = self.supply.zygote if build_zygote.wanted == self.supply.zygote.wanted else build_zygote
        if self._build_zygote is build_zygote:
            build_zygote()  # started now (not waited for): its imports overlap the judge's own set-up
        self.builder = Builder.for_config(config, self.work_root, arch=arch,
                                          uid=None if self.uid is None else host.build_uid(self.uid),
                                          zygote=self._build_zygote, cpus=config.spare_cpus)
        self.baseline_store = baseline_store or FileBaselineStore(config.cache_dir / "baselines")
        self.baselines = BaselineCache(self.baseline_store, persist=config.cache_baselines)
        self._integrity = _package_files()
        self._references: dict[str, Reference] = {}
        self.builds = CandidateBuilds(self.builder, self.device, config.policy)
        self.supply.launches_library = self.builds.launches_library
        # JudgeConfig.keep_gpu_plane: the GPU region kept from one process to the next, and its loan
        self._kept_region: SharedGpuBuffer | None = None
        self._region_loan: SharedGpuBuffer | None = None
        self._vendor: dict[str, frozenset[str]] = {}   # task id -> vendor libraries its candidates may call
        # Judges sharing this device: timed calls hold it alone, other calls share it (devlock.py).
        self._device_lock = DeviceLock(config.device_lock) if config.device_lock else None
        # CUDA processes flush the L2 again once a call's inputs are written (JudgeConfig.flush_after_inputs:
        # "on", "auto" (inputs over the L2's size) or "off")
        self._flushes_inputs = config.flush_after_inputs if self.device == "cuda" and config.flush_l2 else "off"
        # ... and read a byte of every page the call will stream (JudgeConfig.touch_pages)
        self._touches_pages = self.device == "cuda" and config.touch_pages
        self.verdicts = None
        if config.verdict_cache:
            self.verdicts = VerdictCache(config.cache_dir / "verdicts", settings=config.model_dump(mode="json"), machine={
                "device": self.device, "device_name": self.device_name, "torch": torch.__version__,
                "cuda": str(torch.version.cuda), "harness": _HARNESS_VERSION,
                "judge_code": hashlib.sha256(json.dumps(self._integrity, sort_keys=True).encode()).hexdigest()})

    # -------------------------------------------------------------------------------- public
    def check_reference(self, task: Task, *, stochastic: bool = False) -> Verdict:
        """The judge's checks of a task on its own, for task sets (synthesis, imports): the
        reference loads and runs in this harness, then runs again as a trusted candidate in an
        isolated process on the judge's fresh input sets (weights through state_dict) and must
        reproduce the harness's outputs there within tolerance, leave its inputs unmodified and give
        outputs that are not degenerate (`task_warnings`). `eager` is its time under the call
        protocol. No candidate policy applies: the reference is not a candidate. A task that fails
        gets correct=False and the reason in `failure`. A reference that draws random numbers is
        refused (a task set's task must be deterministic) unless `stochastic`: then its second run
        is judged statistically against the first, as candidates of such a task are."""
        t0 = time.monotonic()
        cfg = self.config
        ev = self._new_evaluation(task, "reference", "reference")
        v = ev.verdict
        try:
            ref = self._reference(task)
            setup = make_setup(task, ref, secrets.randbits(31), cfg)
            if setup.randomness is not None and not stochastic:
                # a task set's task must give the same output for the same inputs: candidates are
                # judged statistically against a stochastic reference, but a task is not one
                raise _Stop(FC.MISMATCH, f"the reference draws random numbers ({setup.randomness}: outputs differ "
                                         f"between two runs of the same inputs); a task must be deterministic")
            deadline = t0 + cfg.total_timeout_s
            session = self._start(task, baseline_source("eager", setup.outputs), None, setup, ev, deadline)
            try:
                roles = ["check"] * cfg.n_check + ["warmup"] * cfg.n_warmup + ["timed"] * cfg.n_timed
                inside, _ = self._drive(session, ref, setup, roles, ev, deadline)
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
            ev.close()
        v.correct = v.failure is None
        v.judge_s = time.monotonic() - t0
        return v

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        t0 = time.monotonic()
        if self.verdicts is not None:
            cached = self.verdicts.get(task.id, candidate.hash)
            if cached is not None:
                cached.judge_s = time.monotonic() - t0
                return cached
        ev = self._new_evaluation(task, candidate.hash, "candidate")
        verdict = ev.verdict
        try:
            self._evaluate(task, candidate, ev, t0)
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
            ev.close()
        if ev.gpu_plane_problem:
            verdict.notes.append(f"per-call tensors went through host memory (GPU sharing unavailable: "
                                 f"{ev.gpu_plane_problem}); the judge's clock is coarser")
        if self._integrity != _package_files():
            verdict.failure = Failure(category=FC.TAMPERING, message="the judge's own files changed during the run")
            self._integrity = _package_files()
        if verdict.failure is not None:
            verdict.correct = False
        verdict.judge_s = time.monotonic() - t0
        if self.verdicts is not None:
            self.verdicts.put(verdict)
        return verdict

    def build_plan(self, candidate: Candidate) -> BuildPlan:
        """What this judge builds for `candidate` (see `cuda_agent.judge.buildplan`)."""
        return self.builds.plan(candidate)

    def build(self, candidate: Candidate) -> BuildOutcome:
        """The judge's static checks and builds for `candidate`, with nothing run: the same plan,
        build step and cache as `evaluate`, plus the load_inline specs read statically from a
        single file. A candidate's fault is a failure in the outcome, never an exception."""
        return self.builds.ahead(candidate)

    def close(self) -> None:
        self._references.clear()
        self.supply.close()
        self._build_zygote.close()
        if self._kept_region is not None:  # no process maps it any more: the supply's workers are gone
            self._kept_region.close()
            self._kept_region = None

    def _gpu_region(self, nbytes: int) -> SharedGpuBuffer:
        """The GPU region of a new candidate or baseline process: its own allocation, freed when the
        process is gone, or (JudgeConfig.keep_gpu_plane) a loan of the one this judge keeps, zeroed
        first, so that no free on the GPU precedes the process's calls. The kept region grows when
        a task needs more; a loan still out (sessions overlap) gets an allocation of its own."""
        if not self.config.keep_gpu_plane:
            return SharedGpuBuffer.create(nbytes)
        kept = self._kept_region
        if kept is not None and self._region_loan is not None and self._region_loan.ptr is not None:
            return SharedGpuBuffer.create(nbytes)
        if kept is None or kept.nbytes < nbytes:
            if kept is not None:
                self._kept_region = None
                kept.close()
            self._kept_region = kept = SharedGpuBuffer.create(nbytes)
        self._region_loan = kept.lend()
        return self._region_loan

    def standby_pids(self) -> set[int]:
        """Processes this judge keeps between evaluations on purpose: its spare workers (which run no
        candidate code until a task is sent to them) and its zygotes."""
        pids = self.supply.standby_pids()
        if self._build_zygote.pid is not None:
            pids.add(self._build_zygote.pid)
        return pids

    def sandbox_uids(self) -> set[int]:
        """Every uid this judge runs candidate processes under (empty when it cannot drop privileges)."""
        return self.supply.sandbox_uids()

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------------- steps
    def _new_evaluation(self, task: Task, candidate_hash: str, kind) -> Evaluation:
        """The state of one run (see `Evaluation`), with its verdict to fill in."""
        return Evaluation(kind=kind, verdict=Verdict(
            task_id=task.id, task_name=task.name, candidate_hash=candidate_hash,
            device=self.device, device_name=self.device_name,
            compile_mode=None if self.config.compile_mode == "none" else self.config.compile_mode,
            versions={"torch": torch.__version__, "cuda": str(torch.version.cuda)}))

    def _evaluate(self, task: Task, cand: Candidate, ev: Evaluation, t0: float):
        cfg = self.config
        v = ev.verdict
        deadline = t0 + cfg.total_timeout_s
        ev.vendor = self._vendor_allowance(task)
        library = self.builds.workspace(cand, ev)
        if cand.kind != "workspace":
            v.compiled = True  # set back to False if a load_inline build fails

        ref = self._reference(task)
        t_phase = time.monotonic()
        eager = self._baseline(task, ref, "eager", ev)
        null = self._baseline(task, ref, "null", ev)
        v.eager = eager.timing
        v.speed_of_light = eager.speed_of_light
        if cfg.compile_mode != "none":
            v.compiled_ref = self._baseline(task, ref, cfg.compile_mode, ev).timing
        v.phase_s["baseline"] = time.monotonic() - t_phase

        setup = make_setup(task, ref, secrets.randbits(31), cfg)
        v.seeds = {"init": setup.init_seed}
        t_phase = time.monotonic()
        built_before = v.phase_s.get("build") or 0.0
        session = self._start(task, cand.model_new, library, setup, ev, deadline)
        v.isolation = session.proc.isolation
        v.reduced_isolation = session.reduced_isolation
        # load_inline builds happen while the candidate starts; they count as build, not start
        v.phase_s["start"] = time.monotonic() - t_phase - ((v.phase_s.get("build") or 0.0) - built_before)
        try:
            if session.ready.get("timing_gate") and self.device == "cuda":
                v.notes.append(f"calls timed without the timing gate (launch gaps included): "
                               f"{str(session.ready['timing_gate'])[:200]}")
            if session.judge_release:
                v.notes.append("the judge opened each call's gate: its own clock of a call starts when it "
                               "writes the inputs, after forward has enqueued its work")
            elif self.device == "cuda" and cfg.gate_release == "judge":
                v.notes.append("gate_release=judge not possible here (no shared GPU region or no control "
                               "page): the process opened each call's gate")
            if session.ready.get("unmatched"):
                v.notes.append(f"parameters not copied from Model (different name or shape): "
                               f"{', '.join(session.ready['unmatched'][:8])}")
            t_phase = time.monotonic()
            roles = ["check"] * cfg.n_check + ["warmup"] * cfg.n_warmup + ["timed"] * cfg.n_timed
            inside, outside = self._drive(session, ref, setup, roles, ev, deadline)
            rec = self._reconcile(session, inside, outside, null)
            release_next = not rec.believed and self._judge_can_release(session)
            if rec.gross_lie or release_next:
                # A loaded machine can stretch the judge's clock for a while; a candidate that lies
                # about its time lies again. One more round of timed calls (fresh inputs, each
                # output checked) decides, so a burst of load does not fail an honest candidate.
                # On CUDA that round has the judge open the gates where it can, after any
                # disagreement: the claim is then believed or replaced on the clock that leaves
                # the host's enqueueing out.
                again = ["timed"] * cfg.n_timed
                if release_next:
                    first, session = session, None  # closed by the restart, whether or not it succeeds
                    session, null = self._restart_with_judge_release(first, task, ref, cand, library,
                                                                     setup, ev, deadline, null)
                    again = ["warmup"] * cfg.n_warmup + again
                else:
                    session.forget_timed_calls()
                inside, outside = self._drive(session, ref, setup, again, ev, deadline, first_index=len(roles))
                rec = self._reconcile(session, inside, outside, null)
            v.phase_s["calls"] = time.monotonic() - t_phase
            if cfg.memcheck and self.device == "cuda":  # its libraries, before the worker's folder goes
                stash = mc.Stash(session.proc.spec.workdir,
                                 self.work_root / "runs" / f"memcheck-{secrets.token_hex(6)}")
                ev.live.append(stash)  # removed with the evaluation's processes
                memcheck_from = (stash.libraries, session.proc.uid)
        finally:
            if session is not None:
                session.close()
        v.correct = True
        v.runtime = rec.timing
        if rec.note:
            v.notes.append(rec.note)
        if rec.gross_lie:
            v.correct = False
            raise _Stop(FC.TIMING, rec.note)
        # A runtime no correct implementation can reach on this GPU (hardware/sol.py, the physical floor)
        breach = floor_breach(v.speed_of_light, v.runtime_ms, cfg.floor_margin)
        if breach:
            v.correct = False
            raise _Stop(FC.TIMING, breach)
        if cfg.memcheck and self.device == "cuda":
            self._memcheck(task, cand, setup, ev, *memcheck_from)
        elif cfg.memcheck:
            v.notes.append("memcheck=true applies to CUDA kernels only: not run on the cpu backend")

    def _memcheck(self, task: Task, cand: Candidate, setup: Setup, ev: Evaluation, libraries: list[Path],
                  uid: int | None) -> None:
        """One checked call under compute-sanitizer (judge/memcheck.py); a failure ends the evaluation."""
        t_phase = time.monotonic()
        runs, failure = mc.check_candidate(
            task_source=task.source, model_new=cand.model_new, libraries=libraries,
            sources=[cand.model_new] + [src for _, src in cand.kernels], init_seed=setup.init_seed,
            input_seed=secrets.randbits(31), config=self.config, work_root=self.work_root, uid=uid, live=ev.live)
        ev.verdict.memcheck = runs
        ev.verdict.phase_s["memcheck"] = time.monotonic() - t_phase
        if failure is not None:
            ev.verdict.correct = False
            raise _Stop(failure.category, failure.message)

    def _judge_can_release(self, session: Session) -> bool:
        """Whether a second round of timed calls can have the judge open their gates, where the
        first had the process open them (the default, JudgeConfig.gate_release)."""
        return (self.device == "cuda" and not session.judge_release and session.shared is not None
                and session.ready.get("gpu_plane") is True and session.ready.get("judge_release") is True)

    def _restart_with_judge_release(self, session: Session, task: Task, ref: Reference, cand: Candidate,
                                    library: Path | None, setup: Setup, ev: Evaluation, deadline: float,
                                    null: "_Baseline") -> tuple[Session, "_Baseline"]:
        """The second round after a disagreement, with the judge opening each call's gate.

        With the process's release the judge's clock of a call includes forward's enqueueing on
        the host; a forward whose enqueueing outlasts its GPU work (a launch-bound model: a
        published DenseNet121 enqueues for 20 ms what the GPU runs in 7 ms) reads as a claim three
        times too small, which is what a lie looks like (and a smaller excess replaces the honest
        claim with the judge's clock). With the judge's release its clock starts
        after the enqueueing, and no work on the inputs can start before it (they are written only
        then), so a real lie still shows. Not the default for every call: on the H200 the judge's
        writes from its own context cost a ~10 us kernel 3-30 us of GPU time.

        A fresh process (warm-up calls again), started after the null model of that protocol was
        measured with no candidate process alive; the bounds the checked calls set carry over."""
        bounds, paired = session.rel_l2_bounds, session.paired
        session.close()
        rebuild(setup, ref, self.config)  # a stateful reference starts over with the fresh ModelNew
        judge_null = self._baseline(task, ref, "null", ev, judge_release=True)
        fresh = self._start(task, cand.model_new, library, setup, ev, deadline, judge_release=True)
        fresh.rel_l2_bounds, fresh.paired = bounds, paired
        if not fresh.judge_release:  # the new process could not take the judge's release after all
            return fresh, null
        ev.verdict.notes.append("the judge's clock disagreed with the first round's claims, so the second round "
                                "had the judge open each call's gate (its clock then starts after forward has "
                                "enqueued its work)")
        return fresh, judge_null

    def _reconcile(self, session: Session, inside: list[float], outside: list[float], null: "_Baseline"):
        rel_slack, abs_slack = self.config.slack()
        return reconcile(inside, outside, null.overhead_ms, rel_slack=rel_slack, abs_slack_ms=abs_slack,
                         cores=self._cores if self.device == "cpu" else 1, source=session.timing_method(),
                         protocol_ms=session.protocol_ms, baseline_protocol_ms=null.protocol_ms,
                         busiest_ms=session.busiest_ms if self.device == "cpu" else None,
                         wall_ms=session.wall_ms if self.device == "cpu" else None, waited_ms=session.waited_ms,
                         wall_overhead_ms=null.wall_overhead_ms, wall_steady=session.wall_steady)

    def _start(self, task: Task, model_new: str, library: Path | None, setup: Setup, ev: Evaluation,
               deadline: float, judge_release: bool | None = None) -> Session:
        """Start a process running `model_new` under the call protocol for `ev` (a candidate, a
        reference check or a baseline) and construct its ModelNew. `judge_release`: whether the
        judge opens each call's gate where it can (default: JudgeConfig.gate_release)."""
        cfg = self.config
        if judge_release is None:
            judge_release = cfg.gate_release == "judge"
        trusted = ev.trusted
        if not trusted and seccomp_problem():  # the judge's own check: a candidate cannot fake it
            raise _Stop(FC.JUDGE, seccomp_problem())
        # The output half holds exactly what a correct candidate returns (plus slack); anything
        # larger is wrong anyway and is reported as such by the candidate's own harness.
        plane = DataPlane.create(setup.in_bytes, setup.out_bytes + (1 << 20))
        shared = None
        if self.device == "cuda":
            try:
                shared = self._gpu_region(plane.size)
            except CudaIpcError as exc:
                ev.note_gpu_plane_problem(str(exc))
                plane.pin()
        stage = cfg.stage_inputs and shared is not None  # the process asked to stage each call's inputs
        try:
            proc, chan = self._spawn(task, model_new, plane, library, ev)
        except BaseException:
            plane.close()
            if shared is not None:
                shared.close()
            raise
        session = Session(proc, chan, plane, shared, memory_limit_mb=cfg.memory_limit_mb,
                          disk_limit_mb=cfg.disk_limit_mb, trusted=trusted)
        try:
            init_meta = pack(setup.init_args, plane.view, 0, plane.in_size)
            init_end = packed_end(init_meta)  # tensors nested in containers count too
            start = (init_end + 63) // 64 * 64
            state_meta = pack(setup.state_values, plane.view, start, plane.in_size - start)
            init = InitRequest(
                device=self.device, candidate_path=str(proc.spec.workdir / "model_new.py"),
                reference_path=str(proc.spec.workdir / "model.py"),
                library=str(proc.spec.workdir / "cuda_extension.so") if library else None,
                init_args=init_meta, state=state_meta, state_names=setup.state_names,
                init_seed=setup.init_seed, flush=cfg.flush_l2, flush_inputs=self._flushes_inputs,
                touch_pages=self._touches_pages, trusted=trusted,
                stage_inputs=setup.call_in_bytes if stage else 0,
                observer=str(proc.spec.workdir / obs.FILE), policy=cfg.policy,
                launches=str(proc.spec.workdir / ln.FILE) if (proc.spec.workdir / ln.FILE).exists() else None,
                poison_bytes=setup.out_bytes if self.device == "cuda" and cfg.poison_outputs else 0,
                gpu_plane=shared.handle.hex() if shared is not None else None,
                require=proc.required_isolation())
            chan.send(dict(init))
            session.ready = self._serve_init(session, ev, min(deadline, time.monotonic() + cfg.init_timeout_s))
            session.judge_release = (judge_release and shared is not None
                                     and session.ready.get("gpu_plane") is True
                                     and session.ready.get("judge_release") is True)
            session.staged = (stage and session.ready.get("gpu_plane") is True
                              and session.ready.get("staged_inputs") is True)
            if stage and session.ready.get("staging_error"):
                ev.verdict.notes.append("inputs not staged in the process's memory (calls read the shared region): "
                                        + str(session.ready.get("staging_error"))[:200])
            if self.device == "cuda" and session.ready.get("launch_observer"):
                ev.verdict.notes.append("kernels listed on the checked calls only (PyTorch's profiler), not on every "
                                        "call: " + str(self.builds.launches_problem
                                                       or session.ready.get("launch_observer"))[:200])
            if shared is not None and session.ready.get("gpu_plane") is not True:
                # The process could not map the GPU region: calls go through the host plane.
                ev.note_gpu_plane_problem(str(session.ready.get("gpu_plane_error"))[:300])
                shared.close()
                session.shared = None
                plane.pin()
            proc.probe_isolation()
            if not trusted:
                # The kernel's record, not the process's word: a candidate whose isolation is
                # incomplete may have done anything, so its numbers are not a verdict.
                missing, session.reduced_isolation = proc.isolation_gaps(session.ready.get("audit_hook") is True,
                                                                        session.ready.get("landlock"))
                if missing:
                    raise _Stop(FC.JUDGE, "isolation of the candidate process was incomplete, so its results "
                                          "cannot be trusted: missing " + "; ".join(missing))
        except BaseException:
            session.close()
            raise
        return session

    def _drive(self, session: Session, ref: Reference, setup: Setup, roles: list[str],
               ev: Evaluation, deadline: float,
               first_index: int = 0, compiling_calls: int = 0) -> tuple[list[float], list[float]]:
        """Run the calls. Every call: fresh inputs revealed only when its clock starts, the output
        compared here (unless `ev` is a baseline), the inputs read back and checked for modification.
        Returns the claimed and the outside-measured times of the timed calls. `first_index`
        numbers the calls of a later round after those of the first. The first `compiling_calls`
        calls compile (a torch.compile baseline's warm-up): they get a build's time limit, not a call's.
        With a device lock (JudgeConfig.device_lock) each call holds it: alone if timed."""
        held = contextlib.ExitStack()  # the current call's hold on a device other judges share
        try:
            return self._drive_calls(session, ref, setup, roles, ev, deadline, first_index, compiling_calls, held)
        finally:
            held.close()

    def _drive_calls(self, session: Session, ref: Reference, setup: Setup, roles: list[str], ev: Evaluation,
                     deadline: float, first_index: int, compiling_calls: int,
                     held: contextlib.ExitStack) -> tuple[list[float], list[float]]:
        cfg = self.config
        dev = self.device
        proc, chan, plane = session.proc, session.chan, session.plane
        judged, v = ev.judged, ev.verdict
        inside: list[float] = []
        outside: list[float] = []
        expected_checks: list[list] = []
        idle_wall = idle_cpu = 0.0
        idle_mark: tuple[float, int] | None = None
        # Where the calls phase goes (reported as phase_s "calls:*"): the judge's own reference
        # work, the candidate's side of each call, the judge's checks, and the wait for a device
        # that other judges share (their timed calls, or theirs waiting for this one's).
        split = dict.fromkeys(("reference", "candidate", "check", "device_wait"), 0.0)
        # The precision probe (JudgeConfig.approx_rel_l2): a checked call whose output is over its
        # bound only as far as an approximation may be is repeated on perturbed inputs ("probe",
        # inserted into `roles`); once that passed, warm-up and timed calls come in such pairs.
        probe_base: dict | None = None
        pair_first: dict | None = None
        # A stochastic reference (stochastic.py): each call's mode (eval: exact check; training:
        # reference draws and the statistical check) and the mode the process was last put in.
        stoch = setup.randomness if judged else None
        mode_sent: bool | None = None
        checks_seen = 0
        for i, role in enumerate(roles, start=first_index):
            if self._device_lock is not None:
                held.close()  # the last call's hold; then this one's, alone for a timed call
                t_wait = time.perf_counter()
                held.enter_context(self._device_lock.hold(exclusive=role == "timed"))
                split["device_wait"] += time.perf_counter() - t_wait
            t_ref = time.perf_counter()
            seed = secrets.randbits(63)
            checked = role in ("check", "probe")
            base = probe_base if role == "probe" else \
                pair_first if judged and session.paired and role in ("warmup", "timed") else None
            inputs = perturbed(base["inputs"], seed, PROBE_DELTA) if base is not None else fresh_inputs(ref, seed, i, dev)
            # a probe moves Model's parameters and buffers too, on both sides: rounded weights would
            # otherwise pass as an approximation of a function linear in its inputs. All of them, not
            # the ones the candidate process says it copied (a claim): a copy it does not move shows.
            moved_keys = list(setup.state_names) if role == "probe" else []
            state_seed = secrets.randbits(31) if role == "probe" else None
            expected = expected64 = draws = None
            training = _stochastic_training(stoch, role, checks_seen)
            checks_seen += role == "check"
            if training:
                draws = reference_draws(setup, inputs, stochastic.draw_count(setup.out_bytes))
                expected = draws[0]
            elif judged:
                if stoch:
                    set_training(setup, False)
                if state_seed is not None:
                    perturb_state(setup, moved_keys, state_seed, PROBE_DELTA)
                try:
                    with torch.no_grad():
                        expected = to_list(setup.ref_model(*inputs))
                    if role == "check":
                        expected_checks.append([e.detach() if isinstance(e, torch.Tensor) else e for e in expected])
                    if checked:
                        expected64 = reference_expected64(setup, inputs, cfg)
                finally:
                    if state_seed is not None:
                        perturb_state(setup, moved_keys, None, 0.0)
            if dev == "cuda":
                torch.cuda.synchronize()
            t_prepare = time.perf_counter()
            split["reference"] += t_prepare - t_ref
            if idle_mark is not None:
                # Between calls the candidate has nothing to do; CPU it burns here is work kept out
                # of the timed window (watcher threads, precomputation, starving the judge).
                idle_wall += time.perf_counter() - idle_mark[0]
                idle_cpu += (_cpu_ns(proc.pid) - idle_mark[1]) / 1e9
            if training is not None and training != mode_sent:  # untimed, outside the idle CPU account too
                mode_sent = self._set_mode(session, ev, training, deadline, i)
            if state_seed is not None:  # untimed, and outside the idle CPU account (harness's own work)
                chan.send({"op": "perturb", "seed": state_seed, "delta": PROBE_DELTA})
                done = session.recv(min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
                if not done.get("ok"):
                    ev.reported_error(done)
            t_ask = time.perf_counter()
            chan.send({"op": "prepare"})
            ready = session.recv(min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
            protocol_ms = (time.perf_counter() - t_ask) * 1e3
            if not ready.get("ok"):
                ev.reported_error(ready)
            # The clock starts before the inputs exist anywhere the candidate can read them. The
            # bounds reconcile reads for timed calls on the CPU backend: per thread of the candidate
            # its CPU time and the time it waited for a core, and the judge's own wait. The threads
            # are read before the process's CPU clock here and after it below, so that the threads'
            # readings span the process's: only a thread that ended can make the process gain more.
            bounded = dev == "cpu" and role == "timed"
            threads_before = _thread_schedstat(proc.pid) if bounded else {}
            own_wait_before = _own_run_delay_ns() if bounded else 0
            cpu_before = _cpu_ns(proc.pid) if dev == "cpu" else 0
            release = i + 1 if session.judge_release else None
            t_send = time.perf_counter()
            if release is None:
                meta = pack(inputs, session.calls, 0, plane.in_size)
                if session.shared is not None:
                    torch.cuda.synchronize()  # the inputs are in place before the process hears of them
                if session.staged:
                    # copied into the process's own memory before the clock starts (JudgeConfig.stage_inputs)
                    chan.send({"op": "stage", "inputs": meta})
                    self._next_op(session, ev, "staged", deadline, i, "stage its inputs")
                    t_send = time.perf_counter()
            else:
                meta = pack(inputs, None, 0, plane.in_size)  # the layout now, the bytes at the release
                # staged in host memory now, so that the release's write is an H2D copy of the copy
                # engines rather than kernels of the judge's context beside the candidate's gate
                source = staged(inputs) if cfg.release_writes == "host" else inputs
            # Every call reports the operators it ran (observer.cpp) and the kernels it launched
            # (launches.cpp, host-side callbacks). CUDA's activity records of the kernels that ran
            # are taken on the checked calls only: they add ~20 us of GPU time per kernel on an
            # H200, which would be timed with the kernel.
            chan.send({"op": "call", "index": i, "inputs": meta, "kernels": checked, "release": release,
                       "staged": session.staged and release is None})
            limit_s = cfg.build_timeout_s if i - first_index < compiling_calls else cfg.call_timeout_s
            until = min(deadline, time.monotonic() + limit_s)
            answered = None
            if release is not None:
                # the judge's clock of the call starts at its release (timing.py)
                t_send, answered = release_call(session, source, release, until, f"call {i}")
            reply: CallReply = answered if answered is not None else session.recv(until, f"call {i}")
            t_reply = time.perf_counter()
            wall_ms = (t_reply - t_send) * 1e3
            # The output and every clock at one instant: the output is copied out of memory the
            # candidate can still write first, and the process's CPU clocks are read after that
            # copy, so that whatever work the copy saw (a thread team that goes on writing after
            # the reply) is on the clock; what it did not see is not judged, and a change after
            # it fails the call (`_late_writes`).
            at_reply = _outputs_at_reply(session, reply) if judged and reply.get("ok") else None
            cpu_at_reply = (time.perf_counter(), _cpu_ns(proc.pid)) if dev == "cpu" else None
            cpu_ms = (cpu_at_reply[1] - cpu_before) / 1e6 if cpu_at_reply is not None else None
            busiest_ms = waited_ms = None
            steady = False
            if bounded:
                own_wait_ns = _own_run_delay_ns() - own_wait_before
                after = _thread_schedstat(proc.pid)
                busiest_ms = max((cpu - threads_before.get(tid, (0, 0))[0] for tid, (cpu, _) in after.items()),
                                 default=0) / 1e6
                waited_ms, steady = _waits_during(cpu_ms, threads_before, after, own_wait_ns)
            split["candidate"] += t_reply - t_prepare
            if not reply.get("ok"):
                ev.reported_error(reply)
            if session.staged and release is None and reply.get("ok"):
                # the staged inputs, back in the region after the clock (worker.py), before they are read
                self._next_op(session, ev, "inputs_back", deadline, i, "return its staged inputs")
            if dev == "cuda" and checked:
                # the kernels the call launched follow its reply, outside the call's clock (worker.py)
                listed = self._next_op(session, ev, "kernels", deadline, i, "list its kernels")
                kernels = listed.get("kernels")
                reply["kernels"] = kernels if isinstance(kernels, list) else []  # uncut: the check counts them
                reply["kernel_ms"] = listed.get("kernel_ms")
            claimed = _num(reply.get("inside_ms"))
            measured = cpu_ms if cpu_ms is not None else wall_ms
            if judged:
                got, cmp = self._check_call(session, i, role, inputs, meta, expected, reply, claimed, measured, ev,
                                            deadline, expected64=expected64, draws=draws,
                                            eval_mode=training is False, got=at_reply)
                if stoch:  # a training-mode call (draws) has no float64 basis, probe or perturbed pair
                    _stochastic_call(v, stoch, len(draws) if draws is not None else 0, cmp)
                if draws is not None:
                    pass
                elif role == "check" and cmp.approximate:
                    roles.insert(i - first_index + 1, "probe")  # the next call repeats this one, perturbed
                    probe_base = {"inputs": inputs, "got": got, "expected": expected, "expected64": expected64,
                                  "cmp": cmp}
                elif role == "probe":
                    chan.send({"op": "restore"})  # the parameters as they were, before any later call
                    done = session.recv(min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
                    if not done.get("ok"):
                        ev.reported_error(done)
                    self._probe(session, i, probe_base, got, expected, expected64, ev)
                    probe_base = None
                elif session.paired and role in ("warmup", "timed"):
                    if base is None:
                        pair_first = {"inputs": inputs, "got": got, "expected": expected}
                    else:
                        self._check_pair(session, i, role, base, got, expected)
                        pair_first = None
                late = _late_writes(session, reply, at_reply)
                if late:
                    raise _Stop(FC.TIMING, f"call {i}: {late}")
                split["check"] += time.perf_counter() - t_reply
            if role == "timed" and claimed is not None:
                inside.append(claimed)
                outside.append(measured)
                session.protocol_ms.append(protocol_ms)
                if busiest_ms is not None:
                    session.busiest_ms.append(busiest_ms)
                if bounded:
                    session.wall_ms.append(wall_ms)
                    session.waited_ms.append(waited_ms)
                    session.wall_steady.append(steady)
                session.methods.append(str(reply.get("timing") or "events")[:16])
            # On the CPU backend the candidate's idle time starts where its call's clock stopped:
            # CPU it uses while the judge checks the call is counted, not only CPU between calls.
            # A probe's call is left out: its `restore` is the harness's work in that process.
            idle_mark = cpu_at_reply if cpu_at_reply is not None and role != "probe" else \
                (time.perf_counter(), _cpu_ns(proc.pid))
        if judged:
            for k, x in split.items():
                if k != "device_wait" or self._device_lock is not None:
                    v.phase_s[f"calls:{k}"] = v.phase_s.get(f"calls:{k}", 0.0) + x
            if stoch:
                _stochastic_run(v)
            if expected_checks:
                # kept: warnings the checked calls raised (an ill-conditioned reference)
                found = degenerate_warnings(expected_checks, atol=cfg.atol, rtol=cfg.rtol)
                v.task_warnings = found + [w for w in v.task_warnings if w not in found]
            if setup.ref64_problem and cfg.ref_noise_multiple > 0:
                note = f"no float64 reference ({setup.ref64_problem}): fixed relative L2 bounds"
                if note not in v.notes:
                    v.notes.append(note)
            if idle_cpu > 0.3 * idle_wall + 0.02:
                raise _Stop(FC.TIMING, f"the candidate process used {idle_cpu * 1e3:.0f} ms of CPU time while it had "
                                       f"no call to serve ({idle_wall * 1e3:.0f} ms): work outside the timed calls")
        if len(inside) < 2:
            raise _Stop(FC.JUDGE, "too few timed calls to report a time")
        if dev == "cuda" and session.shared is not None and os.environ.get("CUDA_AGENT_BANDWIDTH_PROBE") == "1":
            self._bandwidth_probe(session, deadline, ev, leaves(inputs))
        return inside, outside

    def _set_mode(self, session: Session, ev: Evaluation, training: bool, deadline: float, i: int) -> bool:
        """A stochastic task's candidate put in training mode (its modules' flags as constructed) or
        eval mode before call `i` (worker.py's "mode"); returns the mode set."""
        session.chan.send({"op": "mode", "training": training})
        done = session.recv(min(deadline, time.monotonic() + self.config.call_timeout_s), f"call {i}")
        if not done.get("ok"):
            ev.reported_error(done)
        return training

    def _next_op(self, session: Session, ev: Evaluation, op: str, deadline: float, i: int, what: str) -> dict:
        """The message that must come next in call `i` (the worker's `op`), within a call's time
        limit: an error reply ends the run as reported, any other message is tampering."""
        got = session.recv(min(deadline, time.monotonic() + self.config.call_timeout_s), f"call {i}")
        if not got.get("ok"):
            ev.reported_error(got)
        if got.get("op") != op:
            raise _Stop(FC.TAMPERING, f"call {i}: the candidate process did not {what}")
        return got

    def _bandwidth_probe(self, session: Session, deadline: float, ev: Evaluation, inputs: list) -> None:
        """timing.bandwidth_probe in the candidate process and in the judge's own, on the largest
        input of the last call, noted in the verdict (a diagnostic of memory-bound timing)."""
        session.chan.send({"op": "bandwidth"})
        got = session.recv(min(deadline, time.monotonic() + self.config.call_timeout_s), "bandwidth probe")
        mine: dict = {}
        big = largest_floating(inputs)
        if big is not None:
            mine = bandwidth_probe(big.to("cuda"), CacheFlusher("cuda"))
        ev.verdict.notes.append("bandwidth probe (ms): " + json.dumps({"process": got.get("ms") or got.get("message"),
                                                                        "judge": mine}))

    def _check_call(self, session: Session, i: int, role: str, inputs: list, meta: list, expected: list,
                    reply: CallReply, claimed: float | None, measured: float, ev: Evaluation, deadline: float,
                    expected64: list | None = None, draws: list | None = None, eval_mode: bool = False,
                    got: list | None = None) -> None:
        """`got`: the outputs as taken at the reply (`_outputs_at_reply`); None reads them here."""
        cfg = self.config
        plane = session.plane
        v = ev.verdict
        # Tampering first: a changed global flag or a replaced function can also change the outputs
        # (lower matmul precision, for one, on CPUs with AMX), and then the verdict must name the cause.
        known = len(v.policy_violations)
        ev.note_blocked(reply)
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
        if got is None:
            try:
                got = unpack(reply.get("outputs"), session.calls, plane.out_offset, plane.out_size,
                             self.device if session.shared is not None else "cpu")
            except TransportError as exc:
                raise _Stop(FC.MISMATCH, f"call {i}: unusable output: {exc}") from None
            if session.shared is not None:  # views of memory the candidate can still write: snapshot first
                got = [snapshot(g) for g in got]
        if draws is not None:  # a stochastic reference in training mode: judged as one more draw
            cmp = stochastic.compare_draws(draws, got)
        else:
            cmp = compare_outputs(expected, got, atol=cfg.atol, rtol=cfg.rtol, max_rel_l2=cfg.max_rel_l2,
                                  expected64=expected64, noise_multiple=cfg.ref_noise_multiple,
                                  rel_l2_ceiling=cfg.max_rel_l2_ceiling,
                                  rel_l2_bounds=None if role in ("check", "probe") else session.rel_l2_bounds,
                                  approx_ceiling=cfg.approx_rel_l2 if role in ("check", "probe") else 0.0)
        if role in ("check", "probe") and draws is None:
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
            if cmp.noise_dominated:
                outs = ", ".join(map(str, cmp.noise_dominated))
                note = (f"output(s) {outs}: the reference's values are rounding noise (its own error against "
                        f"float64 is {NOISE_DOMINATED:.0%} or more of the output), so no relative L2 bound "
                        f"applies; the elementwise tolerance alone decides")
                if note not in v.notes:
                    v.notes.append(note)
            if cmp.over_ceiling:
                outs = ", ".join(map(str, cmp.over_ceiling))
                warning = (f"output(s) {outs}: ill-conditioned: the reference's own error against float64 exceeds "
                           f"the ceiling {cfg.max_rel_l2_ceiling:g}, so the bound is the ceiling plus "
                           f"{min(cfg.ref_noise_multiple, CEILING_NOISE_MULTIPLE):g}x that error")
                if warning not in v.task_warnings:
                    v.task_warnings.append(warning)
        if cmp.ok and len(expected) == 1 and isinstance(expected[0], torch.Tensor) \
                and reply.get("structure") != "tensor":
            cmp = type(cmp)(False, f"output is a {reply.get('structure')}, expected a single tensor")
        v.max_abs_err = max(v.max_abs_err or 0.0, cmp.max_abs_err)
        v.max_rel_l2_err = max(v.max_rel_l2_err or 0.0, cmp.rel_l2_err)
        v.calls.append(CallRecord(index=i, role=role, inside_ms=claimed, outside_ms=measured,
                                  stream_ms=_num(reply.get("stream_ms")),
                                  lag_ms=_num(reply.get("lag_ms")), run_delay_ms=_num(reply.get("run_delay_ms")),
                                  kernel_ms=_num(reply.get("kernel_ms")),
                                  max_abs_err=cmp.max_abs_err, rel_l2_err=cmp.rel_l2_err,
                                  rel_l2_err_f64=cmp.rel_l2_err_f64, ref_noise_rel_l2=cmp.ref_noise_rel_l2,
                                  rel_l2_bound=cmp.rel_l2_bound, ok=cmp.ok))
        if not cmp.ok:
            mode = ", eval mode: the random part switched off" if eval_mode else ""
            raise _Stop(FC.MISMATCH, f"call {i} ({'checked' if role == 'check' else role}{mode}): {cmp.message}")
        if cmp.approximate and role == "check" and not session.paired:
            # an approximation or lower precision: the precision probe (the next call) decides
            err = cmp.rel_l2_err_f64
            v.notes.append(f"call {i}: output(s) {', '.join(map(str, cmp.approximate))} over the noise-scaled bound "
                           f"(error {err:.3g} against float64, bound {cmp.rel_l2_bound:.3g}) but within "
                           f"approx_rel_l2 {cfg.approx_rel_l2:g}: repeated on inputs moved by 2^-8 (precision probe)")
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
            echo = session.recv(min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
            if not echo.get("ok"):
                raise _Stop(FC.RUNTIME, f"call {i}: reading back the inputs failed: {str(echo.get('message'))[:500]}")
            try:
                back = unpack(echo.get("echo"), plane.view, 0, plane.in_size)
            except TransportError:
                raise _Stop(FC.MISMATCH, f"call {i}: the candidate process did not return its inputs") from None
        self._check_echo(inputs, back, i)
        # every call's operators and launched kernels, checked, warm-up and timed alike
        found = [] if session.trusted else pol.check_dispatched(_strs(reply.get("ops")), cfg.policy)
        kernels = _strs(reply.get("launched")) + _strs(reply.get("kernels"))  # launched (every call), ran (checked)
        found += [] if session.trusted else pol.check_kernels(kernels, cfg.policy)
        # and by who issued them (PyTorch, directly or through cuBLAS; a vendor library the task does not allow)
        owners = reply.get("owners")
        if not session.trusted and isinstance(owners, dict):
            chains = {str(k)[:300]: [str(c)[:4096] for c in v[:8]] for k, v in list(owners.items())[:MAX_KERNELS + 1]
                      if isinstance(v, list)}  # a chain cut short would lose its issuer, at its end
            found += ln.check_kernel_owners(chains, cfg.policy, ev.vendor, ln.torch_dir())
        if not session.trusted and any(isinstance(reply.get(k), list) and len(reply[k]) > MAX_KERNELS
                                       for k in ("launched", "kernels")):
            found.append(f"call {i} launched more than {MAX_KERNELS} distinct kernels (too many to check)")
        if found:
            v.policy_violations.extend(found)
            raise _Stop(FC.POLICY, found[0])
        return got, cmp

    def _probe(self, session: Session, i: int, base: dict, got: list, expected: list, expected64: list | None,
               ev: Evaluation) -> None:
        """The precision probe: call `i` repeated the checked call `base` with its inputs, and the
        parameters the candidate process copied from Model (here and there), moved by PROBE_DELTA;
        the parameters are back as they were. For each output over its bound there, the candidate's change of output must agree
        with float64's as closely as float32 arithmetic allows (an approximation follows the change;
        rounding to fewer bits loses it). Passed: later warm-up and timed calls come in such pairs,
        each pair checked against the float32 reference's change (`session.paired`)."""
        cfg = self.config
        cmp = base["cmp"]
        paired = dict(session.paired or {})
        for k in cmp.approximate:
            if expected64 is None or base["expected64"] is None:
                raise _Stop(FC.MISMATCH, f"call {i} (precision probe): no float64 reference to check output {k} "
                                         f"against, so its error over the bound stands")
            if torch.equal(base["expected64"][k], expected64[k]):
                # no floating input reaches this output: the probe cannot show resolution, so the
                # error over the bound stands
                raise _Stop(FC.MISMATCH, f"call {i} (precision probe): output {k} does not change with the inputs and "
                                         f"the parameters copied from Model moved by 2^-8, so the probe cannot tell an approximation from lower precision: "
                                         f"its error against float64, {cmp.rel_l2_err_f64:.3g}, exceeds the bound "
                                         f"{cmp.rel_l2_bound:.3g}")
            e = response_error(base["got"][k], got[k], base["expected64"][k], expected64[k])
            noise = response_error(base["expected"][k], expected[k], base["expected64"][k], expected64[k])
            bound = max(PROBE_FLOOR, cfg.ref_noise_multiple * noise)
            if not e <= bound:
                raise _Stop(FC.MISMATCH, f"call {i} (precision probe): output {k}: with the inputs and parameters moved by 2^-8, its "
                                         f"change differs from float64's by {e:.3g} (relative L2; bound {bound:.3g} = "
                                         f"max({PROBE_FLOOR:g}, {cfg.ref_noise_multiple:g} x {noise:.3g}), the float32 "
                                         f"reference's own): lower precision than the task, not an approximation "
                                         f"(its error against float64 was {cmp.rel_l2_err_f64:.3g}, over the bound "
                                         f"{cmp.rel_l2_bound:.3g})")
            # the pairs are checked against the float32 reference's change, itself `noise` from float64's
            if k not in paired:
                ev.verdict.notes.append(
                    f"output {k}: an approximation at float32 resolution (precision probe: change {e:.3g} from "
                    f"float64's, bound {bound:.3g}); warm-up and timed calls then came in perturbed pairs")
            paired[k] = max(paired.get(k, 0.0), bound + noise)
        session.paired = paired

    @staticmethod
    def _check_pair(session: Session, i: int, role: str, first: dict, got: list, expected: list) -> None:
        """The second call of a warm-up or timed pair (after the precision probe passed): its change
        from the first must follow the float32 reference's as the probe's did."""
        for k, bound in (session.paired or {}).items():
            e = response_error(first["got"][k], got[k], first["expected"][k], expected[k])
            if not e <= bound:
                raise _Stop(FC.MISMATCH, f"call {i} ({role}): output {k}: with the last call's inputs moved by 2^-8, "
                                         f"its change differs from the reference's by {e:.3g} (relative L2; bound "
                                         f"{bound:.3g}, from the precision probe): lower precision than the task on "
                                         f"the calls after the checked ones")

    def _baseline(self, task: Task, ref: Reference, mode: str, ev: Evaluation,
                  judge_release: bool | None = None) -> _Baseline:
        """Times of a trusted implementation under the very protocol candidates get, with no
        candidate process alive: `eager` (the reference), a torch.compile mode, or `null` (returns
        outputs of the right shape without computing: the cost of the protocol itself). Known
        baselines come from `self.baselines`; a measured one is a run of its own, for `ev`.
        `judge_release`: whether the judge opens the gates (default: JudgeConfig.gate_release)."""
        cfg = self.config
        if judge_release is None:
            judge_release = cfg.gate_release == "judge"
        # The protocol's cost on the judge's clock depends on who opens the gate: its own key.
        keyed = f"{mode}+judge-release" if self.device == "cuda" and judge_release else mode
        if self._flushes_inputs != "off" and not judge_release:  # (the judge's release writes inputs after it)
            # the flush moves the times too (and old keys stay as they were)
            keyed += "+flush-inputs" if self._flushes_inputs == "on" else "+flush-inputs-auto"
        if self._touches_pages and not judge_release:
            keyed += "+touch-pages"
        if self.device == "cuda" and not cfg.poison_outputs:
            keyed += "+no-poison"
        if self.device == "cuda" and cfg.stage_inputs and not judge_release:
            keyed += "+staged"  # the calls read inputs in the process's own memory: faster for large ones
        bkey = BaselineKey(harness_version=_HARNESS_VERSION, task_id=task.id, device_name=self.device_name,
                           torch_version=torch.__version__, mode=keyed, flush_l2=cfg.flush_l2, n_timed=cfg.n_timed,
                           n_warmup=cfg.n_warmup)
        known = self.baselines.get(bkey)
        if known is not None and mode == "null" and self.device == "cpu" and known.wall_overhead_ms is None:
            known = None  # stored before the wall-clock bound existed: measured again, with it
        if known is not None and mode == "eager" and (known.speed_of_light is None  # cached before it existed
                                                      or not known.speed_of_light.has_floor_fields):  # or the floor
            known = known.model_copy(update={"speed_of_light": task_speed_of_light(task, self.device,
                                                                                 self.device_name)})
            self.baselines.put(bkey, known)
        if known is not None:
            return known
        run = ev.child("baseline", _scratch_verdict(task))
        try:
            setup = make_setup(task, ref, secrets.randbits(31), cfg)
            source = baseline_source(mode, setup.outputs)
            try:
                session = self._start(task, source, None, setup, run, time.monotonic() + cfg.total_timeout_s,
                                      judge_release=judge_release)
            except _Stop as stop:
                raise JudgeError(f"task {task.name}: {mode} baseline failed: {stop.failure.message}") from None
            try:
                compiling = 2 if mode not in ("eager", "null") else 0  # torch.compile compiles on them
                roles = ["warmup"] * (cfg.n_warmup + compiling) + ["timed"] * cfg.n_timed
                try:
                    inside, outside = self._drive(session, ref, setup, roles, run,
                                                  time.monotonic() + cfg.total_timeout_s, compiling_calls=compiling)
                except _Stop as stop:
                    raise JudgeError(f"task {task.name}: {mode} baseline failed: {stop.failure.message}") from None
            finally:
                session.close()
        finally:
            run.close()
        overhead = statistics.median(outside if mode == "null" else [max(o - i, 0.0) for i, o in zip(inside, outside)])
        # The protocol's cost on the CPU backend's wall-clock bound: the null model's wall time per
        # call, waits for a core included (taking them off too would read low on a loaded host,
        # where sleeping threads were charged waits; a high reading only weakens the bound).
        base = _Baseline(timing=summarize(inside, session.timing_method()),
                         overhead_ms=overhead,
                         wall_overhead_ms=statistics.median(session.wall_ms) if mode == "null" and session.wall_ms
                         else None,
                         protocol_ms=statistics.median(session.protocol_ms) if session.protocol_ms else None,
                         speed_of_light=task_speed_of_light(task, self.device, self.device_name)
                         if mode == "eager" else None)
        self.baselines.put(bkey, base)
        return base

    def _vendor_allowance(self, task: Task) -> frozenset[str]:
        """cuBLAS GEMMs if the task's reference has a GEMM, cuDNN convolutions if it has a convolution;
        learnt once per task."""
        got = self._vendor.get(task.id)
        if got is None:
            got = self._vendor[task.id] = pol.vendor_allowance(reference_ops(self._reference(task), self.device))
        return got

    def _reference(self, task: Task) -> Reference:
        ref = self._references.get(task.id)
        if ref is None:
            ref = self._references[task.id] = Reference(task)
        return ref

    def _spawn(self, task: Task, model_new: str, plane: DataPlane, library: Path | None, ev: Evaluation):
        """A worker from the supply, given the files of this run: the observer, `model_new`, the
        reference and the workspace's library."""
        proc, sock = self.supply.take(plane, ev.live)
        workdir = proc.spec.workdir
        # The judge's operator observer, loaded by the worker before anything of the task. Owned by
        # the judge (not chowned): the candidate's uid cannot rewrite it.
        shutil.copy2(self.builds.observer_library(), workdir / obs.FILE)
        self.supply.place_launches(workdir)
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

    def _serve_init(self, session: Session, ev: Evaluation, deadline: float) -> Ready:
        """Wait for the worker's ModelNew, building what its load_inline calls ask for meanwhile."""
        while True:
            msg = session.recv(deadline, "loading the candidate")
            if msg.get("op") == "build":
                started = time.monotonic()
                session.chan.send(dict(self.builds.serve(msg, session.proc, ev)))
                # compile time has its own limit (build_timeout_s); it does not count as loading time
                deadline += time.monotonic() - started
                continue
            if not msg.get("ok"):
                ev.reported_error(msg, setup=True)
            ev.note_blocked(msg)
            return msg

    # -------------------------------------------------------------------------------- calls
    @staticmethod
    def _check_echo(sent: list, back: list, i: int) -> None:
        if len(back) != len(sent):
            raise _Stop(FC.MISMATCH, f"call {i}: the candidate process returned {len(back)} inputs, not {len(sent)}")
        changed = changed_input(sent, back)
        if changed:
            raise _Stop(FC.MISMATCH, f"call {i}: forward modified {changed} in place")


def _outputs_at_reply(session: Session, reply: dict, private: bool = True) -> list | None:
    """A private copy of a call's outputs, taken as soon as the reply is read (the data plane, and
    on CUDA the GPU region, stay writable by the candidate process). None where the reply's
    layout is unusable: the check then reads it again and fails the call with the reason.
    `private` False: views of the GPU region where there is one (the host plane is always copied)."""
    plane = session.plane
    try:
        got = unpack(reply.get("outputs"), session.calls, plane.out_offset, plane.out_size,
                     "cuda" if session.shared is not None else "cpu")
    except TransportError:
        return None
    if session.shared is not None and private:
        got = [snapshot(g) for g in got]
        torch.cuda.synchronize()  # the copy complete now, not whenever the check reads it
    return got


def _late_writes(session: Session, reply: dict, at_reply: list | None) -> str | None:
    """Why the outputs in the candidate's reach differ from the copy taken at the reply (work that
    went on after the call answered), or None. Compared bytewise, so NaN outputs compare too."""
    if at_reply is None:
        return None
    now = _outputs_at_reply(session, reply, private=False)  # read once, no second copy of the outputs
    if now is None or len(now) != len(at_reply):
        return "the output's layout changed after the reply"
    for k, (a, b) in enumerate(zip(leaves(at_reply), leaves(now))):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            same = a.shape == b.shape and a.dtype == b.dtype and (
                a.numel() == 0 or torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
            if not same:
                return (f"output {k} changed after the call replied: work that finished after the reply is "
                        f"outside the call's clock")
    return None


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


def _thread_schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """(CPU time, run delay) in ns of each live thread of the process, the first two fields of the
    kernel's schedstat (read here, in the judge), in one read per thread.

    A thread runs on one core at a time, so the CPU time one thread gained during a call is a lower
    bound of the call's wall time that holds on any number of cores: dividing the process's CPU
    time by the cores would let a single-threaded candidate claim a fraction of its real time (its
    own clock can be slowed from native code). The run delay is the time the thread was runnable
    but waited for a core (`_waits_during`). Threads that exited during the call are not here;
    their CPU time still counts in `_cpu_ns`, their run delay is lost."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                fields = fh.read().split()
            out[int(tid)] = (int(fields[0]), int(fields[1]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _own_run_delay_ns() -> int:
    """The time (ns) the judge's calling thread has waited for a core so far: it reads the reply,
    so its wait after the candidate answered is part of a call's wall time."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            return int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _waits_during(cpu_ms: float | None, before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                  own_wait_ns: int) -> tuple[float | None, bool]:
    """The time (ms) the candidate's threads and the judge's calling thread waited for a core
    during a call, summed over the threads, and whether that reading is complete.

    The wall-clock bound (timing.reconcile) takes these waits off a call's wall time: every moment
    of an honest call's wall time is a thread of its critical path running (the work, the
    protocol), blocked on another thread of the path (whose time is then the path's) or runnable
    and waiting for a core, which the kernel adds to that thread's run delay. Summed over every
    thread, on and off the path, the waits cover what load added to the path. A wait still in
    progress when read is not counted yet (it is added when the thread gets its core), but the
    path's waits all ended before the reply was read.

    A thread that exited during the call took its waits with it, so the bound may then be too
    high for an honest candidate on a loaded host: such a reading is not `steady` (reconcile lets
    it replace a claim, and call it a lie only where the waits read already reach the cap it puts
    on them). Skipping it instead would let a candidate opt out of the bound by ending a thread in
    every call (torch's own OpenMP work between calls ends the spare threads of a larger team). An
    exit shows as a thread gone, or as CPU time the process gained that its live threads did not
    (a thread both started and ended in the call: the threads are read around the process's CPU
    clock, so a live thread's readings span the process's). None where the kernel's schedstat
    cannot be read or counts nothing (accounting off)."""
    if not before or not after:
        return None, False
    cpu_live_ns = waited_ns = 0
    for tid, (cpu, delay) in after.items():
        cpu0, delay0 = before.get(tid, (0, 0))  # a thread started in the call: all of it is the call's
        cpu_live_ns += max(cpu - cpu0, 0)
        waited_ns += max(delay - delay0, 0)
    if cpu_ms is not None and cpu_ms > 0.05 and cpu_live_ns == 0:
        return None, False
    steady = before.keys() <= after.keys() and (
        cpu_ms is None or cpu_ms * 1e6 - cpu_live_ns <= 20_000 + 0.01 * cpu_ms * 1e6)
    return (waited_ns + max(own_wait_ns, 0)) / 1e6, steady


def _stochastic_training(kind: str | None, role: str, checks_seen: int) -> bool | None:
    """The mode of a call under a stochastic reference (None: a deterministic one). With `kind`
    "eval", every other checked call (the first included) and the precision probe that may follow
    it run in eval mode, checked exactly; the other checked calls and every warm-up and timed call
    run in training mode, as the task does, checked statistically. With "always", all of them."""
    if kind is None:
        return None
    if kind == "eval" and (role == "probe" or role == "check" and checks_seen % 2 == 0):
        return False
    return True


def _stochastic_call(v: Verdict, kind: str, drawn: int, cmp) -> None:
    """A passed call of a stochastic task (`drawn`: the reference draws it was checked against, 0
    for an eval-mode call), recorded in the verdict (`Verdict.stochastic`)."""
    s = v.stochastic
    if s is None:
        s = v.stochastic = StochasticCheck(kind=kind)
        v.notes.append(
            "stochastic reference (its outputs change with the random seed): "
            + ("checked exactly in eval mode (random part off) on every other checked call, "
               if kind == "eval" else "eval() does not switch its random part off, so no call is checked exactly; ")
            + "in training mode each output judged as one more draw against the reference's own draws "
              "(per-element ranks, Kolmogorov-Smirnov, and a spread z-score added up over the run)")
    if not drawn:
        s.eval_calls += 1
        return
    s.draw_calls += 1
    s.draws = min(s.draws, drawn) if s.draws else drawn
    if cmp.draws_ks is not None and (s.worst_ks is None or cmp.draws_ks / cmp.draws_ks_bound
                                     > s.worst_ks / s.worst_ks_bound):
        s.worst_ks, s.worst_ks_bound = cmp.draws_ks, cmp.draws_ks_bound
    for k, z in enumerate(cmp.draws_z):
        if k >= len(s.z_sum):
            s.z_sum.append(0.0)
            s.z_calls.append(0)
        s.z_sum[k] += z
        s.z_calls[k] += 1


def _stochastic_run(v: Verdict) -> None:
    """The spread test over all the training-mode calls so far (stochastic.Z_RUN)."""
    s = v.stochastic
    if s is None:
        return
    for k, (total, n) in enumerate(zip(s.z_sum, s.z_calls)):
        z = total / math.sqrt(n) if n else 0.0
        if abs(z) > stochastic.Z_RUN:
            raise _Stop(FC.MISMATCH, f"output {k}: not distributed like the stochastic reference over the run: its mean "
                                     f"L1 distance to the reference's draws is {z:+.3g} standard deviations from a draw's "
                                     f"own, summed over {n} training-mode calls (bound {stochastic.Z_RUN:g}): "
                                     + ("too close to the draws: the random part left out or replaced by its expectation"
                                        if z < 0 else "too far from the draws: a wrong distribution"))


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x >= 0 else None


def _strs(x) -> list[str]:
    return [str(s)[:300] for s in x[:4096]] if isinstance(x, list) else []


def judge(task: Task, candidate: Candidate, config: JudgeConfig | None = None) -> Verdict:
    """One-shot convenience wrapper around `Judge`."""
    with Judge(config) as j:
        return j.evaluate(task, candidate)
