"""The episode engine: ONE loop for `cuda-agent solve`/`run` and for every training stage.

A model front (`front.ModelFront`: the chat front over an OpenAI-compatible client, or the token
front over a token policy) produces model turns; the engine runs each turn's tool calls in an
environment (`env.Environment`) and owns everything else, in one place:

- limits: `max_turns` (checked after a turn's tools ran, so the last turn's submit still counts);
  the context budget is the front's (it alone knows its tokens) and ends a run by `EndRun`;
- repetition: one key per step (the calls, or the text of a reply that called none, and the
  observations); the model is warned from `repeat_warn` identical steps on, the run ends at
  `repeat_limit`;
- endings: exactly one `Outcome` (terminated / truncated / a typed error per boundary); a bad
  rollout is data, so errors become outcomes (the exception is kept for callers that re-raise);
- the episode's verdict: the submitted one, else the best correct one by `rank`, else the last
  one judged; if nothing was judged and `judge_at_end` is set, the final workspace is judged once
  through the environment (`verify`);
- the reward: `StepResult.reward`, scored by the environment with its RewardConfig, the same
  number the observation text showed the model. The engine never scores a verdict again.

Observations reach the front as messages (`front.observe`); the token front renders them only
when the next turn is generated, so every episode ends on a model token however it ends.

Progress: after each model reply and each tool call the engine hands an `AgentProgress` record to
`on_progress`, if given (the live view of `solve`); trajectory events go to `trajectory`, if given.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cuda_agent.candidate import Candidate
from cuda_agent.judge import Verdict
from cuda_agent.llm import ProviderError, ToolCall
from cuda_agent.reward import Reward

from .env import Environment, Reset, StepResult
from .front import EventSink, ModelFront, ModelTurn, NoEvents
from .outcome import EndRun, InternalError, Interrupted, Outcome, RolloutError, Terminal, Truncation, terminate, truncate
from .prompts import CUT_OFF, NO_TOOL_CALL, REPEAT_WARNING, agentic_messages


@dataclass(frozen=True)
class EngineConfig:
    max_turns: int = 150          # model turns per episode
    repeat_warn: int = 3          # identical consecutive steps before the model is warned
    repeat_limit: int = 6         # identical consecutive steps that end the episode
    judge_at_end: bool = False    # nothing judged: judge the final workspace once (training needs a reward)

    def __post_init__(self):
        if self.max_turns < 1 or self.repeat_warn < 2 or self.repeat_limit < 2:
            raise ValueError(f"max_turns >= 1, repeat_warn >= 2 and repeat_limit >= 2 are required: {self}")


@dataclass(frozen=True)
class Judged:
    """One verdict of an episode, as the environment scored it."""

    verdict: Verdict
    candidate: Candidate | None
    reward: Reward
    turn: int                     # the model turn whose call ran the judge (0: the final judgement)


def rank(v: Verdict, reward: Reward | None) -> tuple:
    """Order of correct verdicts: reward first (as the environment scored it), then speed-up vs
    compile, then vs eager."""
    return (reward.value if reward is not None else float("-inf"), v.speedup_vs_compile or 0.0,
            v.speedup_vs_eager or 0.0)


@dataclass
class EpisodeResult:
    """What one run of the engine produced; the fronts turn it into their records."""

    task_id: str
    task_name: str
    device: str
    tools: list[dict]
    outcome: Outcome
    turns: int                            # model replies received
    seconds: float
    judged: list[Judged]                  # every verdict, in order
    best: Judged | None                   # the best correct verdict (with its candidate)
    chosen: Judged | None                 # the episode's verdict (submitted, else best, else last)
    reward: float                         # chosen's reward, or the environment's `fail` without one
    reward_reason: str
    malformed_calls: int = 0
    no_call_turns: int = 0
    generate_s: float = 0.0
    tool_s: float = 0.0
    judge_s: float = 0.0
    error: BaseException | None = None    # the exception behind an error outcome


@dataclass(frozen=True)
class AgentProgress:
    """Where a run stands, reported to `on_progress` after each model reply ("model") and each
    tool call ("tool"). The engine draws nothing itself; a live view or a log reads these."""

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


@dataclass
class _Clock:
    generate_s: float = 0.0
    tool_s: float = 0.0
    judge_s: float = 0.0


@dataclass
class _Repeats:
    last: str | None = None      # the previous step's key
    count: int = 0               # identical consecutive steps so far


class Engine:
    """One episode of `front` in `env`. `stop`, set by another thread, ends the run before its
    next turn (Interrupted)."""

    def __init__(self, env: Environment, front: ModelFront, config: EngineConfig = EngineConfig(), *,
                 trajectory: EventSink | None = None, stop: threading.Event | None = None,
                 on_progress: Callable[[AgentProgress], None] | None = None):
        self.env, self.front, self.config = env, front, config
        self.trajectory = trajectory or NoEvents()
        self.stop, self.on_progress = stop, on_progress
        self.turn = 0
        self.judged: list[Judged] = []
        self.best: Judged | None = None
        self.submitted: Judged | None = None
        self.malformed = self.no_call = 0
        self._repeats = _Repeats()
        self._clock = _Clock()
        self._task_name = ""
        self._t0 = time.monotonic()

    # ------------------------------------------------------------------------------ run
    def run(self) -> EpisodeResult:
        self._t0 = time.monotonic()
        start: Reset = self.env.reset()
        self._task_name = start.task.name
        error: BaseException | None = None
        try:
            self.front.begin(start, agentic_messages(start.task, start.device))
            while True:
                self._turn()
        except EndRun as end:
            outcome = end.outcome
        except (ProviderError, RolloutError) as exc:
            outcome, error = Outcome.failed(exc), exc
        except Exception as exc:  # a bug: the run still ends with a result (and a complete trajectory)
            outcome, error = Outcome.failed(InternalError("".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:])), exc
        if not self.judged and self.config.judge_at_end and error is None:
            try:
                self._judge_final()
            except RolloutError as exc:
                outcome, error = Outcome.failed(exc), exc
        self.front.end()
        return self._result(start, outcome, error)

    def _turn(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise Interrupted(f"stopped from outside before turn {self.turn + 1}")
        self.turn += 1
        t0 = time.monotonic()
        reply = self.front.reply(self.turn)
        self._clock.generate_s += time.monotonic() - t0
        self.malformed += sum(1 for c in reply.calls if c.error)
        self.report("model", tool_calls=len(reply.calls))
        results: list[str] = []
        if not reply.calls:
            self.no_call += 1
            text = NO_TOOL_CALL.format(tools=", ".join(t["function"]["name"] for t in self.front.tools))
            text = CUT_OFF + text if reply.cut else text
            self.front.observe({"role": "user", "content": text}, self.turn)
            results.append(text)
        for call in reply.calls:
            results.append(self._call(call, reply))
        self._note_step(reply, results)
        if self.turn >= self.config.max_turns:
            raise truncate(Truncation.MAX_TURNS, f"{self.config.max_turns} turns used")

    def _call(self, call: ToolCall, reply: ModelTurn) -> str:
        """Run one tool call; ends the run (EndRun) when the environment says so."""
        if call.error and reply.cut:
            call = dataclasses.replace(call, error=f"{call.error} (your reply was cut off at the token limit)")
        t0 = time.monotonic()
        res = self.env.step(call)
        took = time.monotonic() - t0
        if res.verdict is not None:
            self._clock.judge_s += took
            judged = self._judged(res, self.turn)
            if res.terminated:
                self.submitted = judged
        else:
            self._clock.tool_s += took
        self.front.observe({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": res.observation},
                           self.turn)
        self.trajectory.event("tool", turn=self.turn, call_id=call.id, name=call.name, arguments=call.raw_arguments,
                              observation=res.observation, ok=res.ok, seconds=round(took, 3),
                              submitted=res.terminated, truncated=res.truncated,
                              verdict=res.verdict.model_dump(mode="json") if res.verdict else None)
        self.report("tool", tool=call.name or None, ok=res.ok, verdict=res.verdict, reward=res.reward)
        if res.terminated:
            raise terminate(Terminal.SUBMITTED, "submitted a correct candidate")
        if res.truncated:
            raise truncate(Truncation.ENVIRONMENT, f"the environment ended the run after {call.name}")
        return res.observation

    def _note_step(self, reply: ModelTurn, results: list[str]) -> None:
        """Count identical consecutive steps (same calls, or same call-less text, and same results);
        warn the model from `repeat_warn` on, end the run at `repeat_limit`."""
        action = [[c.name, c.raw_arguments] for c in reply.calls] or ["<no tool call>", reply.text]
        key = json.dumps([action, results])
        r = self._repeats
        r.count = r.count + 1 if key == r.last else 1
        r.last = key
        if r.count >= self.config.repeat_limit:
            raise truncate(Truncation.REPEATED, f"the same step {r.count} times in a row")
        if r.count >= self.config.repeat_warn:
            self.front.annotate(REPEAT_WARNING.format(n=r.count), self.turn, reason="repeat warning")

    # ------------------------------------------------------------------------------ verdicts
    def _judged(self, res: StepResult, turn: int) -> Judged:
        if res.reward is None:   # the environment scores; a verdict it did not score is its bug
            raise InternalError("the environment returned a verdict without its reward (StepResult.reward)")
        j = Judged(res.verdict, res.candidate, res.reward, turn)
        self.judged.append(j)
        if j.verdict.correct and j.candidate is not None:
            if self.best is None or rank(j.verdict, j.reward) > rank(self.best.verdict, self.best.reward):
                self.best = j
        return j

    def _judge_final(self) -> None:
        """Nothing was judged during the episode: judge the final workspace once (a workspace that
        is no candidate yields no verdict, and the episode gets the environment's `fail`)."""
        t0 = time.monotonic()
        res = self.env.step(ToolCall(f"final_{uuid.uuid4().hex[:8]}", "verify", "{}", {}))
        self._clock.judge_s += time.monotonic() - t0
        if res.verdict is not None:
            self._judged(res, 0)

    def _result(self, start: Reset, outcome: Outcome, error: BaseException | None) -> EpisodeResult:
        chosen = self.submitted or self.best or (self.judged[-1] if self.judged else None)
        if chosen is not None:
            value, reason = chosen.reward.value, chosen.reward.reason
        else:
            value, reason = start.reward.fail, "the workspace never became a candidate"
        return EpisodeResult(
            task_id=start.task.id, task_name=start.task.name, device=start.device, tools=start.tools, outcome=outcome,
            turns=self.front.replies, seconds=time.monotonic() - self._t0, judged=list(self.judged), best=self.best,
            chosen=chosen, reward=value, reward_reason=reason, malformed_calls=self.malformed,
            no_call_turns=self.no_call, generate_s=self._clock.generate_s, tool_s=self._clock.tool_s,
            judge_s=self._clock.judge_s, error=error)

    # ------------------------------------------------------------------------------ progress
    def report(self, event: Literal["model", "tool"], **fields) -> None:
        """Tell `on_progress` where the run stands. A view that fails (a closed terminal) is
        dropped for the rest of the run, with a note in the trajectory: it must not end the run."""
        if self.on_progress is None:
            return
        use = self.front.usage()
        best = self.best
        progress = AgentProgress(event=event, task_name=self._task_name, turn=self.turn,
                                 max_turns=self.config.max_turns, seconds=time.monotonic() - self._t0,
                                 prompt_tokens=use.prompt_tokens, completion_tokens=use.completion_tokens,
                                 context_tokens=use.context_tokens, context_budget=use.context_budget,
                                 best=best.verdict if best else None, best_reward=best.reward if best else None,
                                 best_turn=best.turn if best else None, **fields)
        try:
            self.on_progress(progress)
        except Exception as exc:
            self.on_progress = None
            self.trajectory.event("note", turn=self.turn, text=f"progress view dropped: {type(exc).__name__}: {exc}")
