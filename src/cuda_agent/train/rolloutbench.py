"""The rollout benchmark: agentic episodes through the real engine and tools, with the model side
measured and the judge stood in for.

A model of a real shape (random weights, `shapes.build_model`) generates every reply to its full length on
the batched policy, so the generation cost is a real model's; the reply the episode then acts on is
scripted (a realistic agent session: write the kernel, its binding and ModelNew, compile, verify,
edit, verify again, submit), padded with prose to the same length, since random weights write no
tool calls. The tools are the real ones in a real workspace; the judge behind them is a stand-in
that answers after `judge_s` seconds, so the figures are those of generation, prefill, the engine
and the tools, not of the GPU's kernels. What it reports: episodes per hour of rollout, generated
and prefilled tokens per second, peak GPU memory.

    python benchmarks/train_bench.py rollout --shape qwen2.5-1.5b --episodes 32 --turns 10
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.candidate import Candidate
from cuda_agent.judge import JudgeConfig, Verdict
from cuda_agent.judge.builds import BuildOutcome
from cuda_agent.judge.verdict import Timing
from cuda_agent.tasks import Task

from cuda_agent.rollout.tokens import Generation


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, p10_ms=ms, p90_ms=ms, std_ms=0.0, n=10)


class StandInJudge:
    """An evaluator that judges nothing: every candidate compiles and is correct, 1.2x faster than
    eager, after `judge_s` seconds (a judge on other machines, as far as the rollout can tell)."""

    local = True

    def __init__(self, device: str = "cuda", judge_s: float = 0.0):
        self.config = JudgeConfig(device=device)
        self.judge_s = judge_s
        self.calls = 0

    @property
    def device(self) -> str:
        return self.config.device

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        self.calls += 1
        time.sleep(self.judge_s)
        return Verdict(task_id=task.id, task_name=task.name, candidate_hash=candidate.hash, device=self.device,
                       compiled=True, correct=True, runtime=_timing(1.0), eager=_timing(1.2),
                       compiled_ref=_timing(1.1), judge_s=self.judge_s)

    def build(self, candidate: Candidate, task: Task | None = None) -> BuildOutcome:
        return BuildOutcome(compiled=True, seconds=0.0, notes=["stand-in judge: nothing was built"])

    def exclusive(self):
        import contextlib

        return contextlib.nullcontext()

    def close(self) -> None:
        pass


def _call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def script(task_name: str) -> list[str]:
    """The tool calls of a ten-turn session, in order (the prose around them is added per turn)."""
    from importlib.resources import files

    root = files("cuda_agent") / "suite" / "solutions" / "cpu" / "10_RMSNorm"
    kernel = (root / "kernels" / "rmsnorm.cpp").read_text()
    binding = (root / "kernels" / "rmsnorm_binding.cpp").read_text()
    model_new = (root / "model_new.py").read_text()
    return [_call("read_file", path="model.py"),
            _call("write_file", path="kernels/rmsnorm.cu", content=kernel),
            _call("write_file", path="kernels/rmsnorm_binding.cpp", content=binding),
            _call("write_file", path="model_new.py", content=model_new),
            _call("compile"),
            _call("verify"),
            _call("edit_file", path="kernels/rmsnorm.cu", old_text="#include", new_text="#include", replace_all=True),
            _call("verify"),
            _call("list_files", path="."),
            _call("submit")]


class ScriptedPolicy:
    """A `TokenPolicy` that pays for a real reply and acts out a scripted one.

    Each turn the inner policy generates `reply_tokens` tokens (EOS ignored) for the session; the
    episode then receives the script's next call, prefixed with prose so the reply has about
    `reply_tokens` tokens too. Its history thus diverges from what the inner policy cached, so the
    next turn prefills the reply again: a real model's reply would have been cached (conservative)."""

    def __init__(self, inner, tokenizer, calls: list[str], reply_tokens: int, filler: str, on_turn=None):
        self.inner, self.tok, self.calls, self.reply_tokens = inner, tokenizer, calls, reply_tokens
        self.filler_ids = tokenizer.encode(filler, add_special_tokens=False)
        self.turns: dict[str, int] = {}
        self.generated = 0
        self.replies = 0
        self._lock = threading.Lock()   # episodes call from threads of their own
        self.on_turn = on_turn   # called after each reply with (replies so far, tokens generated so far)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 session: str | None = None) -> Generation:
        n = min(self.reply_tokens, max_new_tokens)
        gen = self.inner.generate(prompt_ids, n, temperature, session=session)   # the real reply's cost
        with self._lock:
            self.generated += len(gen.token_ids)
            self.replies += 1
            if self.on_turn is not None:
                self.on_turn(self.replies, self.generated)
        turn = self.turns.get(session or "", 0)
        self.turns[session or ""] = turn + 1
        call = self.tok.encode("\n" + self.calls[min(turn, len(self.calls) - 1)], add_special_tokens=False)
        room = max(n - len(call) - 1, 0)   # a call longer than the reply (a whole file) is acted out whole
        prose = (self.filler_ids * (room // max(len(self.filler_ids), 1) + 1))[:room]
        ids = (prose + call)[: max_new_tokens - 1] + [self.tok.eos_token_id]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish="stop")

    def end_session(self, session: str) -> None:
        self.turns.pop(session, None)
        end = getattr(self.inner, "end_session", None)
        if end is not None:
            end(session)


@dataclass
class RolloutFigures:
    shape: str
    episodes: int
    turns_mean: float
    prompt_tokens: int
    reply_tokens: int
    rollout_s: float
    episodes_per_hour: float
    generated_tokens_per_s: float
    response_tokens_mean: float
    peak_gpu_gib: float | None
    terminations: dict
    engine: dict   # the policy's GenStats: decode steps, prefill and decode seconds, rebuilds, graph captures

    def table(self) -> str:
        return "\n".join(f"{k:<24} {v}" for k, v in self.__dict__.items())


def padded_task(prompt_tokens: int, tokenizer, device: str) -> Task:
    """The CUDA suite's RMSNorm task with a comment block that brings the episode's prompt (system
    prompt, skill document, task) to about `prompt_tokens` tokens of this tokenizer."""
    from cuda_agent.suite import suite_tasks

    from .episode import ChatRenderer, agentic_messages

    base = next(t for t in suite_tasks("cuda") if "RMSNorm" in t.name)
    renderer = ChatRenderer(tokenizer)
    from cuda_agent.agent.tools import tool_specs

    have = len(renderer.prompt_ids(agentic_messages(base, device), tool_specs()))
    line = "# The reference computes a root-mean-square normalisation over the last dimension.\n"
    per_line = max(len(tokenizer.encode(line, add_special_tokens=False)), 1)
    extra = max(prompt_tokens - have, 0) // per_line
    return Task.from_source(base.source + "\n" + line * extra, name=base.name)


def run_rollout_bench(*, shape: str = "tiny", episodes: int = 32, turns: int = 10, prompt_tokens: int = 4096,
                      reply_tokens: int = 512, judge_s: float = 0.0, device: str | None = None,
                      workdir: Path | None = None, seed: int = 0, on_turn=None, **policy_options) -> RolloutFigures:
    """`episodes` agentic episodes at once, each `turns` turns of `reply_tokens`-token replies over a
    prompt of about `prompt_tokens`, through the engine, the real tools and the stand-in judge.
    `on_turn(replies, generated_tokens)` is called after every reply (progress)."""
    import tempfile

    import torch

    from .config import TrainConfig
    from .episode import ChatRenderer, EpisodeConfig
    from .generate import HFPolicy
    from .rollout import run_episodes
    from .shapes import SHAPES, build_model
    from .tiny import build_tokenizer

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    # 8192 saturates on the package text (~3.8k ids): the densest this tokenizer gets (a model's own
    # tokenizer would encode the prompt in fewer tokens); the tiny shape's vocabulary caps it
    tok = build_tokenizer(min(8192, SHAPES[shape]["vocab_size"]))
    model = build_model(shape, dev, torch.bfloat16 if dev == "cuda" else torch.float32, seed)
    task = padded_task(prompt_tokens, tok, "cuda")
    judge = StandInJudge("cuda", judge_s)
    context = prompt_tokens + turns * (max(reply_tokens, 1024) + 1024) + 8192
    cfg = TrainConfig(episodes_per_step=episodes, concurrency=episodes, seed=seed,
                      episode=EpisodeConfig(max_turns=turns, context_tokens=context,
                                            turn_tokens=max(reply_tokens, 2048),   # room for a scripted file write
                                            repeat_limit=max(turns + 1, 2)))
    inner = HFPolicy(model, tok.eos_token_id, seed=seed, device=dev, **policy_options)
    policy = ScriptedPolicy(inner, tok, script(task.name), reply_tokens,
                            filler="I will write the kernel, build it and check it against the reference. ",
                            on_turn=on_turn)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    root = Path(workdir or tempfile.mkdtemp(prefix="rollout-bench-"))
    t0 = time.monotonic()
    try:
        eps, failures = run_episodes([task] * episodes, mode="agentic", gate=judge, policy=policy,
                                     renderer=ChatRenderer(tok), cfg=cfg, step=0, workdir=root)
    finally:
        close = getattr(inner, "close", None)
        if close is not None:
            close()
    rollout_s = time.monotonic() - t0
    engine = {k: round(v, 2) if isinstance(v, float) else v for k, v in inner.stats.record().items()}
    if failures:
        raise RuntimeError(f"episodes failed: {failures[:3]}")
    prompt_len = len(eps[0].prompt_ids) if eps else 0
    terminations: dict[str, int] = {}
    for e in eps:
        terminations[e.termination] = terminations.get(e.termination, 0) + 1
    return RolloutFigures(
        shape=shape, episodes=len(eps), turns_mean=statistics.fmean(e.turns for e in eps), prompt_tokens=prompt_len,
        reply_tokens=reply_tokens, rollout_s=round(rollout_s, 2),
        episodes_per_hour=round(len(eps) / rollout_s * 3600, 1),
        generated_tokens_per_s=round(policy.generated / rollout_s, 1),
        response_tokens_mean=statistics.fmean(len(e.response_ids) for e in eps),
        peak_gpu_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev == "cuda" else None,
        terminations=terminations, engine=engine)
