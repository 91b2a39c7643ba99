"""The model side of an episode: one small protocol, two implementations.

    begin(start, messages)     the conversation starts (system prompt and task)
    reply(turn) -> ModelTurn   one model turn: its text and its parsed tool calls; raises EndRun
                               when the context budget leaves no room, ProviderError when the
                               model's server fails
    observe(message, turn)     a tool result or a note for the model (role "tool" or "user"),
                               shown to the model with its next turn
    annotate(text, turn, ...)  append text to the latest observation (the repetition warning)
    usage() -> Usage           tokens so far, for progress reports
    end()                      the episode is over (a token policy's session is released)
    tools, replies             the tool schemas offered, the model replies received

`chat.ChatFront` wraps a chat client (`cuda_agent.llm.ModelClient`: solve, run); `tokens.TokenFront`
wraps a token policy and a chat template (training). The engine (`engine.py`) knows only this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cuda_agent.llm import ToolCall

from .env import Reset


@dataclass(frozen=True)
class ModelTurn:
    text: str                 # the reply's prose (a call-less reply's whole text)
    calls: list[ToolCall]     # its tool calls in order; a malformed one carries `error`
    cut: bool = False         # the reply ended at the token limit


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int        # summed over the model calls (chat) or the prompt's tokens (token front)
    completion_tokens: int
    context_tokens: int       # the conversation's (estimated) size now
    context_budget: int


class ModelFront(Protocol):
    tools: list[dict]
    replies: int

    def begin(self, start: Reset, messages: list[dict]) -> None: ...

    def reply(self, turn: int) -> ModelTurn: ...

    def observe(self, message: dict, turn: int) -> None: ...

    def annotate(self, text: str, turn: int, *, reason: str) -> None: ...

    def usage(self) -> Usage: ...

    def end(self) -> None: ...


class EventSink(Protocol):
    """Where trajectory events go (`cuda_agent.agent.trajectory.Trajectory` is one)."""

    def event(self, type_: str, **fields) -> object: ...


class NoEvents:
    def event(self, type_: str, **fields) -> object:
        pass
