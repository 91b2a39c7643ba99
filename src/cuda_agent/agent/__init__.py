"""The agent: a model turns a PyTorch module into verified, faster kernels in a workspace.

    workspace.py   the CUDA Agent workspace of a task, SKILL.md
    tools.py       file, shell and judge tools over a workspace (the environment, `Toolbox`)
    loop.py        `Agent`: the episode engine with the chat front; AgentConfig, AgentResult
    live.py        the terminal's view of a run's progress (solve)
    trajectory.py  JSONL record of a run, replay
    runner.py      runs over tasks with output folders, resumable (by error kind), concurrent

The loop, the environment protocol, how a run ends and how the judge is reached (`Evaluator`:
local, pool, memo, remote service, Ray) are `cuda_agent.rollout`, shared with training. The model
client (OpenAI-compatible, native tool calls or a text format) is `cuda_agent.llm`, shared with
synthesis.
"""

from cuda_agent.llm import ChatClient, ModelConfig, ProviderError
from cuda_agent.rollout.env import Environment, Reset, StepResult
from cuda_agent.rollout.evaluator import Evaluator, LocalEvaluator
from cuda_agent.rollout.outcome import (ErrorInfo, InternalError, Interrupted, JudgeFailure, Outcome, RolloutError,
                                        Terminal, Termination, Truncation)

from .loop import Agent, AgentConfig, AgentProgress, AgentResult
from .tools import Toolbox, ToolConfig
from .trajectory import ReplayClient, Trajectory, load_trajectory
from .workspace import create_workspace

__all__ = ["Agent", "AgentConfig", "AgentProgress", "AgentResult", "ChatClient", "Environment", "ErrorInfo",
           "Evaluator", "InternalError", "Interrupted", "JudgeFailure", "LocalEvaluator", "ModelConfig", "Outcome",
           "ProviderError", "ReplayClient", "Reset", "RolloutError", "StepResult", "Terminal", "Termination",
           "ToolConfig", "Toolbox", "Trajectory", "Truncation", "create_workspace", "load_trajectory"]
