"""Starting a process under the call protocol: a worker from the supply, given the run's files, its
GPU region and its init request, until its ModelNew is built (load_inline builds served meanwhile).
The same start serves candidates, reference checks and baselines (`Evaluation.kind` says which);
`Judge` decides what runs and what the calls mean, this module only how a process gets to its first
call."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from cuda_agent.tasks import Task

from . import launches as ln
from . import observer as obs
from .builds import CandidateBuilds
from .config import JudgeConfig
from .cudaipc import CudaIpcError, SharedGpuBuffer
from .evaluation import Evaluation, Stop as _Stop
from .protocol import Channel, DataPlane, InitRequest, Loading, LoadInline, Ready, parse_loading
from .reference import Setup
from .sandbox import seccomp_problem
from .session import Session
from .supply import WorkerSupply
from .tensorio import pack, packed_end
from .verdict import FailureCategory as FC


class Starter:
    """Starts the processes of one judge: `start` returns a Session whose ModelNew is built."""

    def __init__(self, config: JudgeConfig, device: str, supply: WorkerSupply, builds: CandidateBuilds):
        self.config, self.device, self.supply, self.builds = config, device, supply, builds
        # JudgeConfig.keep_gpu_plane: the GPU region kept from one process to the next, and its loan
        self.kept_region: SharedGpuBuffer | None = None
        self.region_loan: SharedGpuBuffer | None = None
        # CUDA processes flush the L2 again once a call's inputs are written (JudgeConfig.flush_after_inputs:
        # "on", "auto" (inputs over the L2's size) or "off")
        self.flushes_inputs = config.flush_after_inputs if device == "cuda" and config.flush_l2 else "off"
        # ... and read a byte of every page the call will stream (JudgeConfig.touch_pages)
        self.touches_pages = device == "cuda" and config.touch_pages

    def variant(self, judge_release: bool) -> str:
        """The protocol these settings give a process, as a suffix of a baseline's key: a baseline
        measured under one variant says nothing of the protocol's cost under another (keys stored
        before a setting existed keep their old spelling)."""
        cuda = self.device == "cuda"
        # The protocol's cost on the judge's clock depends on who opens the gate: its own key.
        keyed = "+judge-release" if cuda and judge_release else ""
        if self.flushes_inputs != "off" and not judge_release:  # (the judge's release writes inputs after it)
            keyed += "+flush-inputs" if self.flushes_inputs == "on" else "+flush-inputs-auto"
        if self.touches_pages and not judge_release:
            keyed += "+touch-pages"
        if cuda and not self.config.poison_outputs:
            keyed += "+no-poison"
        if cuda and self.config.stage_inputs and not judge_release:
            keyed += "+staged"  # the calls read inputs in the process's own memory: faster for large ones
        return keyed

    def close(self) -> None:
        if self.kept_region is not None:  # no process maps it any more: the supply's workers are gone
            self.kept_region.close()
            self.kept_region = None

    def start(self, task: Task, model_new: str, library: Path | None, setup: Setup, ev: Evaluation,
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
                shared = self.gpu_region(plane.size)
            except CudaIpcError as exc:
                ev.note_gpu_plane_problem(str(exc))
                plane.pin()
        stage = cfg.stage_inputs and shared is not None  # the process asked to stage each call's inputs
        try:
            proc, chan = self.spawn(task, model_new, plane, library, ev)
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
                init_seed=setup.init_seed, flush=cfg.flush_l2, flush_inputs=self.flushes_inputs,
                touch_pages=self.touches_pages, trusted=trusted,
                stage_inputs=setup.call_in_bytes if stage else 0,
                observer=str(proc.spec.workdir / obs.FILE), policy=cfg.policy,
                launches=str(proc.spec.workdir / ln.FILE) if (proc.spec.workdir / ln.FILE).exists() else None,
                poison_bytes=setup.out_bytes if self.device == "cuda" and cfg.poison_outputs else 0,
                gpu_plane=shared.handle.hex() if shared is not None else None,
                require=proc.required_isolation())
            session.send(dict(init), "loading the candidate")
            session.ready = self.serve_init(session, ev, min(deadline, time.monotonic() + cfg.init_timeout_s))
            session.judge_release = (judge_release and shared is not None
                                     and session.ready.gpu_plane and session.ready.judge_release)
            session.staged = stage and session.ready.gpu_plane and session.ready.staged_inputs
            if stage and session.ready.staging_error:
                ev.verdict.notes.append("inputs not staged in the process's memory (calls read the shared region): "
                                        + session.ready.staging_error[:200])
            if self.device == "cuda" and session.ready.launch_observer:
                ev.verdict.notes.append("kernels listed on the checked calls only (PyTorch's profiler), not on every "
                                        "call: " + str(self.builds.launches_problem
                                                       or session.ready.launch_observer)[:200])
            if shared is not None and not session.ready.gpu_plane:
                # The process could not map the GPU region: calls go through the host plane.
                ev.note_gpu_plane_problem(str(session.ready.gpu_plane_error)[:300])
                shared.close()
                session.shared = None
                plane.pin()
            proc.probe_isolation()
            if not trusted:
                # The kernel's record, not the process's word: a candidate whose isolation is
                # incomplete may have done anything, so its numbers are not a verdict.
                missing, session.reduced_isolation = proc.isolation_gaps(session.ready.audit_hook,
                                                                        session.ready.landlock)
                if missing:
                    raise _Stop(FC.JUDGE, "isolation of the candidate process was incomplete, so its results "
                                          "cannot be trusted: missing " + "; ".join(missing))
        except BaseException:
            session.close()
            raise
        return session

    def gpu_region(self, nbytes: int) -> SharedGpuBuffer:
        """The GPU region of a new candidate or baseline process: its own allocation, freed when the
        process is gone, or (JudgeConfig.keep_gpu_plane) a loan of the one this judge keeps, zeroed
        first, so that no free on the GPU precedes the process's calls. The kept region grows when
        a task needs more; a loan still out (sessions overlap) gets an allocation of its own."""
        if not self.config.keep_gpu_plane:
            return SharedGpuBuffer.create(nbytes)
        kept = self.kept_region
        if kept is not None and self.region_loan is not None and self.region_loan.ptr is not None:
            return SharedGpuBuffer.create(nbytes)
        if kept is None or kept.nbytes < nbytes:
            if kept is not None:
                self.kept_region = None
                kept.close()
            self.kept_region = kept = SharedGpuBuffer.create(nbytes)
        self.region_loan = kept.lend()
        return self.region_loan

    def spawn(self, task: Task, model_new: str, plane: DataPlane, library: Path | None, ev: Evaluation):
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

    def serve_init(self, session: Session, ev: Evaluation, deadline: float) -> Ready:
        """Wait for the worker's ModelNew, building what its load_inline calls ask for meanwhile."""
        while True:
            msg = session.recv(deadline, "loading the candidate", parse_loading)
            if isinstance(msg, Loading):
                session.candidate_code = True
                continue
            if isinstance(msg, LoadInline):
                started = time.monotonic()
                session.send(dict(self.builds.serve(msg.request, session.proc, ev)), "loading the candidate")
                # compile time has its own limit (build_timeout_s); it does not count as loading time
                deadline += time.monotonic() - started
                continue
            if not msg.ok:
                ev.reported_error(msg, setup=True)
            ev.note_blocked(msg)
            return msg
