"""Episodes token-in/token-out: the framework-neutral core of every training stage.

An episode drives the agent's own environment (`cuda_agent.agent.env.Environment`: the workspace
tools and the judge behind them) with a policy that sees and emits token ids, never text that is
tokenised again:

    prompt_ids        the chat template over the system prompt, the task and the tool schemas
    response_ids      every token after the prompt: the model's turns and the observations between them
    response_mask     1 on the model's tokens, 0 on observation tokens (tool results, the chat
                      template's turn markers around them): losses and GAE use 1-tokens only
    response_logprobs the sampling log-probability of each model token (0.0 where the mask is 0)

Each turn the policy generates from all tokens so far; its reply is decoded once, its hermes
`<tool_call>` blocks are parsed (a malformed block is an observation that says what is wrong, as
in the agent loop), the calls run in the environment, and the observation turn is rendered by the
tokenizer's chat template as the text between the model's turn and the next generation prompt, so
the model's tokens are never duplicated or re-tokenised. Limits and endings are the agent loop's
(`Truncation`: max_turns, context_exhausted for the token budget, repeated; `Terminal.SUBMITTED`).

The reward is the judge's milestone reward (`cuda_agent.reward.reward_of`) of the submitted
candidate, else of the best correct one, else of the last judged one; an episode that judged
nothing has its final workspace judged once, and a workspace that is no candidate earns the
`fail` reward. Every episode is an `EpisodeRecord`, one JSON line: the input of every later stage.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.agent.env import Environment, StepResult
from cuda_agent.agent.loop import NO_TOOL_CALL, SYSTEM, TASK, rank
from cuda_agent.agent.outcome import Outcome, Terminal, Truncation
from cuda_agent.agent.workspace import skill_text
from cuda_agent.candidate import Candidate, CandidateError
from cuda_agent.judge import FailureCategory, Verdict
from cuda_agent.llm import TOOL_BLOCK, ToolCall, parse_text_tool_calls
from cuda_agent.reward import RewardConfig, reward_of
from cuda_agent.tasks import Task

Mode = Literal["single_turn", "agentic"]

# Verdict failures that mean the candidate tried to game the judge; such episodes never become
# training data for RFT, whatever their reward.
HACK_CATEGORIES = frozenset({FailureCategory.TAMPERING, FailureCategory.TIMING})


class EpisodeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(150, ge=1, description="model turns per episode (CUDA Agent: 150 in training)")
    context_tokens: int = Field(131_072, ge=64, description="prompt + response tokens of an episode (128k)")
    turn_tokens: int = Field(8192, ge=1, description="longest single model turn in tokens")
    repeat_limit: int = Field(6, ge=2, description="identical consecutive steps (calls and results) that end it")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (logprobs are of this distribution)")
    keep_workspace: bool = Field(False, description="keep each episode's workspace folder after it ends")


class Generation(BaseModel):
    """One model turn: the sampled token ids and their log-probabilities."""

    token_ids: list[int]
    logprobs: list[float]
    finish: Literal["stop", "length"]


class TokenPolicy(Protocol):
    """What an episode needs of a model: tokens in, tokens and logprobs out. `stop` ends the turn
    (it is included in the returned ids)."""

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float) -> Generation: ...


class EpisodeRecord(BaseModel):
    """One episode as stored (JSON line) and as every training stage reads it."""

    model_config = ConfigDict(extra="ignore")

    id: str
    task_id: str
    task_name: str
    mode: Mode
    step: int = 0
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    messages: list[dict]
    tools: list[dict] = Field(default_factory=list)
    turns: int = 0
    outcome: dict = Field(default_factory=dict)   # Outcome.record()
    termination: str = ""
    reward: float
    reward_reason: str
    verdict: dict | None = None                   # the rewarded verdict's summary
    verdicts: list[dict] = Field(default_factory=list)   # every verdict of the episode, in order
    malformed_calls: int = 0
    no_call_turns: int = 0
    hacking: bool = False
    generate_s: float = 0.0
    tool_s: float = 0.0
    judge_s: float = 0.0

    @property
    def model_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def correct(self) -> bool:
        return bool(self.verdict and self.verdict.get("correct"))


def verdict_summary(v: Verdict, reward: float, reason: str) -> dict:
    return {"candidate_hash": v.candidate_hash, "compiled": v.compiled, "correct": v.correct,
            "failure": None if v.failure is None else v.failure.category.value,
            "message": None if v.failure is None else v.failure.message[:500],
            "policy_violations": v.policy_violations[:5], "runtime_ms": v.runtime_ms, "eager_ms": v.eager_ms,
            "compile_ms": v.compile_ms, "speedup_vs_eager": v.speedup_vs_eager,
            "speedup_vs_compile": v.speedup_vs_compile, "judge_s": v.judge_s, "reward": reward,
            "reward_reason": reason}


def is_hack(v: Verdict) -> bool:
    return v.failure is not None and v.failure.category in HACK_CATEGORIES


# ---------------------------------------------------------------------------------------------
# Rendering with the tokenizer's chat template

_SENTINEL = "\u2063ASSISTANT-TURN-7f3c\u2063"


class ChatRenderer:
    """Token ids of a conversation's pieces through a Hugging Face tokenizer's chat template."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.eos_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.eos_token or ""
        base = self._base()
        text = self.tok.apply_chat_template(base, tokenize=False)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ValueError("the chat template does not render assistant content verbatim")
        self._prefix = text
        self.close = text[at + len(_SENTINEL):]   # what ends an assistant turn, e.g. "<|im_end|>\n"

    @staticmethod
    def _base() -> list[dict]:
        return [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": _SENTINEL}]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        text = self.tok.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)
        return self.encode(text)

    def observation_ids(self, new_messages: list[dict], turn_closed: bool) -> list[int]:
        """Tokens between the end of the model's turn and the next generation prompt: the rest of
        the turn's closing (all of it when the turn was cut at the token limit), the new
        tool/user messages and the generation prompt."""
        full = self.tok.apply_chat_template(self._base() + new_messages, tokenize=False, add_generation_prompt=True)
        if not full.startswith(self._prefix):
            raise ValueError("the chat template renders earlier turns differently once later ones follow")
        close = self.close
        if turn_closed and self.eos_text and close.startswith(self.eos_text):
            close = close[len(self.eos_text):]
        return self.encode(close + full[len(self._prefix):])


# ---------------------------------------------------------------------------------------------
# Prompts

SINGLE_TURN = """Task: {name}. Backend: {backend}.

Write ModelNew: the same constructor, parameters and outputs as Model below, computed by your own \
{kind} kernel built with torch.utils.cpp_extension.load_inline. Reply with the whole module in one \
```python block.

```python
{source}
```"""

_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def single_turn_messages(task: Task, device: str) -> list[dict]:
    backend = "CUDA on the GPU" if device == "cuda" else "CPU (C++/OpenMP)"
    return [{"role": "system", "content": SYSTEM.format(role="CUDA" if device == "cuda" else "C++ performance",
                                                        skill=skill_text(device))},
            {"role": "user", "content": SINGLE_TURN.format(name=task.name, backend=backend,
                                                           kind="CUDA" if device == "cuda" else "C++",
                                                           source=task.source.rstrip())}]


def agentic_messages(task: Task, device: str) -> list[dict]:
    backend = "CUDA on the GPU" if device == "cuda" else "CPU (C++/OpenMP kernels in kernels/*.cpp)"
    return [{"role": "system", "content": SYSTEM.format(role="CUDA" if device == "cuda" else "C++ performance",
                                                        skill=skill_text(device))},
            {"role": "user", "content": TASK.format(name=task.name, level=f" (level {task.level})" if task.level else "",
                                                    backend=backend, source=task.source.rstrip())}]


def extract_module(text: str) -> str | None:
    """The last fenced Python block of a reply that defines ModelNew, or None."""
    blocks = [b for b in _CODE_BLOCK.findall(text) if "ModelNew" in b]
    return blocks[-1] if blocks else None


# ---------------------------------------------------------------------------------------------
# Running an episode


class Judged(Protocol):
    """The judge as a single-turn episode needs it (JudgeGate and PoolGate are this)."""

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict: ...


@dataclass
class _Tokens:
    prompt: list[int]
    ids: list[int]
    mask: list[int]
    logprobs: list[float]

    def model(self, gen: Generation) -> None:
        self.ids += gen.token_ids
        self.mask += [1] * len(gen.token_ids)
        self.logprobs += gen.logprobs

    def observation(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    @property
    def total(self) -> int:
        return len(self.prompt) + len(self.ids)


class _Rewarder:
    """Chooses the rewarded verdict as the agent loop chooses its best candidate."""

    def __init__(self, config: RewardConfig):
        self.config = config
        self.verdicts: list[Verdict] = []
        self.submitted: Verdict | None = None

    def add(self, v: Verdict) -> None:
        self.verdicts.append(v)

    def choose(self) -> Verdict | None:
        if self.submitted is not None:
            return self.submitted
        correct = [v for v in self.verdicts if v.correct]
        if correct:
            return max(correct, key=lambda v: rank(v, reward_of(v, self.config)))
        return self.verdicts[-1] if self.verdicts else None

    def summaries(self) -> list[dict]:
        out = []
        for v in self.verdicts:
            r = reward_of(v, self.config)
            out.append(verdict_summary(v, r.value, r.reason))
        return out


def _assistant_message(text: str, calls: list[ToolCall]) -> dict:
    """The canonical assistant message (as the agent loop keeps it): well-formed calls structured,
    the prose without the hermes blocks; a malformed block stays in the text as written."""
    good = [c for c in calls if not c.error]
    content = TOOL_BLOCK.sub("", text).strip() if good and len(good) == len(calls) else text
    msg: dict = {"role": "assistant", "content": content}
    if good and len(good) == len(calls):
        msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments}}
                             for c in good]
    return msg


def run_agentic_episode(task: Task, env: Environment, policy: TokenPolicy, renderer: ChatRenderer,
                        config: EpisodeConfig = EpisodeConfig(), reward: RewardConfig = RewardConfig(),
                        *, step: int = 0, episode_id: str | None = None) -> EpisodeRecord:
    """One multi-turn episode of the agent in `env`. Never raises for what the model does; a judge
    that cannot work (`JudgeFailure`) propagates, since the episode then measures nothing."""
    start = env.reset()
    tools = start.tools
    messages = agentic_messages(task, start.device)
    tokens = _Tokens(renderer.prompt_ids(messages, tools), [], [], [])
    rewarder = _Rewarder(reward)
    gen_s = tool_s = judge_s = 0.0
    malformed = no_call = repeats = turns = 0
    last_step: str | None = None
    outcome: Outcome | None = None
    while outcome is None:
        if turns >= config.max_turns:
            outcome = Outcome(truncated=Truncation.MAX_TURNS, message=f"{config.max_turns} turns used")
            break
        room = config.context_tokens - tokens.total
        if room <= 0:
            outcome = Outcome(truncated=Truncation.CONTEXT_EXHAUSTED, message=f"{config.context_tokens} tokens used")
            break
        t0 = time.monotonic()
        gen = policy.generate(tokens.prompt + tokens.ids, min(config.turn_tokens, room), config.temperature)
        gen_s += time.monotonic() - t0
        turns += 1
        tokens.model(gen)
        closed = gen.finish == "stop" and bool(gen.token_ids) and gen.token_ids[-1] == renderer.eos_id
        body = gen.token_ids[:-1] if closed else gen.token_ids
        text = renderer.decode(body)
        calls = parse_text_tool_calls(text)
        malformed += sum(1 for c in calls if c.error)
        messages.append(_assistant_message(text, calls))
        new: list[dict] = []
        results: list[str] = []
        if not calls:
            no_call += 1
            note = NO_TOOL_CALL.format(tools=", ".join(t["function"]["name"] for t in tools))
            if gen.finish == "length":
                note = "Your reply was cut off at the token limit. " + note
            new.append({"role": "user", "content": note})
            results.append(note)
        for call in calls:
            t0 = time.monotonic()
            res: StepResult = env.step(call)
            took = time.monotonic() - t0
            if res.verdict is not None:
                judge_s += took
                rewarder.add(res.verdict)
            else:
                tool_s += took
            new.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": res.observation})
            results.append(res.observation)
            if res.terminated and res.verdict is not None:
                rewarder.submitted = res.verdict
                outcome = Outcome(terminated=Terminal.SUBMITTED, message="submitted a correct candidate")
                break
            if res.truncated:
                outcome = Outcome(truncated=Truncation.ENVIRONMENT, message=f"the environment ended the episode after {call.name}")
                break
        messages.extend(new)
        if outcome is not None:
            break   # the last turn's observation is not part of the sequence: nothing follows it
        key = json.dumps([[[c.name, c.raw_arguments] for c in calls] or text, results])
        repeats = repeats + 1 if key == last_step else 1
        last_step = key
        if repeats >= config.repeat_limit:
            outcome = Outcome(truncated=Truncation.REPEATED, message=f"the same step {repeats} times in a row")
            break
        obs = renderer.observation_ids(new, closed)
        room = config.context_tokens - tokens.total
        if len(obs) >= room:   # no room for the observation and a reply: the budget ends it here
            outcome = Outcome(truncated=Truncation.CONTEXT_EXHAUSTED,
                              message=f"~{tokens.total + len(obs)} tokens needed, {config.context_tokens} available")
            break
        tokens.observation(obs)
    chosen = rewarder.choose()
    if chosen is None:   # nothing judged during the episode: the final workspace is judged once
        t0 = time.monotonic()
        res = env.step(ToolCall(f"final_{uuid.uuid4().hex[:8]}", "verify", "{}", {}))
        judge_s += time.monotonic() - t0
        if res.verdict is not None:
            rewarder.add(res.verdict)
            chosen = res.verdict
    return _record(task, "agentic", step, episode_id, tokens, messages, tools, turns, outcome, rewarder, chosen,
                   malformed, no_call, gen_s, tool_s, judge_s)


def run_single_turn_episode(task: Task, judge: Judged, device: str, policy: TokenPolicy, renderer: ChatRenderer,
                            config: EpisodeConfig = EpisodeConfig(), reward: RewardConfig = RewardConfig(),
                            *, step: int = 0, episode_id: str | None = None) -> EpisodeRecord:
    """The warm-up episode: one reply holding a whole single-file ModelNew, judged."""
    messages = single_turn_messages(task, device)
    tokens = _Tokens(renderer.prompt_ids(messages, None), [], [], [])
    room = max(config.context_tokens - tokens.total, 1)
    t0 = time.monotonic()
    gen = policy.generate(tokens.prompt, min(config.turn_tokens, room), config.temperature)
    gen_s = time.monotonic() - t0
    tokens.model(gen)
    closed = gen.finish == "stop" and bool(gen.token_ids) and gen.token_ids[-1] == renderer.eos_id
    text = renderer.decode(gen.token_ids[:-1] if closed else gen.token_ids)
    messages.append({"role": "assistant", "content": text})
    rewarder = _Rewarder(reward)
    judge_s = 0.0
    module = extract_module(text)
    why = "the reply holds no ```python block defining ModelNew"
    if module is not None:
        try:
            cand = Candidate.from_source(module)
        except CandidateError as exc:
            why = f"not a candidate: {exc}"
        else:
            t0 = time.monotonic()
            rewarder.add(judge.evaluate(task, cand))
            judge_s = time.monotonic() - t0
    chosen = rewarder.choose()
    outcome = (Outcome(terminated=Terminal.SUBMITTED, message="one reply judged") if chosen is not None
               else Outcome(truncated=Truncation.ENVIRONMENT, message=why))
    return _record(task, "single_turn", step, episode_id, tokens, messages, [], 1, outcome, rewarder, chosen,
                   0, 0, gen_s, 0.0, judge_s, no_candidate=why)


def _record(task: Task, mode: Mode, step: int, episode_id: str | None, tokens: _Tokens, messages: list[dict],
            tools: list[dict], turns: int, outcome: Outcome, rewarder: _Rewarder, chosen: Verdict | None,
            malformed: int, no_call: int, gen_s: float, tool_s: float, judge_s: float,
            no_candidate: str = "the workspace never became a candidate") -> EpisodeRecord:
    if chosen is not None:
        r = reward_of(chosen, rewarder.config)
        value, reason, summary = r.value, r.reason, verdict_summary(chosen, r.value, r.reason)
    else:
        value, reason, summary = rewarder.config.fail, no_candidate, None
    return EpisodeRecord(
        id=episode_id or uuid.uuid4().hex[:16], task_id=task.id, task_name=task.name, mode=mode, step=step,
        prompt_ids=tokens.prompt, response_ids=tokens.ids, response_mask=tokens.mask,
        response_logprobs=tokens.logprobs, messages=messages, tools=tools, turns=turns, outcome=outcome.record(),
        termination=outcome.termination.value, reward=value, reward_reason=reason, verdict=summary,
        verdicts=rewarder.summaries(), malformed_calls=malformed, no_call_turns=no_call,
        hacking=any(is_hack(v) for v in rewarder.verdicts), generate_s=round(gen_s, 4), tool_s=round(tool_s, 4),
        judge_s=round(judge_s, 4))
