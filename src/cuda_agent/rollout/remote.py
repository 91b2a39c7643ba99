"""The agent's judge in another place: a running `cuda-agent serve` (`solve`/`run --judge-url`).

`RemoteEvaluator` is an `evaluator.Evaluator` like the local judge. Every judgement (verify, profile,
submit) is a submission to the service, so its judge settings, its GPUs and its results database
apply, and an unchanged candidate is one submission (the service is idempotent by content): a
`verify` after a `compile` of the same bytes waits for nothing. This machine builds and runs no
candidate code and needs no GPU. What changes for the tools:

- `compile` submits the workspace and reports the build part of the verdict (the service has no
  build-only route; the judgement it starts is the one `verify` then reads);
- `profile` of the candidate gives the judge's timing but no per-kernel profile (the library lives
  on the service's machine); profiling the reference runs here, on this machine's device if it has
  the service's, and otherwise says so.

A service that cannot be reached, refuses the token or breaks is the judge being unable to work
(`JudgeError`: the run ends with a judge error a rerun retries); a pair the service's judge could
not judge is the same, as with the local judge. `close` shuts the client down; a second close is
harmless.
"""

from __future__ import annotations

import contextlib

from cuda_agent.candidate import Candidate
from cuda_agent.judge import FailureCategory, JudgeConfig, JudgeError, Verdict
from cuda_agent.judge.builds import BuildOutcome
from cuda_agent.tasks import Task

_BUILD_CATEGORIES = (FailureCategory.LOAD, FailureCategory.POLICY, FailureCategory.COMPILE,
                     FailureCategory.COMPILE_TIMEOUT)


class RemoteEvaluator:
    """The judge of a `cuda-agent serve` behind the agent's tools (see the module docstring)."""

    local = False

    def __init__(self, client, *, url: str = ""):
        from cuda_agent.serve.client import ServiceError

        self.client = client
        self.url = url or getattr(client, "url", "")
        try:
            self.info = client.info()
        except ServiceError as exc:
            raise JudgeError(f"judge service {self.url}: {exc}") from None
        try:
            self.config = JudgeConfig.model_validate(self.info.judge_config)
        except ValueError:  # a service of another version: its settings are still what applies
            self.config = None

    @classmethod
    def connect(cls, url: str, *, run: str = "agent") -> "RemoteEvaluator":
        """A gate on the service at `url`, its token from $CUDA_AGENT_SERVE_TOKEN. Raises ValueError
        without a token, JudgeError when the service cannot be asked."""
        from cuda_agent.serve.client import JudgeClient

        client = JudgeClient.from_env(url, run=run)
        try:
            return cls(client, url=url)
        except BaseException:
            client.shutdown(wait=False, cancel_futures=True)
            raise

    @property
    def device(self) -> str:
        return self.info.device

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        from cuda_agent.serve.client import ServiceError

        try:
            return self.client.evaluate(task, candidate)
        except ServiceError as exc:
            raise JudgeError(f"judge service {self.url}: {exc}") from None

    def build(self, candidate: Candidate, task: Task) -> BuildOutcome:
        """The build part of the service's verdict of `candidate` on `task` (no library here)."""
        v = self.evaluate(task, candidate)
        failure = v.failure if v.failure is not None and v.failure.category in _BUILD_CATEGORIES else None
        compiled = bool(v.compiled) and failure is None and not v.policy_violations
        return BuildOutcome(compiled=compiled, failure=failure, seconds=v.build_s or 0.0,
                            policy_violations=list(v.policy_violations),
                            notes=[f"built and judged by the service at {self.url}"
                                   + (" (build cache hit there)" if v.build_cached else "")])

    def exclusive(self):
        """Nothing to hold here: the service times its calls on its own GPUs."""
        return contextlib.nullcontext()

    def close(self) -> None:
        self.client.shutdown(wait=False, cancel_futures=True)
