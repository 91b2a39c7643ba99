"""What the judge builds for a candidate, and the checks around it: the owner of builds and policy.

One path for every build of a candidate (see `plan.py`): the static plan (load errors and
source policy), the sandboxed build step with its binary checks (`build_spec`), the content-addressed
cache (`Builder`); for a workspace at the start of an evaluation, for a single file when its module
calls `load_inline` in the worker (`serve`), and ahead of judging (`Judge.build`, compile workers).
Every outcome is recorded in the evaluation's verdict; a candidate's fault ends the evaluation
(`Stop`), never the judge. The judge's own operator observer is built here too, never a candidate's
code.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cuda_agent.candidate import Candidate

from .. import launches as ln
from .. import observer as obs
from ..evaluation import Evaluation, JudgeError, Stop
from ..protocol import BuildAnswer, BuildRequest
from ..sandbox import Sandboxed
from ..verdict import Failure, FailureCategory as FC
from .builder import Builder, BuildError, BuildSpec
from .plan import BuildOutcome, BuildPlan, build_planned, build_spec, inline_refusal, plan_build, spec_from_request


class CandidateBuilds:
    def __init__(self, builder: Builder, device: str, policy: str):
        self.builder = builder
        self.device = device
        self.policy = policy
        self._observer: Path | None = None
        self._launches: Path | None = None
        self.launches_problem: str | None = None  # why there is no launch observer (CUDA)

    def plan(self, candidate: Candidate) -> BuildPlan:
        """What the judge builds for `candidate` (see `cuda_agent.judge.builds.plan`)."""
        return plan_build(candidate, self.device, self.policy)

    def ahead(self, candidate: Candidate) -> BuildOutcome:
        """The static checks and builds for `candidate` with nothing run (`Judge.build`)."""
        return build_planned(self.plan(candidate), self.builder)

    def workspace(self, cand: Candidate, ev: Evaluation) -> Path | None:
        """The plan's refusal or a workspace's build, recorded in the verdict (raises Stop with the
        failure). A single file's load_inline builds wait until its module asks for them."""
        v = ev.verdict
        plan = self.plan(cand)
        if plan.load_error is not None:
            raise Stop(FC.LOAD, plan.load_error)
        if plan.violations:
            v.policy_violations.extend(plan.violations)
            raise Stop(FC.POLICY, plan.violations[0])
        return self.build(plan.specs[0], ev) if cand.kind == "workspace" else None

    def build(self, spec: BuildSpec, ev: Evaluation) -> Path:
        """One build of the evaluation's candidate through the build plan's step, recorded in its verdict."""
        v = ev.verdict
        built = build_spec(self.builder, spec, policy=self.policy, device=self.device, vendor=ev.vendor)
        if built.library is None:
            v.compiled = False
            raise Stop(built.failure.category, built.failure.message)
        v.compiled = True
        v.build_s = (v.build_s or 0.0) + built.seconds
        v.phase_s["build"] = v.build_s
        if built.note:
            v.notes.append(built.note)
        if built.violations:
            v.policy_violations.extend(built.violations)
            raise Stop(FC.POLICY, built.violations[0])
        v.build_cached = built.cached if v.build_cached is None else (v.build_cached and built.cached)
        if spec.with_cuda and built.headers:
            v.build_headers.append(built.headers)
        return built.library

    def serve(self, msg: BuildRequest | dict, proc: Sandboxed, ev: Evaluation) -> BuildAnswer:
        """A load_inline build the worker asked for, through the build plan's checks and build step;
        a failure is remembered (`ev.build_failure`) as the reason if the worker then fails."""
        v = ev.verdict
        try:
            spec = spec_from_request(msg)
        except BuildError as exc:
            ev.build_failure = Failure(category=FC.COMPILE, message=str(exc))
            return BuildAnswer(ok=False, message=str(exc))
        refusal = inline_refusal(spec, self.device, self.policy)
        if refusal is not None:
            if refusal.category == "policy":
                v.policy_violations.extend(refusal.violations)
            else:
                ev.build_failure = Failure(category=FC.COMPILE, message=refusal.message)
            return BuildAnswer(ok=False, message=refusal.message)
        try:
            library = self.build(spec, ev)
        except Stop as stop:
            ev.build_failure = stop.failure
            return BuildAnswer(ok=False, message=stop.failure.message)
        dest = proc.spec.workdir / f"lib_{spec.name}.so"
        shutil.copy2(library, dest)
        if proc.uid is not None:
            os.chown(dest, proc.uid, proc.uid)
        return BuildAnswer(ok=True, library=str(dest))

    def observer_library(self) -> Path:
        """observer.cpp built once per toolchain (the judge's own build, never a candidate's)."""
        if self._observer is None:
            try:
                self._observer = self.builder.build(obs.spec()).library
            except BuildError as exc:
                raise JudgeError(f"the judge's operator observer does not build: {exc}") from None
        return self._observer

    def launches_library(self) -> Path | None:
        """launches.cpp built once per toolchain, on CUDA; None where CUPTI's headers are missing
        or the build fails (`launches_problem` says which; the workers then say so in each verdict)."""
        if self._launches is None and self.launches_problem is None and self.device == "cuda":
            built = ln.spec()
            if built is None:
                self.launches_problem = "no CUPTI headers where PyTorch's CUDA is"
                return None
            try:
                self._launches = self.builder.build(built).library
            except BuildError as exc:
                self.launches_problem = f"the launch observer does not build: {str(exc)[:300]}"
        return self._launches
