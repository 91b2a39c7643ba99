"""Rollouts: the core every front of the system uses (solve, run, every training stage).

    env.py         the environment protocol (reset, step) the engine talks to
    evaluator.py   the Evaluator protocol (how the tools reach the judge), the local, pool and memo
                   evaluators, and `check_evaluator`, the conformance check
    remote.py      RemoteEvaluator: the judge of a `cuda-agent serve` service
    ray_judge.py   RayEvaluator and JudgeActor: a node's judge pool as a Ray actor (no verl needed)
    outcome.py     how an episode ended: terminated / truncated / a typed error per boundary
    prompts.py     what the model is told (system prompt, task, notes, the warm-up prompt)
    front.py       the model front protocol (begin, reply, observe, ...)
    chat.py        the chat front: an OpenAI-compatible client, context budget and compression
    tokens.py      the token front: a token policy and a chat template, masks and logprobs
    engine.py      the one loop: limits, repetition, tools through the environment, endings, the
                   episode's verdict and its reward (scored once, by the environment)

Heavy or optional imports (Ray, the service's client, transformers) stay inside the functions
that need them; `cuda_agent.agent` (the workspace, its tools, `solve`) and `cuda_agent.train`
are fronts over this package.
"""

from .engine import AgentProgress, Engine, EngineConfig, EpisodeResult, Judged, rank
from .env import Environment, Reset, StepResult
from .evaluator import (Evaluator, EvaluatorCheckError, LocalEvaluator, MemoEvaluator, PoolEvaluator,
                        candidate_verdict, check_evaluator)
from .front import ModelFront, ModelTurn, Usage
from .outcome import (EndRun, ErrorInfo, InternalError, Interrupted, JudgeFailure, Outcome, RolloutError, Terminal,
                      Termination, Truncation)

__all__ = ["AgentProgress", "EndRun", "Engine", "EngineConfig", "Environment", "EpisodeResult", "ErrorInfo",
           "Evaluator", "EvaluatorCheckError", "InternalError", "Interrupted", "JudgeFailure", "Judged",
           "LocalEvaluator", "MemoEvaluator", "ModelFront", "ModelTurn", "Outcome", "PoolEvaluator", "Reset",
           "RolloutError", "StepResult", "Terminal", "Termination", "Truncation", "Usage", "candidate_verdict", "check_evaluator",
           "rank"]
