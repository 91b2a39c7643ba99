"""The agent: a ReAct loop in which a model turns a PyTorch module into verified, faster kernels.

    workspace.py   the CUDA Agent workspace of a task, SKILL.md
    env.py         the environment protocol the loop talks to: reset, step
    tools.py       file, shell and judge tools over a workspace (the environment)
    outcome.py     how a run ended: terminated / truncated / a typed error per boundary
    loop.py        the loop: turns, context budget, endings, best verified candidate, progress reports
    live.py        the terminal's view of a run's progress (solve)
    trajectory.py  JSONL record of a run, replay
    runner.py      runs over tasks with output folders, resumable (by error kind), concurrent

The model client (OpenAI-compatible, native tool calls or a text format) is `cuda_agent.llm`,
shared with synthesis.
"""

from cuda_agent.llm import ChatClient, ModelConfig, ProviderError

from .env import Environment, Reset, StepResult
from .loop import Agent, AgentConfig, AgentProgress, AgentResult
from .outcome import (ErrorInfo, InternalError, Interrupted, JudgeFailure, Outcome, RolloutError, Terminal,
                      Termination, Truncation)
from .tools import JudgeGate, Toolbox, ToolConfig
from .trajectory import ReplayClient, Trajectory, load_trajectory
from .workspace import create_workspace

__all__ = ["Agent", "AgentConfig", "AgentProgress", "AgentResult", "ChatClient", "Environment", "ErrorInfo", "InternalError",
           "Interrupted", "JudgeFailure", "JudgeGate", "ModelConfig", "Outcome", "ProviderError", "ReplayClient",
           "Reset", "RolloutError", "StepResult", "Terminal", "Termination", "ToolConfig", "Toolbox", "Trajectory",
           "Truncation", "create_workspace", "load_trajectory"]
