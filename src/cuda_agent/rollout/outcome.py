"""How a rollout ended: a typed record, and one error type per boundary.

A run ends in exactly one of three ways (Gymnasium's split, plus errors kept apart):

* terminated: the episode reached its end state (`Terminal.SUBMITTED`: a correct candidate);
* truncated: a limit cut it short (`Truncation`: max_turns, context_exhausted, repeated, or the
  environment's own limit);
* error: something outside the model's control broke the rollout. One exception type per
  boundary, each with `kind` and `retryable`:

      ProviderError  the model server (cuda_agent.llm)        retryable: the server may come back
      JudgeFailure   the judge cannot work (no device, a
                     broken task, a bad configuration)        retryable: fix the judge, run again
      Interrupted    the run was stopped from outside         retryable: it did not finish
      InternalError  a bug of the agent's own code            not retryable: it fails the same way

A bad rollout is data, not a crash: the engine (`engine.Engine.run`) turns each of these into an
`Outcome`, and the runner decides from `retryable` alone whether a rerun starts the task again.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from cuda_agent.llm import ProviderError

ErrorKind = Literal["provider", "judge", "interrupted", "internal"]


class Terminal(str, Enum):
    SUBMITTED = "submitted"


class Truncation(str, Enum):
    MAX_TURNS = "max_turns"
    CONTEXT_EXHAUSTED = "context_exhausted"
    REPEATED = "repeated"
    ENVIRONMENT = "environment"   # the environment's own limit (StepResult.truncated)


class Termination(str, Enum):
    """The one-word reason `result.json` has always carried (`termination`); derived from an Outcome."""

    SUBMITTED = "submitted"
    MAX_TURNS = "max_turns"
    CONTEXT_EXHAUSTED = "context_exhausted"
    REPEATED = "repeated"
    ENVIRONMENT = "environment"
    ERROR = "error"


class RolloutError(Exception):
    """An error at one of the rollout's boundaries (the provider's is `cuda_agent.llm.ProviderError`)."""

    kind: ErrorKind = "internal"

    @property
    def retryable(self) -> bool:
        return False


class JudgeFailure(RolloutError):
    """The judge cannot work at all (cuda_agent.judge.JudgeError): not the candidate's fault."""

    kind = "judge"

    @property
    def retryable(self) -> bool:
        return True


class Interrupted(RolloutError):
    """The run was stopped from outside (another task failed, Ctrl-C) before it finished."""

    kind = "interrupted"

    @property
    def retryable(self) -> bool:
        return True


class InternalError(RolloutError):
    """A bug of the agent's own code; the message holds the traceback."""

    kind = "internal"


class ErrorInfo(BaseModel):
    """An error as recorded in an outcome, a trajectory and result.json."""

    model_config = ConfigDict(frozen=True)
    kind: ErrorKind
    message: str
    retryable: bool

    @classmethod
    def of(cls, exc: RolloutError | ProviderError) -> "ErrorInfo":
        return cls(kind=exc.kind, message=str(exc), retryable=exc.retryable)


class Outcome(BaseModel):
    """How one rollout ended: exactly one of `terminated`, `truncated` and `error` is set."""

    model_config = ConfigDict(frozen=True)
    terminated: Terminal | None = None
    truncated: Truncation | None = None
    error: ErrorInfo | None = None
    message: str = ""

    @model_validator(mode="after")
    def _one_way(self) -> "Outcome":
        if sum(x is not None for x in (self.terminated, self.truncated, self.error)) != 1:
            raise ValueError("an outcome is terminated, truncated or an error: exactly one of them")
        return self

    @classmethod
    def failed(cls, exc: RolloutError | ProviderError) -> "Outcome":
        info = ErrorInfo.of(exc)
        return cls(error=info, message=f"{info.kind}: {info.message}")

    @property
    def termination(self) -> Termination:
        if self.error is not None:
            return Termination.ERROR
        return Termination((self.terminated or self.truncated).value)

    @property
    def retryable(self) -> bool:
        """A rerun should start this task again: only an error that may not happen twice."""
        return self.error is not None and self.error.retryable

    def record(self) -> dict:
        """The fields result.json and the trajectory's end event carry (`termination` and
        `message` as before, the split and the typed error beside them)."""
        return {"termination": self.termination.value, "message": self.message,
                "terminated": self.terminated.value if self.terminated else None,
                "truncated": self.truncated.value if self.truncated else None,
                "error": self.error.model_dump() if self.error else None}


class EndRun(Exception):
    """Raised inside the engine (or a model front) to end a run as terminated or truncated."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.message)
        self.outcome = outcome


def terminate(reason: Terminal, message: str) -> EndRun:
    return EndRun(Outcome(terminated=reason, message=message))


def truncate(reason: Truncation, message: str) -> EndRun:
    return EndRun(Outcome(truncated=reason, message=message))
