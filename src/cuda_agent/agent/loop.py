"""The agent of `cuda-agent solve` and `run`: the episode engine (`cuda_agent.rollout`) with the
chat front, over one environment (the workspace's `Toolbox`).

The loop itself (turns, limits, repetition, endings, the best verified candidate, progress
reports) is `rollout.engine.Engine`, shared with every training stage; the model side (the
canonical message list, the context budget and its compression, the server's errors) is
`rollout.chat.ChatFront`. This module keeps the agent's settings (`AgentConfig`) and its result
(`AgentResult`, the record behind result.json and the trajectory's end event).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.candidate import Candidate
from cuda_agent.judge import Verdict
from cuda_agent.llm import ModelClient
from cuda_agent.reward import Reward, RewardConfig
from cuda_agent.rollout.chat import ChatFront, ChatLimits
from cuda_agent.rollout.engine import AgentProgress, Engine, EngineConfig, rank
from cuda_agent.rollout.env import Environment
from cuda_agent.rollout.outcome import Outcome, Terminal, Termination
from cuda_agent.rollout.prompts import NO_TOOL_CALL, SYSTEM, TASK

from .tools import ToolConfig
from .trajectory import Trajectory

__all__ = ["Agent", "AgentConfig", "AgentProgress", "AgentResult", "NO_TOOL_CALL", "RESULT_VERSION", "SYSTEM",
           "TASK", "rank"]


class AgentConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(150, ge=1, description="model calls per run (CUDA Agent: 150 in training, 200 in evaluation)")
    context_tokens: int = Field(128_000, ge=1000, description="the model's context budget")
    reply_tokens: int = Field(8192, ge=0, description="room kept free for the next reply")
    compress_at: float = Field(0.8, gt=0, le=1, description="compress old observations above this share of the budget")
    keep_recent: int = Field(6, ge=1, description="newest tool results never compressed")
    repeat_warn: int = Field(3, ge=2, description="identical consecutive steps before the model is warned")
    repeat_limit: int = Field(6, ge=2, description="identical consecutive steps that end the run")
    tools: ToolConfig = Field(default_factory=ToolConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig,
                                 description="how the environment scores verdicts (the judge only measures)")


RESULT_VERSION = 2  # result.json / end event: 2 added terminated, truncated, error (kind, retryable)


@dataclass
class AgentResult:
    task_id: str
    task_name: str
    outcome: Outcome
    turns: int                  # model replies received
    prompt_tokens: int          # summed over every model call
    completion_tokens: int
    seconds: float
    best: Candidate | None = None           # the best candidate the judge found correct
    best_verdict: Verdict | None = None
    best_reward: Reward | None = None       # best_verdict scored by the environment

    @property
    def termination(self) -> Termination:
        return self.outcome.termination

    @property
    def message(self) -> str:
        return self.outcome.message

    @property
    def submitted(self) -> bool:
        return self.outcome.terminated is Terminal.SUBMITTED

    def summary(self) -> dict:
        v, r = self.best_verdict, self.best_reward
        return {
            "task": self.task_name, "task_id": self.task_id, "version": RESULT_VERSION, **self.outcome.record(),
            "turns": self.turns, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "seconds": round(self.seconds, 2),
            "solved": v is not None,
            "best": None if v is None else {
                "candidate_hash": v.candidate_hash, "reward": r.value if r else None,
                "reward_reason": r.reason if r else None,
                "runtime_ms": v.runtime_ms, "eager_ms": v.eager_ms, "compile_ms": v.compile_ms,
                "speedup_vs_eager": v.speedup_vs_eager, "speedup_vs_compile": v.speedup_vs_compile,
                "device_name": v.device_name},
        }




class Agent:
    """One run of the engine in one environment, with a chat client as the model. Attributes after
    `run`: `messages` (the canonical conversation), `trajectory`."""

    def __init__(self, client: ModelClient, env: Environment, config: AgentConfig | None = None,
                 trajectory: Trajectory | None = None, stop: threading.Event | None = None,
                 on_progress: Callable[[AgentProgress], None] | None = None):
        self.client = client
        self.env = env
        self.config = config or AgentConfig()
        self.trajectory = trajectory or Trajectory()
        self.stop = stop  # set by another thread to end the run at the next turn
        self.on_progress = on_progress
        c = self.config
        self.front = ChatFront(client, ChatLimits(context_tokens=c.context_tokens, reply_tokens=c.reply_tokens,
                                                  compress_at=c.compress_at, keep_recent=c.keep_recent),
                               trajectory=self.trajectory, settings=c.model_dump(mode="json"))

    @property
    def messages(self) -> list[dict]:
        return self.front.messages

    def run(self) -> AgentResult:
        c = self.config
        engine = Engine(self.env, self.front, EngineConfig(max_turns=c.max_turns, repeat_warn=c.repeat_warn,
                                                           repeat_limit=c.repeat_limit),
                        trajectory=self.trajectory, stop=self.stop, on_progress=self.on_progress)
        ep = engine.run()
        best = ep.best
        result = AgentResult(ep.task_id, ep.task_name, ep.outcome,
                             ep.turns, self.front.prompt_tokens, self.front.completion_tokens, ep.seconds,
                             best.candidate if best else None, best.verdict if best else None,
                             best.reward if best else None)
        self.trajectory.event("end", **result.summary())
        return result
