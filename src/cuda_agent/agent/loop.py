"""The ReAct loop: the model calls tools in an environment until it submits or a limit ends the run.

The loop talks to two protocols only: a model client (`cuda_agent.llm.ModelClient`) and an
environment (`env.Environment`: reset, step). Each turn is one model call and the tool calls of
its reply. A run ends one way (`outcome.Outcome`): terminated (submitted a correct candidate),
truncated (max_turns, context_exhausted: nothing left to compress, repeated: the same calls with
the same results again and again, or the environment's own limit), or an error of one boundary
(the provider, the judge, an interruption, a bug of the loop). Whatever the ending, the best
candidate the judge found correct during the run is returned with its verdict.

Context: the conversation's size is estimated from the server's own token counts (calibrated
characters-per-token). Near `compress_at` of the budget, old tool results and the bulky
arguments of old calls (file contents) are replaced by one-line stubs; the newest `keep_recent`
results stay whole. The model can always read a file again.

Progress: after each model reply and each tool call the loop hands an `AgentProgress` record
(turn, tool, verdict, best verdict so far, tokens) to `on_progress`, if given; drawing it is the
caller's business (`live.py` for `cuda-agent solve`).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.candidate import Candidate
from cuda_agent.judge import Verdict
from cuda_agent.llm import TOOL_BLOCK, ContextLengthError, ModelClient, ModelReply, ProviderError
from cuda_agent.reward import Reward, RewardConfig

from .env import Environment
from .outcome import (EndRun, InternalError, Interrupted, Outcome, RolloutError, Terminal, Termination, Truncation,
                      terminate, truncate)
from .tools import ToolConfig
from .trajectory import Trajectory
from .workspace import skill_text


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


@dataclass(frozen=True)
class AgentProgress:
    """Where a run stands, reported to `Agent(on_progress=...)` after each model reply ("model")
    and each tool call ("tool"). The loop draws nothing itself; a live view or a log reads these."""

    event: Literal["model", "tool"]
    task_name: str
    turn: int
    max_turns: int
    seconds: float                        # since the run started
    prompt_tokens: int                    # summed over the run's model calls
    completion_tokens: int
    context_tokens: int                   # the conversation's estimated size now
    context_budget: int
    tool: str | None = None               # event "tool": the call just made
    ok: bool | None = None                # event "tool": False when refused, failed or rejected
    verdict: Verdict | None = None        # event "tool": the judge's verdict, when the call ran the judge
    reward: Reward | None = None          # event "tool": that verdict as the environment scored it
    tool_calls: int = 0                   # event "model": the calls in the reply (0: the reply called none)
    best: Verdict | None = None           # the best correct verdict so far
    best_reward: Reward | None = None
    best_turn: int | None = None


def rank(v: Verdict, reward: Reward | None) -> tuple:
    """Order of correct verdicts: reward first (as the environment scored it), then speed-up vs
    compile, then vs eager."""
    return (reward.value if reward is not None else float("-inf"), v.speedup_vs_compile or 0.0,
            v.speedup_vs_eager or 0.0)


SYSTEM = """You are an expert {role} engineer. You work in a workspace on disk, only through the tools.
Make ModelNew in model_new.py compute exactly what Model in model.py computes, with your own kernels in \
kernels/, and make it faster than torch.compile. Take small steps: write, compile, verify, profile, \
improve. The judge's verdict is the only measure. When the workspace is correct and as fast as you can \
make it, call submit.

Every rule of the judge is in SKILL.md, reproduced here:

{skill}"""

TASK = """Task: {name}{level}. Backend: {backend}.

The reference, model.py:
```python
{source}
```

model_new.py holds a starter with the reference's constructor. Start with profile(target="reference")."""

NO_TOOL_CALL = ("Your reply called no tool. Act only through tool calls ({tools}); call submit when the "
                "workspace passes verify.")
REPEAT_WARNING = ("\n\n[note: you made the same calls with the same results {n} times in a row; repeating them "
                  "changes nothing, so try something different.]")


class Agent:
    """One run of the loop in one environment. Mini-SWE-agent's shape: a model, an environment,
    a conversation, and small exceptions for the ways a run ends."""

    def __init__(self, client: ModelClient, env: Environment, config: AgentConfig | None = None,
                 trajectory: Trajectory | None = None, stop: threading.Event | None = None,
                 on_progress: Callable[[AgentProgress], None] | None = None):
        self.client = client
        self.stop = stop  # set by another thread to end the run at the next turn
        self.on_progress = on_progress
        self.env = env
        self.config = config or AgentConfig()
        self.trajectory = trajectory or Trajectory()
        self.tools: list[dict] = []
        self.messages: list[dict] = []
        self.turn = 0      # the turn in progress
        self.replies = 0   # model replies received: the turns completed
        self.prompt_tokens = self.completion_tokens = 0
        self.best: tuple[Candidate, Verdict, Reward | None] | None = None
        self._best_turn: int | None = None
        self._task_name = ""
        self._t0 = time.monotonic()
        self._chars_per_token = 3.5
        self._last_step: str | None = None
        self._repeats = 0

    # ------------------------------------------------------------------------------ run
    def run(self) -> AgentResult:
        t0 = self._t0 = time.monotonic()
        start = self.env.reset()
        task, device, self.tools = start.task, start.device, start.tools
        self._task_name = task.name
        self.trajectory.event("start", task={"id": task.id, "name": task.name, "origin": task.origin,
                                             "level": task.level, "source": task.source},
                              device=device, agent=self.config.model_dump(mode="json"), tools=self.tools,
                              model=self.client.describe())
        backend = "CUDA on the GPU" if device == "cuda" else "CPU (C++/OpenMP kernels in kernels/*.cpp)"
        self.add({"role": "system", "content": SYSTEM.format(
            role="CUDA" if device == "cuda" else "C++ performance", skill=skill_text(device))})
        self.add({"role": "user", "content": TASK.format(
            name=task.name, level=f" (level {task.level})" if task.level else "", backend=backend,
            source=task.source.rstrip())})
        try:
            while True:
                if self.stop is not None and self.stop.is_set():
                    raise Interrupted(f"stopped from outside before turn {self.turn + 1}")
                if self.turn >= self.config.max_turns:
                    raise truncate(Truncation.MAX_TURNS, f"{self.config.max_turns} turns used")
                self.turn += 1
                self.step()
        except EndRun as end:
            outcome = end.outcome
        except (ProviderError, RolloutError) as exc:
            outcome = Outcome.failed(exc)
        except Exception as exc:  # a bug: the run still ends with a result and a complete trajectory
            outcome = Outcome.failed(InternalError("".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]))
        cand, verdict, reward = self.best or (None, None, None)
        result = AgentResult(task.id, task.name, outcome, self.replies, self.prompt_tokens,
                             self.completion_tokens, time.monotonic() - t0, cand, verdict, reward)
        self.trajectory.event("end", **result.summary())
        return result

    def step(self) -> None:
        reply = self.query()
        message = reply.message()
        for call, wire in zip(reply.tool_calls, message.get("tool_calls", [])):
            if call.error:  # servers re-parse the arguments of earlier calls: keep the history valid
                wire["function"]["arguments"] = "{}"
        self.trajectory.event("model", turn=self.turn, index=len(self.messages),
                              prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                              usage_estimated=reply.usage_estimated, latency_s=round(reply.latency_s, 3),
                              attempts=reply.attempts, finish_reason=reply.finish_reason, reasoning=reply.reasoning,
                              text_mode=reply.text_mode,
                              calls=[{"id": c.id, "raw_arguments": c.raw_arguments, "error": c.error}
                                     for c in reply.tool_calls if c.error])
        self.add(message)
        self.report("model", tool_calls=len(reply.tool_calls))
        if not reply.tool_calls:
            text = NO_TOOL_CALL.format(tools=", ".join(t["function"]["name"] for t in self.tools))
            if reply.finish_reason == "length":
                text = "Your reply was cut off at the token limit. " + text
            self.add({"role": "user", "content": text})
            self.note_step(json.dumps(["<no tool call>", reply.content]), text)
            return
        results = []
        for call in reply.tool_calls:
            t0 = time.monotonic()
            if call.error and reply.finish_reason == "length":
                call = dataclasses.replace(call, error=f"{call.error} (your reply was cut off at the token limit)")
            res = self.env.step(call)
            self.add({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": res.observation})
            self.trajectory.event("tool", turn=self.turn, call_id=call.id, name=call.name,
                                  arguments=call.raw_arguments, observation=res.observation, ok=res.ok,
                                  seconds=round(time.monotonic() - t0, 3), submitted=res.terminated,
                                  truncated=res.truncated,
                                  verdict=res.verdict.model_dump(mode="json") if res.verdict else None)
            results.append(res.observation)
            if res.verdict is not None and res.verdict.correct and res.candidate is not None:
                if self.best is None or rank(res.verdict, res.reward) > rank(self.best[1], self.best[2]):
                    self.best = (res.candidate, res.verdict, res.reward)
                    self._best_turn = self.turn
            self.report("tool", tool=call.name or None, ok=res.ok, verdict=res.verdict, reward=res.reward)
            if res.terminated:
                raise terminate(Terminal.SUBMITTED, "submitted a correct candidate")
            if res.truncated:
                raise truncate(Truncation.ENVIRONMENT, f"the environment ended the run after {call.name}")
        self.note_step(json.dumps([[c.name, c.raw_arguments] for c in reply.tool_calls]), "\n".join(results))

    def note_step(self, action: str, result: str) -> None:
        """Count identical consecutive steps (same calls, same results); warn, then end the run."""
        key = json.dumps([action, result])
        self._repeats = self._repeats + 1 if key == self._last_step else 1
        self._last_step = key
        if self._repeats >= self.config.repeat_limit:
            raise truncate(Truncation.REPEATED, f"the same step {self._repeats} times in a row")
        if self._repeats >= self.config.repeat_warn:
            last = self.messages[-1]
            self.messages[-1] = {**last, "content": last["content"] + REPEAT_WARNING.format(n=self._repeats)}
            self.trajectory.event("edit", turn=self.turn, reason="repeat warning",
                                  edits=[{"index": len(self.messages) - 1, "message": self.messages[-1]}])

    def report(self, event: Literal["model", "tool"], **fields) -> None:
        """Tell `on_progress` where the run stands. A view that fails (a closed terminal) is
        dropped for the rest of the run, with a note in the trajectory: it must not end the run."""
        if self.on_progress is None:
            return
        progress = AgentProgress(event=event, task_name=self._task_name, turn=self.turn,
                                 max_turns=self.config.max_turns, seconds=time.monotonic() - self._t0,
                                 prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                                 context_tokens=self.context_tokens(), context_budget=self.config.context_tokens,
                                 best=self.best[1] if self.best else None, best_reward=self.best[2] if self.best else None,
                                 best_turn=self._best_turn, **fields)
        try:
            self.on_progress(progress)
        except Exception as exc:
            self.on_progress = None
            self.trajectory.event("note", turn=self.turn, text=f"progress view dropped: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------------------ model
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
        cfg = self.config
        if self.context_tokens() + cfg.reply_tokens > cfg.compress_at * cfg.context_tokens:
            self.compress()
        used = self.context_tokens()
        if used + cfg.reply_tokens > cfg.context_tokens:
            raise truncate(Truncation.CONTEXT_EXHAUSTED,
                             f"~{used} tokens of context in use, {cfg.context_tokens} available")

    def compress(self) -> bool:
        """Replace old tool results and old bulky call arguments with stubs; False if nothing changed."""
        tool_indices = [i for i, m in enumerate(self.messages) if m["role"] == "tool"]
        recent = tool_indices[-self.config.keep_recent:]
        cutoff = recent[0] if recent else len(self.messages)
        before = self.context_tokens()
        edits = []
        for i in range(2, cutoff):  # the system prompt and the task stay whole
            new = _compressed(self.messages[i])
            if new is not None:
                self.messages[i] = new
                edits.append({"index": i, "message": new})
        if edits:
            self.trajectory.event("edit", turn=self.turn, reason="compress", tokens_before=before, edits=edits)
        return bool(edits)


_STUB = "[compressed]"


def _compressed(msg: dict) -> dict | None:
    """A shorter version of an old message, or None if it is short already."""
    if msg["role"] == "tool":
        text = msg["content"]
        if len(text) <= 300 or text.startswith(_STUB):
            return None
        first = text.strip().splitlines()[0][:160] if text.strip() else ""
        return {**msg, "content": f"{_STUB} old result of {msg.get('name', 'a tool')} ({len(text)} characters), "
                                  f"began: {first}"}
    if msg["role"] == "assistant":
        calls, changed = [], False
        for call in msg.get("tool_calls") or []:
            raw = call["function"]["arguments"]
            if len(raw) > 400:
                try:
                    args = json.loads(raw)
                except json.JSONDecodeError:
                    args = None
                if isinstance(args, dict):
                    args = {k: (f"{_STUB} {len(v)} characters" if isinstance(v, str) and len(v) > 200 else v)
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
            content, changed = content[:600] + f" {_STUB} {len(content) - 600} more characters", True
        if not changed:
            return None
        new = {**msg, "content": content}
        if calls:
            new["tool_calls"] = calls
        return new
    return None
