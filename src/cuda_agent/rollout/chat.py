"""The chat front: a model behind an OpenAI-compatible chat client (`cuda_agent.llm.ModelClient`),
the front of `cuda-agent solve` and `run`.

It keeps the canonical message list (what the server is sent; trajectory "message" events record
each one, "edit" events each later change) and the context budget. The conversation's size is
estimated from the server's own token counts (calibrated characters-per-token). Near `compress_at`
of the budget, old tool results and the bulky arguments of old calls (file contents) are replaced
by one-line stubs; the newest `keep_recent` results stay whole (the model can always read a file
again). A server that refuses the context (`ContextLengthError`) gets a compressed one; when
nothing is left to compress the run ends as context_exhausted. Provider errors propagate (the
engine records them as the outcome).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cuda_agent.llm import TOOL_BLOCK, ContextLengthError, ModelClient, ModelReply

from .env import Reset
from .front import EventSink, ModelTurn, NoEvents, Usage
from .outcome import Truncation, truncate


@dataclass(frozen=True)
class ChatLimits:
    context_tokens: int = 128_000    # the model's context budget
    reply_tokens: int = 8192         # room kept free for the next reply
    compress_at: float = 0.8         # compress old observations above this share of the budget
    keep_recent: int = 6             # newest tool results never compressed


class ChatFront:
    """A `front.ModelFront` over a chat client. `settings` goes into the trajectory's start event."""

    def __init__(self, client: ModelClient, limits: ChatLimits = ChatLimits(), *, trajectory: EventSink | None = None,
                 settings: dict | None = None):
        self.client, self.limits = client, limits
        self.trajectory = trajectory or NoEvents()
        self.settings = settings or {}
        self.tools: list[dict] = []
        self.messages: list[dict] = []
        self.replies = 0
        self.prompt_tokens = self.completion_tokens = 0
        self._chars_per_token = 3.5
        self._turn = 0

    # ------------------------------------------------------------------------------ the protocol
    def begin(self, start: Reset, messages: list[dict]) -> None:
        task = start.task
        self.tools = start.tools
        self.trajectory.event("start", task={"id": task.id, "name": task.name, "origin": task.origin,
                                             "level": task.level, "source": task.source},
                              device=start.device, agent=self.settings, tools=self.tools,
                              model=self.client.describe())
        for m in messages:
            self.add(m)

    def reply(self, turn: int) -> ModelTurn:
        self._turn = turn
        reply = self.query()
        message = reply.message()
        for call, wire in zip(reply.tool_calls, message.get("tool_calls", [])):
            if call.error:  # servers re-parse the arguments of earlier calls: keep the history valid
                wire["function"]["arguments"] = "{}"
        self.trajectory.event("model", turn=turn, index=len(self.messages),
                              prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                              usage_estimated=reply.usage_estimated, latency_s=round(reply.latency_s, 3),
                              attempts=reply.attempts, finish_reason=reply.finish_reason, reasoning=reply.reasoning,
                              text_mode=reply.text_mode,
                              calls=[{"id": c.id, "raw_arguments": c.raw_arguments, "error": c.error}
                                     for c in reply.tool_calls if c.error])
        self.add(message)
        return ModelTurn(text=reply.content, calls=list(reply.tool_calls), cut=reply.finish_reason == "length")

    def observe(self, message: dict, turn: int) -> None:
        self.add(message)

    def annotate(self, text: str, turn: int, *, reason: str) -> None:
        last = self.messages[-1]
        self.messages[-1] = {**last, "content": last["content"] + text}
        self.trajectory.event("edit", turn=turn, reason=reason,
                              edits=[{"index": len(self.messages) - 1, "message": self.messages[-1]}])

    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.completion_tokens, self.context_tokens(), self.limits.context_tokens)

    def end(self) -> None:
        pass

    # ------------------------------------------------------------------------------ the conversation
    def add(self, message: dict) -> None:
        self.messages.append(message)
        self.trajectory.event("message", index=len(self.messages) - 1, message=message)

    def query(self) -> ModelReply:
        self.fit_context()
        while True:
            try:
                reply = self.client.complete(self.messages, self.tools)
                break
            except ContextLengthError as exc:
                if not self.compress():
                    raise truncate(Truncation.CONTEXT_EXHAUSTED, f"the server refused the context: {exc}") from None
        self.replies += 1
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        if not reply.usage_estimated and reply.prompt_tokens > 0:
            self._chars_per_token = self._chars() / reply.prompt_tokens
        return reply

    def _chars(self) -> int:
        return len(json.dumps(self.messages)) + len(json.dumps(self.tools))

    def context_tokens(self) -> int:
        """Estimated size of the next request."""
        return int(self._chars() / self._chars_per_token)

    def fit_context(self) -> None:
        lim = self.limits
        if self.context_tokens() + lim.reply_tokens > lim.compress_at * lim.context_tokens:
            self.compress()
        used = self.context_tokens()
        if used + lim.reply_tokens > lim.context_tokens:
            raise truncate(Truncation.CONTEXT_EXHAUSTED, f"~{used} tokens of context in use, {lim.context_tokens} available")

    def compress(self) -> bool:
        """Replace old tool results and old bulky call arguments with stubs; False if nothing changed."""
        tool_indices = [i for i, m in enumerate(self.messages) if m["role"] == "tool"]
        recent = tool_indices[-self.limits.keep_recent:]
        cutoff = recent[0] if recent else len(self.messages)
        before = self.context_tokens()
        edits = []
        for i in range(2, cutoff):  # the system prompt and the task stay whole
            new = compressed(self.messages[i])
            if new is not None:
                self.messages[i] = new
                edits.append({"index": i, "message": new})
        if edits:
            self.trajectory.event("edit", turn=self._turn, reason="compress", tokens_before=before, edits=edits)
        return bool(edits)


STUB = "[compressed]"


def compressed(msg: dict) -> dict | None:
    """A shorter version of an old message, or None if it is short already."""
    if msg["role"] == "tool":
        text = msg["content"]
        if len(text) <= 300 or text.startswith(STUB):
            return None
        first = text.strip().splitlines()[0][:160] if text.strip() else ""
        return {**msg, "content": f"{STUB} old result of {msg.get('name', 'a tool')} ({len(text)} characters), "
                                  f"began: {first}"}
    if msg["role"] == "assistant":
        return _compressed_reply(msg)
    return None


def _compressed_reply(msg: dict) -> dict | None:
    calls, changed = [], False
    for call in msg.get("tool_calls") or []:
        raw = call["function"]["arguments"]
        if len(raw) > 400:
            try:
                args = json.loads(raw)
            except json.JSONDecodeError:
                args = None
            if isinstance(args, dict):
                args = {k: (f"{STUB} {len(v)} characters" if isinstance(v, str) and len(v) > 200 else v)
                        for k, v in args.items()}
                call = {**call, "function": {**call["function"], "arguments": json.dumps(args)}}
                changed = True
        calls.append(call)
    content = msg.get("content") or ""
    if calls:  # text-mode replies carry the calls in their text too; the client re-renders them
        stripped = TOOL_BLOCK.sub("", content)
        changed = changed or stripped != content
        content = stripped
    if len(content) > 1200:
        content, changed = content[:600] + f" {STUB} {len(content) - 600} more characters", True
    if not changed:
        return None
    new = {**msg, "content": content}
    if calls:
        new["tool_calls"] = calls
    return new
