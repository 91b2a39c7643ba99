"""Trajectories: every step of a run as JSON lines, enough to replay it and to train on it.

Events, one per line, each with `type` and `t` (seconds since the start):

    start     task, model settings (no key), agent settings, tool schemas
    message   a message appended to the conversation: index, canonical message
    model     one model call: turn, index of its assistant message, tokens, latency, attempts,
              finish reason, reasoning text, each tool call's parse error
    tool      one tool call: turn, call id, name, raw arguments, observation, ok, seconds, the
              full verdict when the judge ran, submitted
    edit      earlier messages replaced: turn, reason ("compress": stubs to fit the context, "repeat
              warning": a note appended), [{index, message}], tokens before
    note      something about the run itself, not the conversation (a progress view that failed)
    end       the run's summary as in result.json: termination and message (every version);
              from version 2 also terminated, truncated, error {kind, message, retryable}

`conversation(events, turn)` rebuilds what the model saw at a turn; `ReplayClient` feeds the
recorded replies back through a new run.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import IO

from cuda_agent.llm import ModelReply, ProviderError, ToolCall, parse_arguments


class Trajectory:
    """An append-only event log, written line by line (flushed) so a crash loses nothing finished."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self.events: list[dict] = []
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._fh: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("w")

    def event(self, type_: str, **fields) -> dict:
        line = json.dumps({"type": type_, "t": round(time.monotonic() - self._t0, 3), **fields}, default=str)
        record = json.loads(line)  # a snapshot: later changes to the caller's objects do not leak in
        with self._lock:
            self.events.append(record)
            if self._fh is not None:
                self._fh.write(line + "\n")
                self._fh.flush()
        return record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "Trajectory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_trajectory(path: str | Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def conversation(events: list[dict], turn: int | None = None) -> list[dict]:
    """The canonical messages the model was sent at `turn` (default: the conversation at the end)."""
    messages: list[dict] = []
    for ev in events:
        if ev["type"] == "model" and turn is not None and ev["turn"] >= turn:
            break
        if ev["type"] == "message":
            if ev["index"] != len(messages):
                raise ValueError(f"message event {ev['index']} out of order (expected {len(messages)})")
            messages.append(ev["message"])
        elif ev["type"] == "edit":
            if turn is not None and ev["turn"] > turn:
                break
            for edit in ev["edits"]:
                messages[edit["index"]] = edit["message"]
    return messages


class ReplayClient:
    """A model client that returns the replies recorded in a trajectory, in order."""

    def __init__(self, events: list[dict]):
        start = next((ev for ev in events if ev["type"] == "start"), {})
        self._recorded_model = start.get("model")
        messages = {ev["index"]: ev["message"] for ev in events if ev["type"] == "message"}
        self._replies: list[ModelReply] = []
        for ev in events:
            if ev["type"] != "model":
                continue
            msg = messages[ev["index"]]
            errors = {c["id"]: c for c in ev.get("calls", [])}
            calls = []
            for tc in msg.get("tool_calls") or []:
                rec = errors.get(tc["id"], {})
                raw = rec.get("raw_arguments", tc["function"]["arguments"])
                args, err = parse_arguments(raw)
                err = rec.get("error") or err
                calls.append(ToolCall(tc["id"], tc["function"]["name"], raw, None if err else args, err))
            self._replies.append(ModelReply(
                content=msg.get("content") or "", tool_calls=calls, reasoning=ev.get("reasoning"),
                finish_reason=ev.get("finish_reason"), prompt_tokens=ev.get("prompt_tokens", 0),
                completion_tokens=ev.get("completion_tokens", 0), usage_estimated=ev.get("usage_estimated", False),
                text_mode=ev.get("text_mode")))
        self.calls = 0

    def describe(self) -> dict:
        return {"replay": True, "recorded_model": self._recorded_model, "replies": len(self._replies)}

    def complete(self, messages: list[dict], tools: list[dict]) -> ModelReply:
        if self.calls >= len(self._replies):
            raise ProviderError("the recorded trajectory has no more replies")
        reply = self._replies[self.calls]
        self.calls += 1
        return reply
