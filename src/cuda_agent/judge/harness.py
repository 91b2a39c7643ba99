"""The judge: one evaluation from candidate to verdict, and the timing decisions around its calls.
`Judge` orchestrates; its parts each have one owner:

    evaluation.py  the state of one run (candidate, reference check or baseline) and its verdict
    session.py     one worker process under the call protocol: channel, data plane, health watch
    starter.py     how a process gets to its first call: GPU region, files, init request, ModelNew
    calls.py       the calls of one run: fresh inputs, the reference's outputs, each call's checks
    clocks.py      the judge's clocks of a candidate process (/proc, the process CPU clock)
    supply.py      worker processes: spares started ahead of need, the zygote, uid rotation
    builds/        the build: plan, sandboxed builder, build job, the candidate's builds and their checks
    reference.py   the task's reference in this process: construction, fresh inputs, float64
    baselines.py   eager / torch.compile / null baselines: keys, cache, store, trusted sources
    protocol.py    the channel and the typed messages between judge and worker (what the worker
                   sends parsed once, into records)
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
import os
import secrets
import statistics
import time
from pathlib import Path

import torch

from cuda_agent import host
from cuda_agent.candidate import Candidate
from cuda_agent.hardware.sol import floor_breach
from cuda_agent.tasks import Task

from . import memcheck as mc
from . import policy as pol
from .baselines import (Baseline as _Baseline, BaselineCache, BaselineKey, BaselineStore, FileBaselineStore,
                        baseline_source)
from .builds import BuildOutcome, Builder, BuildPlan, CandidateBuilds, build_arch
from .calls import CallLoop
from .sol import task_speed_of_light
from .config import JudgeConfig
from .devlock import DeviceLock, LockTimeout, gpu_lock_of
from .evaluation import Evaluation, JudgeError, Stop as _Stop
from .reference import Reference, Setup, make_setup, rebuild, reference_ops
from .sandbox import SandboxError, is_root, work_root_dir
from .session import Session
from .starter import Starter
from .supply import WorkerSupply, ZygoteHolder
from .timing import reconcile, summarize
from .verdict import Failure, FailureCategory as FC, Verdict
from .verdict_cache import VerdictCache

__all__ = ["Judge", "JudgeError", "judge"]


def _package_files() -> dict[str, str]:
    root = Path(__file__).resolve().parent.parent
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in {".py", ".h", ".cpp"} and "suite" not in path.parts:
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


# What a CUDA judge's allocator may keep cached between evaluations: small tasks' blocks are reused
# without a wait for the GPU's lock (`Judge._return_gpu_memory`)
_KEEP_GPU_CACHE_BYTES = 1 << 30

_HARNESS_VERSION = 8  # bump when the call protocol changes: cached baselines depend on it


def _scratch_verdict(task: Task) -> Verdict:
    """The verdict a baseline run fills in: never returned, only its notes and violations are read."""
    return Verdict(task_id=task.id, task_name=task.name, candidate_hash="baseline", device="")


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
        # one is leased for the judge's life, searched from a place the process id and the
        # instance count pick. A given `sandbox_uid` is the caller's (a pool's slot, leased there).
        Judge._instances += 1
        self._uid_lease = None
        self.uid = None
        if is_root():
            if config.sandbox_uid is not None:
                self.uid = config.sandbox_uid
            else:
                self._uid_lease = host.lease_uids(host.JUDGE_UIDS, [0], os.getpid() + 997 * Judge._instances)
                self.uid = self._uid_lease.base
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
        self._vendor: dict[str, frozenset[str]] = {}   # task id -> vendor libraries its candidates may call
        # Judges sharing this device: timed calls hold it alone, other calls share it (devlock.py).
        # On CUDA every judge takes its GPU's lock unless told another: two judges of this machine
        # (two test workers, a benchmark beside a training run) never time a call beside the other's.
        # The same function names the lock the trainer's generation takes (train/generate.py).
        lock = config.device_lock
        if lock is None and self.device == "cuda":
            lock = gpu_lock_of(0)
        self._device_lock = DeviceLock(lock) if lock else None
        # How a process gets to its first call (starter.py): the GPU region, the files, the init request
        self.starter = Starter(config, self.device, self.supply, self.builds)
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
            session = self.starter.start(task, baseline_source("eager", setup.outputs), None, setup, ev, deadline)
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
            self._return_gpu_memory()
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
            self._return_gpu_memory()
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
        """What this judge builds for `candidate` (see `cuda_agent.judge.builds.plan`)."""
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
        self.starter.close()
        if self._uid_lease is not None:   # last: its processes are gone
            self._uid_lease.close()

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
    def _return_gpu_memory(self) -> None:
        """Give the GPU back what this process's allocator keeps after an evaluation. The judge
        computes the reference's outputs (and their float64 check) on the GPU; PyTorch keeps the
        freed blocks for reuse, so a long-lived judge came to hold the largest task's footprint
        for good (66 GiB after 60 published solutions on an H100), and judges sharing the GPU
        (a pool's judges per GPU, test workers) and their candidates ran out of memory. Freed
        while holding the GPU's lock shared, so never beside another judge's timed call."""
        if (self.device != "cuda" or not torch.cuda.is_initialized()
                or torch.cuda.memory_reserved() < _KEEP_GPU_CACHE_BYTES):
            return
        try:
            held = (self._device_lock.hold(exclusive=False, timeout=self.config.call_timeout_s)
                    if self._device_lock else contextlib.nullcontext())
            with held:
                torch.cuda.empty_cache()
        except LockTimeout:
            pass  # a lock held this long is reported by the next evaluation's calls; freed then
        except RuntimeError:
            pass  # a CUDA error here is the next evaluation's to report: this verdict is already made
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
        session = self.starter.start(task, cand.model_new, library, setup, ev, deadline)
        v.isolation = session.proc.isolation
        v.reduced_isolation = session.reduced_isolation
        # load_inline builds happen while the candidate starts; they count as build, not start
        v.phase_s["start"] = time.monotonic() - t_phase - ((v.phase_s.get("build") or 0.0) - built_before)
        try:
            if session.ready.timing_gate and self.device == "cuda":
                v.notes.append(f"calls timed without the timing gate (launch gaps included): "
                               f"{session.ready.timing_gate[:200]}")
            if session.judge_release:
                v.notes.append("the judge opened each call's gate: its own clock of a call starts when it "
                               "writes the inputs, after forward has enqueued its work")
            elif self.device == "cuda" and cfg.gate_release == "judge":
                v.notes.append("gate_release=judge not possible here (no shared GPU region or no control "
                               "page): the process opened each call's gate")
            if session.ready.unmatched:
                v.notes.append(f"parameters not copied from Model (different name or shape): "
                               f"{', '.join(session.ready.unmatched[:8])}")
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
        # compute-sanitizer's process runs the candidate's kernels outside the calls: as a checked
        # call, it shares the device with other judges' checks but never runs beside a timed call
        held = self._device_lock.hold(exclusive=False) if self._device_lock else contextlib.nullcontext()
        with held:
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
                and session.ready.gpu_plane and session.ready.judge_release)

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
        fresh = self.starter.start(task, cand.model_new, library, setup, ev, deadline, judge_release=True)
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

    def _drive(self, session: Session, ref: Reference, setup: Setup, roles: list[str], ev: Evaluation,
               deadline: float, first_index: int = 0, compiling_calls: int = 0) -> tuple[list[float], list[float]]:
        """The calls of `roles` in `session` (calls.py); the claimed and the outside-measured times
        of the timed calls."""
        return CallLoop(session, ref, setup, ev, deadline, config=self.config, device=self.device,
                        device_lock=self._device_lock).run(roles, first_index, compiling_calls)

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
        bkey = BaselineKey(harness_version=_HARNESS_VERSION, task_id=task.id, device_name=self.device_name,
                           torch_version=torch.__version__, mode=mode + self.starter.variant(judge_release),
                           flush_l2=cfg.flush_l2, n_timed=cfg.n_timed,
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
                session = self.starter.start(task, source, None, setup, run, time.monotonic() + cfg.total_timeout_s,
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


def judge(task: Task, candidate: Candidate, config: JudgeConfig | None = None) -> Verdict:
    """One-shot convenience wrapper around `Judge`."""
    with Judge(config) as j:
        return j.evaluate(task, candidate)
