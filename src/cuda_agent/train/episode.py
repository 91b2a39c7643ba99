"""Training episodes: the episode engine (`cuda_agent.rollout`) with the token front, as records.

An agentic episode is `rollout.engine.Engine` driving the agent's own environment (the workspace
`Toolbox` and the judge behind it) with `rollout.tokens.TokenFront`: a policy that sees and emits
token ids, with the response mask (1 on model tokens, 0 on observations) and the sampling logprobs
(see rollout/tokens.py). Limits, repetition, endings, the episode's verdict and its reward are the
engine's, the same as for `cuda-agent solve`: the reward is the one the environment scored (its
RewardConfig must be the run's, `Toolbox(..., reward=cfg.reward)`), the number the model read in
the observation. Every episode ends on a model token.

The single-turn warm-up episode is one generation through the same token front; its module is
judged through the same `Evaluator` protocol and scored once with the run's RewardConfig.

Every episode is an `EpisodeRecord`, one JSON line: the input of every later stage.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.candidate import Candidate, CandidateError
from cuda_agent.judge import FailureCategory, Verdict
from cuda_agent.reward import RewardConfig, reward_of
from cuda_agent.rollout.engine import Engine, EngineConfig, EpisodeResult, Judged
from cuda_agent.rollout.env import Environment
from cuda_agent.rollout.evaluator import Evaluator, candidate_verdict
from cuda_agent.rollout.outcome import EndRun, JudgeFailure, Outcome, Terminal, Truncation
from cuda_agent.rollout.prompts import agentic_messages, extract_module, single_turn_messages
from cuda_agent.rollout.tokens import ChatRenderer, Generation, TokenFront, TokenLimits, TokenPolicy, Tokens
from cuda_agent.tasks import Task

# the token front's names, where training code has always imported them from
__all__ = ["ChatRenderer", "EpisodeConfig", "EpisodeRecord", "Generation", "TokenPolicy", "agentic_messages",
           "extract_module", "is_hack", "run_agentic_episode", "run_single_turn_episode", "single_turn_messages",
           "verdict_summary"]

Mode = Literal["single_turn", "agentic"]

# Verdict failures that mean the candidate tried to game the judge; such episodes never become
# training data for RFT, whatever their reward.
HACK_CATEGORIES = frozenset({FailureCategory.TAMPERING, FailureCategory.TIMING})


class EpisodeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(150, ge=1, description="model turns per episode (CUDA Agent: 150 in training)")
    context_tokens: int = Field(131_072, ge=64, description="prompt + response tokens of an episode (128k)")
    response_tokens: int | None = Field(None, ge=1, description="response tokens (model and observations, prompt "
                                        "excluded) of an episode; verl's response_length. None: no own bound")
    turn_tokens: int = Field(8192, ge=1, description="longest single model turn in tokens")
    repeat_warn: int = Field(3, ge=2, description="identical consecutive steps before the model is warned")
    repeat_limit: int = Field(6, ge=2, description="identical consecutive steps (calls and results) that end it")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (logprobs are of this distribution)")
    keep_workspace: bool = Field(False, description="keep each episode's workspace folder after it ends")

    def limits(self) -> TokenLimits:
        return TokenLimits(context_tokens=self.context_tokens, turn_tokens=self.turn_tokens,
                           temperature=self.temperature, response_tokens=self.response_tokens)


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


def run_agentic_episode(task: Task, env: Environment, policy: TokenPolicy, renderer: ChatRenderer,
                        config: EpisodeConfig = EpisodeConfig(), *, step: int = 0,
                        episode_id: str | None = None, keep_errors: bool = False) -> EpisodeRecord:
    """One multi-turn episode of the agent in `env` (whose RewardConfig scores it). Never raises
    for what the model does. An episode that ended in an error re-raises it: a judge that cannot
    work (`JudgeFailure`) always, since it measured nothing; any other (a failed generation request,
    a bug) unless `keep_errors`, which keeps the episode as data (termination "error", the reward of
    what was judged before it, trimmed to end on its last model token: verl's path, where one
    episode's error must not fail the whole step)."""
    eid = episode_id or uuid.uuid4().hex[:16]
    front = TokenFront(policy, renderer, config.limits(), session=eid)
    engine = Engine(env, front, EngineConfig(max_turns=config.max_turns, repeat_warn=config.repeat_warn,
                                             repeat_limit=config.repeat_limit, judge_at_end=True))
    res = engine.run()
    if res.error is not None and (isinstance(res.error, JudgeFailure) or not keep_errors):
        raise res.error
    return ends_on_model_token(_record(task, "agentic", step, eid, front, res))


def ends_on_model_token(ep: EpisodeRecord) -> EpisodeRecord:
    """`ep` without trailing observation tokens. verl puts the reward on the last response token and
    GAE drops rewards on mask-0 tokens; only an episode cut by an error (observations rendered for a
    generation that failed) can end on them."""
    n = len(ep.response_mask)
    while n and ep.response_mask[n - 1] == 0:
        n -= 1
    if n == len(ep.response_mask):
        return ep
    return ep.model_copy(update={"response_ids": ep.response_ids[:n], "response_mask": ep.response_mask[:n],
                                 "response_logprobs": ep.response_logprobs[:n]})


def run_single_turn_episode(task: Task, evaluator: Evaluator, policy: TokenPolicy, renderer: ChatRenderer,
                            config: EpisodeConfig = EpisodeConfig(), reward: RewardConfig = RewardConfig(),
                            *, step: int = 0, episode_id: str | None = None) -> EpisodeRecord:
    """The warm-up episode: one reply holding a whole single-file ModelNew, judged by `evaluator`
    and scored once with `reward` (the run's RewardConfig)."""
    eid = episode_id or uuid.uuid4().hex[:16]
    front = TokenFront(policy, renderer, config.limits(), session=eid)
    front.open(single_turn_messages(task, evaluator.device), None)
    t0 = time.monotonic()
    try:
        text, why = front.reply(1).text, "the reply holds no ```python block defining ModelNew"
    except EndRun as end:   # the prompt alone fills the context budget: nothing was generated
        text, why = "", end.outcome.message
    finally:
        front.end()
    gen_s = time.monotonic() - t0
    judged: list[Judged] = []
    module = extract_module(text)
    judge_s = 0.0
    if module is not None:
        try:
            cand = Candidate.from_source(module)
        except CandidateError as exc:
            why = f"not a candidate: {exc}"
        else:
            t0 = time.monotonic()
            v = candidate_verdict(evaluator, task, cand)  # JudgeError: the episode measures nothing
            judge_s = time.monotonic() - t0
            judged.append(Judged(v, cand, reward_of(v, reward), 1))
    chosen = judged[0] if judged else None
    outcome = (Outcome(terminated=Terminal.SUBMITTED, message="one reply judged") if chosen is not None
               else Outcome(truncated=Truncation.ENVIRONMENT, message=why))
    res = EpisodeResult(task_id=task.id, task_name=task.name, device=evaluator.device, tools=[], outcome=outcome,
                        turns=1, seconds=0.0, judged=judged, best=chosen if chosen and chosen.verdict.correct else None,
                        chosen=chosen, reward=chosen.reward.value if chosen else reward.fail,
                        reward_reason=chosen.reward.reason if chosen else why, generate_s=gen_s, judge_s=judge_s)
    return _record(task, "single_turn", step, eid, front, res)


def _record(task: Task, mode: Mode, step: int, eid: str, front: TokenFront, res: EpisodeResult) -> EpisodeRecord:
    t: Tokens = front.tokens
    chosen = res.chosen
    return EpisodeRecord(
        id=eid, task_id=task.id, task_name=task.name, mode=mode, step=step, prompt_ids=t.prompt, response_ids=t.ids,
        response_mask=t.mask, response_logprobs=t.logprobs, messages=front.messages, tools=res.tools,
        turns=res.turns, outcome=res.outcome.record(), termination=res.outcome.termination.value, reward=res.reward,
        reward_reason=res.reward_reason,
        verdict=None if chosen is None else verdict_summary(chosen.verdict, chosen.reward.value, chosen.reward.reason),
        verdicts=[verdict_summary(j.verdict, j.reward.value, j.reward.reason) for j in res.judged],
        malformed_calls=res.malformed_calls, no_call_turns=res.no_call_turns,
        hacking=any(is_hack(j.verdict) for j in res.judged), generate_s=round(res.generate_s, 4),
        tool_s=round(res.tool_s, 4), judge_s=round(res.judge_s, 4))
