"""One evaluation: the state a judging run holds from its start to its verdict.

The `Judge` is long-lived (spares, zygote, build cache, references and baselines outlive a
candidate); what belongs to one run lives here and dies with it: the verdict being filled in, the
worker processes it started, the vendor libraries its task allows, a load_inline build that failed
under it, and whether per-call tensors had to go through host memory. Three kinds of run share the
call protocol and differ in what they are allowed and what a failure means:

    candidate   an untrusted ModelNew: policy applies, outputs are checked, failures are its own
    reference   the task's reference run as a trusted candidate (`Judge.check_reference`):
                outputs checked, no candidate policy
    baseline    eager, torch.compile or the null model, timed only: nothing is checked, and any
                error is the judge's (`judge` category), never blamed on a candidate
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NoReturn

from .protocol import ErrorCategory, Reply
from .sandbox import Sandboxed
from .verdict import Failure, FailureCategory as FC, Verdict

Kind = Literal["candidate", "reference", "baseline"]


class JudgeError(RuntimeError):
    """The judge cannot work (bad configuration, missing device, broken task). Not a verdict."""


class Stop(Exception):
    """Ends an evaluation early with a failure."""

    def __init__(self, category: FC, message: str):
        super().__init__(message)
        self.failure = Failure(category=category, message=message[-6000:])


@dataclass
class Evaluation:
    kind: Kind
    verdict: Verdict                  # filled in as the run goes (a scratch one for a baseline)
    vendor: frozenset[str] = frozenset()   # vendor libraries (cuBLAS, cuDNN) the task's candidates may call
    live: list[Sandboxed] = field(default_factory=list)   # processes this run started, stopped at its end
    gpu_plane_problem: str | None = None   # why per-call tensors went through host memory, if they did
    build_failure: Failure | None = None   # a load_inline build the candidate asked for failed
    parent: "Evaluation | None" = None     # the candidate evaluation a baseline run was measured for

    @property
    def judged(self) -> bool:
        """Outputs are compared with the reference (every kind but a baseline)."""
        return self.kind != "baseline"

    @property
    def trusted(self) -> bool:
        """No candidate policy applies to what it runs (a reference or a baseline)."""
        return self.kind != "candidate"

    def child(self, kind: Kind, verdict: Verdict) -> "Evaluation":
        """A trusted run measured on behalf of this one (a baseline)."""
        return Evaluation(kind=kind, verdict=verdict, vendor=self.vendor, parent=self)

    def note_gpu_plane_problem(self, problem: str) -> None:
        """Per-call tensors went through host memory; the candidate's verdict says so, also when
        it happened to a baseline measured for it."""
        self.gpu_plane_problem = problem
        if self.parent is not None:
            self.parent.note_gpu_plane_problem(problem)

    def close(self) -> None:
        """Stop every process this run started, whatever happened to it."""
        for proc in self.live:
            proc.cleanup()
        self.live = []

    # --------------------------------------------------------------- what the worker reported
    def note_blocked(self, reply: Reply) -> None:
        """What the sandbox refused during a call, as policy violations (at most five)."""
        v = self.verdict
        for b in reply.blocked:
            text = f"the sandbox refused: {b}"
            if text not in v.policy_violations:
                v.policy_violations.append(text)

    def reported_error(self, reply: Reply, setup: bool = False) -> NoReturn:
        """End the run on the worker's error reply: a policy violation or a failed build it caused
        first, else the category it reports (the judge's own only during the worker's set-up:
        `setup`). A baseline's call that fails is the judge's (its set-up is read like any other,
        and a failed baseline is a JudgeError with the message either way)."""
        if not self.judged and not setup:  # a trusted baseline's call: nothing to blame on a candidate
            raise Stop(FC.JUDGE, (reply.message if reply.message is not None
                                  else "the baseline process reported an error")[:6000])
        v = self.verdict
        self.note_blocked(reply)
        if v.policy_violations:
            raise Stop(FC.POLICY, v.policy_violations[0])
        if self.build_failure is not None:
            v.compiled = False
            raise Stop(self.build_failure.category, self.build_failure.message)
        reported = reply.category
        if reported is ErrorCategory.JUDGE and not setup:  # the worker reports its set-up only before any call
            reported = ErrorCategory.RUNTIME
        raise Stop(FC(reported.value), (reply.message if reply.message is not None
                                        else "the candidate reported an error")[:6000])
