"""The agent's environment protocol: what the loop may ask of the world it acts in.

    reset() -> Reset                 the task, the backend and the tools offered to the model
    step(call) -> StepResult         one tool call: what the model sees next, the judge's verdict
                                     when it ran, and whether the episode ended
    close()

`Toolbox` (tools.py) is the environment of a workspace; the loop knows nothing else of it. A
`step` never raises for a bad call (it is an observation); it raises `JudgeFailure` when the
judge cannot work at all, the one error of this boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cuda_agent.candidate import Candidate
from cuda_agent.judge import Verdict
from cuda_agent.llm import ToolCall
from cuda_agent.reward import Reward
from cuda_agent.tasks import Task


@dataclass(frozen=True)
class Reset:
    task: Task
    device: str               # the judge's backend: "cuda" or "cpu"
    tools: list[dict]         # OpenAI function schemas of the tools


@dataclass
class StepResult:
    observation: str                    # what the model is shown
    ok: bool = True                     # False: refused, failed, or the candidate was rejected
    verdict: Verdict | None = None      # set when the judge ran
    candidate: Candidate | None = None  # the candidate that verdict is about
    reward: Reward | None = None        # the verdict scored by the environment's RewardConfig
    terminated: bool = False            # the episode reached its end state (a correct submission)
    truncated: bool = False             # the environment cut the episode short


class Environment(Protocol):
    def reset(self) -> Reset: ...

    def step(self, call: ToolCall) -> StepResult: ...

    def close(self) -> None: ...
