"""The training side's benchmark: one PPO update of the real `Learner` on a random model of a real
shape and synthetic episodes of a given context length, reporting training tokens/s, peak GPU
memory and the pre-flight estimate beside it (`benchmarks/train_step_bench.py` is its command line).

No weights are downloaded: `shapes.build_model` builds Qwen2.5's architecture with
random weights, which costs the same time and memory per token as the trained model. Episodes look
like agentic ones: a prompt, then model turns and tool observations alternating until the context
is full (mask 1 on model tokens, 0 on observations), rewards from the reward's levels, so the
masks, the GAE recursion and the chunked log-probs see realistic spans.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch

from .episode import EpisodeRecord
from .learner import Learner, OptimConfig, PPOConfig, ValueHead
from .shapes import SHAPES, build_model as build_shaped



@dataclass(frozen=True)
class BenchResult:
    shape: str
    context: int
    episodes: int
    device: str
    precision: str
    lora: bool
    critic_mode: str
    estimator: str
    train_tokens: int
    train_s: float
    train_tokens_per_s: float
    peak_mem_gib: float | None
    estimate_gib: float
    metrics: dict


def synthetic_episodes(n: int, context: int, vocab: int, *, seed: int = 0, group_size: int = 1,
                       prompt_tokens: int | None = None) -> list[EpisodeRecord]:
    """`n` agentic-looking episodes of `context` tokens each: a prompt (1/16 of the context, at least
    16 tokens), then model turns of 64..2048 tokens and observations of 32..1024 alternating, the last
    span a model turn. Episodes i*group_size .. (i+1)*group_size-1 share a task (GRPO groups)."""
    if context < 32:
        raise ValueError(f"context {context} is too short for a prompt and a reply (>= 32)")
    rng = random.Random(seed)
    p_len = prompt_tokens or max(16, context // 16)
    eps = []
    for i in range(n):
        prompt = [rng.randrange(2, vocab) for _ in range(p_len)]
        resp: list[int] = []
        mask: list[int] = []
        model_turn = True
        while len(resp) < context - p_len:
            room = context - p_len - len(resp)
            span = min(room, rng.randint(64, 2048) if model_turn else rng.randint(32, 1024))
            if not model_turn and span == room:   # end on a model turn, as an episode does
                span = max(0, room - 16)
            resp += [rng.randrange(2, vocab) for _ in range(span)]
            mask += [1 if model_turn else 0] * span
            model_turn = not model_turn
        reward = rng.choice([-1.0, 0.0, 1.0, 2.0, 3.0])
        eps.append(EpisodeRecord(id=f"bench-{i}", task_id=f"task-{i // group_size}", task_name="bench",
                                 mode="agentic", prompt_ids=prompt, response_ids=resp, response_mask=mask,
                                 response_logprobs=[-1.0] * len(resp), messages=[], reward=reward,
                                 reward_reason="synthetic"))
    return eps


def build_model(shape: str, device: str, dtype: torch.dtype, *, checkpointing: bool, seed: int = 0):
    """A random model of `shape` (`shapes.build_model`) set up for training: no KV cache, and
    gradient checkpointing where asked."""
    model = build_shaped(shape, device, dtype, seed).train()
    model.config.use_cache = False
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, model.config


def run(shape: str = "tiny", context: int = 512, *, episodes: int = 4, device: str = "cpu",
        precision: str | None = None, checkpointing: bool | None = None, lora: bool = False,
        critic_mode: str = "shared", estimator: str = "gae", micro_batch: int = 1, mini_batch: int | None = None,
        epochs: int = 1, chunk: int = 1024, seed: int = 0) -> BenchResult:
    """One `Learner.ppo_update` over `episodes` synthetic episodes of `context` tokens."""
    from .config import LoraConfig
    from .memory import estimate
    from .models import apply_lora

    precision = precision or ("bf16" if device.startswith("cuda") else "fp32")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    checkpointing = precision == "bf16" if checkpointing is None else checkpointing
    actor, conf = build_model(shape, device, dtype, checkpointing=checkpointing, seed=seed)
    lora_cfg = LoraConfig() if lora else None
    if lora_cfg is not None:
        actor = apply_lora(actor, lora_cfg)
    critic = head = None
    if estimator == "gae" and critic_mode == "shared":
        head = ValueHead(conf.hidden_size).to(device)
    elif estimator == "gae":
        from transformers import AutoModelForTokenClassification

        critic_conf = copy.deepcopy(conf)
        critic_conf.num_labels = 1
        with torch.device(device):
            critic = AutoModelForTokenClassification.from_config(critic_conf, dtype=dtype)
        if checkpointing:
            critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=1)   # the update reads these two only
    learner = Learner(actor, tok, critic, OptimConfig(micro_batch=micro_batch, actor_lr=1e-6), value_head=head,
                      chunk=chunk, seed=seed)
    eps = synthetic_episodes(episodes, context, conf.vocab_size, seed=seed)
    cfg = PPOConfig(estimator=estimator, epochs=epochs, mini_batch=mini_batch or episodes)
    est = estimate(conf, dtype_bytes=2 if precision == "bf16" else 4, micro_batch=micro_batch, seq_len=context,
                   checkpointing=checkpointing, lora=lora_cfg.model_dump() if lora_cfg else None,
                   separate_critic=critic is not None, chunk=chunk)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.monotonic()
    stats = learner.ppo_update(eps, cfg, seed=seed)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elapsed = time.monotonic() - t0
    return BenchResult(shape=shape, context=context, episodes=episodes, device=device, precision=precision,
                       lora=lora, critic_mode=critic_mode if estimator == "gae" else "none", estimator=estimator,
                       train_tokens=int(stats["train_tokens"]), train_s=elapsed,
                       train_tokens_per_s=stats["train_tokens"] / elapsed, peak_mem_gib=stats.get("peak_mem_gib"),
                       estimate_gib=est.total / 1024 ** 3, metrics=stats)


def as_dict(result: BenchResult) -> dict:
    return asdict(result)
