"""The agent: a ReAct loop in which a model turns a PyTorch module into verified, faster kernels.

    workspace.py   the CUDA Agent workspace of a task, SKILL.md
    tools.py       file, shell and judge tools over a workspace (the environment)
    client.py      OpenAI-compatible model client: native tool calls or a text format
    loop.py        the loop: turns, context budget, termination, best verified candidate
    trajectory.py  JSONL record of a run, replay
    runner.py      runs over tasks with output folders, resumable, concurrent
"""

from .client import ChatClient, ModelConfig, ModelError
from .loop import Agent, AgentConfig, AgentResult, Termination
from .tools import JudgeGate, Toolbox, ToolConfig
from .trajectory import ReplayClient, Trajectory, load_trajectory
from .workspace import create_workspace

__all__ = ["Agent", "AgentConfig", "AgentResult", "ChatClient", "JudgeGate", "ModelConfig", "ModelError",
           "ReplayClient", "Termination", "ToolConfig", "Toolbox", "Trajectory", "create_workspace",
           "load_trajectory"]
