"""The environment protocol: what the episode engine may ask of the world a model acts in.

    reset() -> Reset                 the task, the backend, the tools offered to the model, and
                                     the RewardConfig the environment scores verdicts with
    step(call) -> StepResult         one tool call: what the model sees next, the judge's verdict
                                     when it ran (scored by the environment), whether it ended
    close()

`Toolbox` (cuda_agent.agent.tools) is the environment of a workspace; the engine knows nothing else
of it. A `step` never raises for a bad call (it is an observation); it raises `JudgeFailure` when
the judge cannot work at all, the one error of this boundary.

The reward is scored once, here: a step that ran the judge carries `reward`, the verdict scored by
the environment's RewardConfig, and that number is both what the observation text tells the model
and what the episode is rewarded with (the engine never scores a verdict again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cuda_agent.candidate import Candidate
from cuda_agent.judge import Verdict
from cuda_agent.llm import ToolCall
from cuda_agent.reward import Reward, RewardConfig
from cuda_agent.tasks import Task


@dataclass(frozen=True)
class Reset:
    task: Task
    device: str               # the judge's backend: "cuda" or "cpu"
    tools: list[dict]         # OpenAI function schemas of the tools
    # how this environment scores verdicts; the engine reads only `fail` from it (the reward of an
    # episode whose workspace never became a candidate, so no verdict exists to score)
    reward: RewardConfig = field(default_factory=RewardConfig)


@dataclass
class StepResult:
    observation: str                    # what the model is shown
    ok: bool = True                     # False: refused, failed, or the candidate was rejected
    verdict: Verdict | None = None      # set when the judge ran
    candidate: Candidate | None = None  # the candidate that verdict is about
    reward: Reward | None = None        # the verdict scored by the environment's RewardConfig (set with verdict)
    terminated: bool = False            # the episode reached its end state (a correct submission)
    truncated: bool = False             # the environment cut the episode short


class Environment(Protocol):
    def reset(self) -> Reset: ...

    def step(self, call: ToolCall) -> StepResult: ...

    def close(self) -> None: ...
