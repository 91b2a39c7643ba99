"""Rollout throughput of the one-GPU policy, on a random model of a real shape.

N episodes run concurrently (one thread each, as `run_episodes` runs them), each T turns: a prompt of
P random token ids, then per turn a reply of exactly R tokens (the policy ignores EOS) followed by O
random observation ids. Random weights say nothing about skill but everything about speed and memory.
`LegacyPolicy` is the policy this project had before `train.generate` (one request at a time under a
lock, the whole context prefilled every turn with logits at every position, a host round trip per
token), kept here only as the baseline the benchmark compares against.

The script is `benchmarks/generate_bench.py`; figures are only comparable on one machine.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from cuda_agent.rollout.tokens import Generation
from .generate import HFPolicy, _forward_cache_kwarg
from .hf import restrict
from .shapes import SHAPES, build_model

# Published config numbers (hugging face config.json of each model); "tiny" is train.tiny's size with
# grouped KV heads, as the real shapes have.
@dataclass(frozen=True)
class BenchConfig:
    shape: str = "tiny"
    sessions: int = 32          # episodes in flight
    turns: int = 10             # model turns per episode
    prompt_tokens: int = 4096   # first prompt
    reply_tokens: int = 512     # every reply (EOS ignored)
    obs_tokens: int = 256       # observation appended after every reply
    device: str = "cpu"
    dtype: str = "bfloat16"     # float32 | bfloat16 | float16
    seed: int = 0
    max_batch: int = 32
    temperature: float = 1.0
    baseline: bool = False      # LegacyPolicy instead of HFPolicy

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; known: {', '.join(SHAPES)}")
        if min(self.sessions, self.turns, self.prompt_tokens, self.reply_tokens) < 1 or self.obs_tokens < 0:
            raise ValueError("sessions, turns, prompt_tokens and reply_tokens must be >= 1, obs_tokens >= 0")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, not {self.dtype!r}")


@dataclass
class BenchResult:
    config: dict
    device_name: str
    wall_s: float
    episodes: int
    generated_tokens: int
    prefill_tokens: int          # tokens run through the model outside decode steps
    reused_tokens: int           # prompt tokens served from a session cache
    generated_tok_per_s: float
    prefill_tok_per_s: float     # prefill tokens per second of wall time spent prefilling
    episodes_per_hour: float
    peak_gpu_mem_gib: float | None
    decode_steps: int
    mean_batch: float            # rows per decode step
    prefill_s: float             # scheduler time in prefills (and joining the batch)
    decode_s: float              # scheduler time in decode steps (and leaving the batch)
    repacks: int

    def record(self) -> dict:
        return asdict(self)


class LegacyPolicy:
    """The pre-`train.generate` HFPolicy, for comparison only: batch 1 under a lock, a KV cache that
    lives for one call (the whole history is prefilled every turn), logits for every prompt position,
    and a host round trip per token."""

    def __init__(self, model, eos_id: int, *, seed: int = 0, device="cpu", allowed=None, ignore_eos: bool = False):
        self.model, self.eos_id, self.allowed, self.ignore_eos = model, eos_id, allowed, ignore_eos
        self.device = torch.device(device)
        self.prefill_tokens = 0
        self.prefill_s = 0.0
        self.decode_steps = 0
        self.decode_s = 0.0
        self._lock = threading.Lock()
        self._rng = torch.Generator(device="cpu").manual_seed(seed)
        self._cache_kw = _forward_cache_kwarg(model)

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 session: str | None = None) -> Generation:
        with self._lock:
            ids = torch.tensor([prompt_ids], device=self.device)
            past, out, logps = None, [], []
            for _ in range(max_new_tokens):
                t0 = time.monotonic()
                res = self.model(input_ids=ids, use_cache=True, **{self._cache_kw: past})
                past = res.cache if self._cache_kw == "cache" else res.past_key_values
                logp = F.log_softmax(restrict(res.logits[0, -1].float(), self.allowed) / temperature, dim=-1).cpu()
                if not out:
                    self.prefill_tokens += len(prompt_ids)
                    self.prefill_s += time.monotonic() - t0
                else:
                    self.decode_steps += 1
                    self.decode_s += time.monotonic() - t0
                tok = int(torch.multinomial(logp.exp(), 1, generator=self._rng))
                out.append(tok)
                logps.append(float(logp[tok]))
                if tok == self.eos_id and not self.ignore_eos:
                    return Generation(token_ids=out, logprobs=logps, finish="stop")
                ids = torch.tensor([[tok]], device=self.device)
            return Generation(token_ids=out, logprobs=logps, finish="length")

    def end_session(self, session: str) -> None:
        pass

    def close(self) -> None:
        pass


def _episode(policy, cfg: BenchConfig, index: int, vocab: int, counts: list[int]) -> None:
    rng = random.Random(cfg.seed * 1_000_003 + index)
    sid = f"bench-{index}"
    history = [rng.randrange(vocab - 1) for _ in range(cfg.prompt_tokens)]
    for _ in range(cfg.turns):
        gen = policy.generate(history, cfg.reply_tokens, cfg.temperature, session=sid)
        counts[index] += len(gen.token_ids)
        history += gen.token_ids + [rng.randrange(vocab - 1) for _ in range(cfg.obs_tokens)]
    policy.end_session(sid)


def run_bench(cfg: BenchConfig, model=None) -> BenchResult:
    """Run the workload of `cfg` (on `model`, or a random one of `cfg.shape`) and measure it."""
    dev = torch.device(cfg.device)
    if model is None:
        model = build_model(cfg.shape, dev, getattr(torch, cfg.dtype), cfg.seed)
    vocab = model.get_input_embeddings().num_embeddings
    eos = vocab - 1
    if cfg.baseline:
        policy = LegacyPolicy(model, eos, seed=cfg.seed, device=dev, ignore_eos=True)
    else:
        policy = HFPolicy(model, eos, seed=cfg.seed, device=dev, max_batch=cfg.max_batch, ignore_eos=True)
    try:
        policy.generate([1, 2, 3], 2, cfg.temperature)   # warm-up: allocator, kernels, the scheduler thread
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        before = _counters(policy)
        counts = [0] * cfg.sessions
        errors: list[BaseException] = []

        def body(i: int) -> None:
            try:
                _episode(policy, cfg, i, vocab, counts)
            except BaseException as exc:   # reported after the join, not lost in a thread
                errors.append(exc)

        threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(cfg.sessions)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        if errors:
            raise RuntimeError(f"{len(errors)} episode(s) failed; first: {errors[0]!r}") from errors[0]
        after = _counters(policy)
    finally:
        policy.close()
    delta = {k: after[k] - before[k] for k in after}
    generated = sum(counts)
    return BenchResult(
        config=asdict(cfg), device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        wall_s=wall, episodes=cfg.sessions, generated_tokens=generated, prefill_tokens=int(delta["prefill_tokens"]),
        reused_tokens=int(delta["reused_tokens"]), generated_tok_per_s=generated / wall,
        prefill_tok_per_s=delta["prefill_tokens"] / max(delta["prefill_s"], 1e-9),
        episodes_per_hour=cfg.sessions / wall * 3600,
        peak_gpu_mem_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
        decode_steps=int(delta["decode_steps"]),
        # each reply's first token comes from its prefill, the rest from decode steps
        mean_batch=(generated - cfg.sessions * cfg.turns) / max(delta["decode_steps"], 1),
        prefill_s=delta["prefill_s"], decode_s=delta["decode_s"], repacks=int(delta["repacks"]))


def _counters(policy) -> dict[str, float]:
    if isinstance(policy, LegacyPolicy):
        return {"prefill_tokens": policy.prefill_tokens, "reused_tokens": 0, "prefill_s": policy.prefill_s,
                "decode_steps": policy.decode_steps, "decode_s": policy.decode_s, "repacks": 0}
    s = policy.stats
    return {"prefill_tokens": s.prefill_tokens, "reused_tokens": s.reused_tokens, "prefill_s": s.prefill_s,
            "decode_steps": s.decode_steps, "decode_s": s.decode_s, "repacks": s.repacks}
