"""The four stages of CUDA Agent's training on the one-GPU path (generation in process with
transformers, updates by `Learner`):

    warmup   single-turn PPO: each episode is one reply holding a whole ModelNew, judged
    rft      rejection fine-tuning: stored episodes filtered (`RFTFilter`), exported as verl SFT
             parquet, and the actor fine-tuned on their model tokens
    critic   value pre-training: a one-output token-classification head on the (RFT) actor,
             regressed on the returns of stored episodes
    ppo      multi-turn agentic PPO with the GAE critic, in the agent's workspace and tools

Each writes into its own folder OUT: `episodes/step-N.jsonl` (rollout stages), `metrics.jsonl`
(one line per step), `ckpt/` (atomic checkpoints, `LATEST`) and `final/` (the last actor and
critic, what the next stage loads). Rerunning a stage on the same OUT resumes after its last
checkpoint; metrics of steps after it are dropped and those steps run again.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from .config import TrainConfig
from .episode import ChatRenderer, EpisodeRecord
from .generate import HFPolicy
from .learner import Learner, checkpoint_step, latest_checkpoint
from .rft import filter_episodes, write_sft_parquet
from .rollout import (append_metrics, episode_metrics, read_episodes, read_metrics, run_episodes, select_tasks,
                      step_tasks, write_episodes)

Progress = Callable[[str, int, int, dict | None], None]   # (what, done, total, metrics of a finished step)


def _quiet(what: str, done: int, total: int, metrics: dict | None) -> None:
    pass


class StageError(ValueError):
    """A stage that cannot start as configured (the CLI exits 2 with the message)."""


# ---------------------------------------------------------------------------------------------
# Models


def resolve_model(path: str, out: Path, seed: int = 0) -> Path:
    """A model folder; 'tiny' builds the random tiny model once under OUT/tiny-model."""
    if path == "tiny":
        from .tiny import build_tiny

        folder = out / "tiny-model"
        if not (folder / "config.json").exists():
            tmp = out / ".tiny-model.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            build_tiny(tmp, seed=seed)
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
        return folder
    folder = Path(path)
    if not (folder / "config.json").exists():
        raise StageError(f"{folder}: not a Hugging Face model folder (no config.json)")
    return folder


def load_actor(path: Path, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.chat_template is None:
        raise StageError(f"{path}: the tokenizer has no chat template")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    return model, tok


def load_critic(path: Path, device: str):
    """An AutoModelForTokenClassification with one output: verl's critic checkpoint format. From a
    causal LM's folder the value head is new (zero-initialised, so values start at 0)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    conf = AutoConfig.from_pretrained(path)
    new_head = not any("TokenClassification" in a for a in (conf.architectures or []))
    critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32).to(device)
    if new_head:
        head = getattr(critic, "score", None) or getattr(critic, "classifier", None)
        if head is not None:
            torch.nn.init.zeros_(head.weight)
            if getattr(head, "bias", None) is not None:
                torch.nn.init.zeros_(head.bias)
    return critic


def allowed_ids(tok, strings: list[str]) -> list[int] | None:
    if not strings:
        return None
    ids = []
    for s in strings:
        tid = tok.convert_tokens_to_ids(s)
        if tid is None or tid == tok.unk_token_id:
            raise StageError(f"allowed token {s[:40]!r} is not one token of the tokenizer")
        ids.append(tid)
    return sorted(set(ids + [tok.eos_token_id]))


def _export_final(ckpt: Path, out: Path) -> None:
    final = out / "final"
    tmp = out / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for part in ("actor", "critic"):
        if (ckpt / part).exists():
            shutil.copytree(ckpt / part, tmp / part)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def _resume(out: Path) -> tuple[Path | None, int]:
    """The latest checkpoint and the first step to run; metrics of later steps are dropped."""
    ckpt = latest_checkpoint(out)
    start = checkpoint_step(ckpt) + 1 if ckpt else 0
    path = out / "metrics.jsonl"
    kept = [m for m in read_metrics(path) if m.get("step", -1) < start]
    tmp = out / ".metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(m) + "\n" for m in kept))
    tmp.replace(path)
    return ckpt, start


# ---------------------------------------------------------------------------------------------
# Rollout stages: warmup (single-turn) and ppo (agentic)


def rollout_stage(cfg: TrainConfig, out: Path, gate, *, mode: str, progress: Progress = _quiet) -> list[dict]:
    """Warm-up (mode single_turn) or agentic PPO (mode agentic) for `cfg.steps` steps; returns the
    metrics of every step run so far (earlier runs included)."""
    out.mkdir(parents=True, exist_ok=True)
    stage = "warmup" if mode == "single_turn" else "ppo"
    (out / "config.json").write_text(json.dumps({"stage": stage, **cfg.model_dump(mode="json")}, indent=1))
    ckpt, start = _resume(out)
    dev = cfg.train_device
    if ckpt is not None:
        actor, tok = load_actor(ckpt / "actor", dev)
        critic = load_critic(ckpt / "critic", dev)
    else:
        base = resolve_model(cfg.model, out, cfg.seed)
        actor, tok = load_actor(base, dev)
        critic = load_critic(resolve_model(cfg.critic, out) if cfg.critic else base, dev)
    allowed = allowed_ids(tok, cfg.allowed_tokens)
    learner = Learner(actor, tok, critic, cfg.optim, temperature=cfg.episode.temperature, allowed=allowed)
    if ckpt is not None:
        learner.load_optim(ckpt)
    renderer = ChatRenderer(tok)
    tasks = select_tasks(cfg)
    for step in range(start, cfg.steps):
        torch.manual_seed(cfg.seed + step)
        policy = HFPolicy(actor, tok.eos_token_id, seed=cfg.seed * 100_003 + step, device=dev, allowed=allowed)
        done = [0]

        def tick(ep: EpisodeRecord) -> None:
            done[0] += 1
            progress(f"{stage} step {step + 1}/{cfg.steps}", done[0], cfg.episodes_per_step, None)

        t0 = time.monotonic()
        try:
            eps, failures = run_episodes(step_tasks(tasks, step, cfg.episodes_per_step), mode=mode, gate=gate,
                                         policy=policy, renderer=renderer, cfg=cfg, step=step,
                                         workdir=out / "workspaces", on_done=tick)
        finally:   # its KV caches were computed by this step's weights: release them before the update
            policy.close()
        rollout_s = time.monotonic() - t0
        write_episodes(eps, out / "episodes" / f"step-{step:06d}.jsonl")
        t0 = time.monotonic()
        stats = learner.ppo_update(eps, cfg.ppo, seed=cfg.seed + step)
        train_s = time.monotonic() - t0
        record = {"stage": stage, "step": step, **episode_metrics(eps), **stats, "rollout_s": rollout_s,
                  "train_s": train_s, "judge_failures": failures, "time": time.time()}
        record["episodes_per_hour"] = len(eps) / max(rollout_s + train_s, 1e-9) * 3600
        append_metrics(out / "metrics.jsonl", record)
        if (step + 1) % cfg.checkpoint_every == 0 or step == cfg.steps - 1:
            ckpt = learner.save(out, step)
        progress(f"{stage} step {step + 1}/{cfg.steps}", cfg.episodes_per_step, cfg.episodes_per_step, record)
    if ckpt is not None:
        _export_final(ckpt, out)
    return read_metrics(out / "metrics.jsonl")


# ---------------------------------------------------------------------------------------------
# Offline stages: rft and critic


def _episodes(cfg: TrainConfig, out: Path) -> list[EpisodeRecord]:
    sources = cfg.episodes or [str(out.parent / "warmup" / "episodes")]
    try:
        return read_episodes(sources)
    except FileNotFoundError as exc:
        raise StageError(f"{exc} (set episodes = [...] or -c 'episodes=[\"DIR\"]')") from None


def _batches(eps: list[EpisodeRecord], n: int, seed: int) -> list[list[EpisodeRecord]]:
    order = list(eps)
    random.Random(seed).shuffle(order)
    return [order[i:i + n] for i in range(0, len(order), n)]


def rft_stage(cfg: TrainConfig, out: Path, progress: Progress = _quiet, *, export_only: bool = False) -> list[dict]:
    """Filter stored episodes, export verl SFT parquet, fine-tune the actor for `cfg.epochs`
    (`export_only`: stop after the parquet, for verl's SFT trainer)."""
    out.mkdir(parents=True, exist_ok=True)
    eps = _episodes(cfg, out)
    kept, why = filter_episodes(eps, cfg.rft)
    report = {"episodes": len(eps), "kept": len(kept), "rejected": dict(why), "filter": cfg.rft.model_dump()}
    (out / "rft_filter.json").write_text(json.dumps(report, indent=1))
    write_sft_parquet(kept, out / "rft.parquet")
    if not kept:
        raise StageError(f"no episode passed the RFT filter ({dict(why)}); see {out / 'rft_filter.json'}")
    if export_only:
        return []
    ckpt, start = _resume(out)
    dev = cfg.train_device
    actor, tok = load_actor(ckpt / "actor" if ckpt else resolve_model(cfg.model, out, cfg.seed), dev)
    learner = Learner(actor, tok, None, cfg.optim)
    if ckpt is not None:
        learner.load_optim(ckpt)
    return _epochs(cfg, out, "rft", "sft_loss", kept, lambda batch: learner.sft_update(batch)["sft_loss"],
                   learner, ckpt, start, progress, {"kept": len(kept)})


def _epochs(cfg: TrainConfig, out: Path, stage: str, loss: str, eps: list, update, learner, ckpt, start: int,
            progress: Progress, meta: dict | None = None) -> list[dict]:
    """The supervised stages' epochs (RFT's SFT, the critic's value regression): shuffled batches,
    one metrics record and one checkpoint per epoch (a killed run resumes at the next epoch), the
    last checkpoint exported as `final/`."""
    for epoch in range(start, cfg.epochs):
        batches = _batches(eps, cfg.batch_episodes, cfg.seed + epoch)
        losses = []
        t0 = time.monotonic()
        for i, batch in enumerate(batches):
            losses.append(update(batch))
            progress(f"{stage} epoch {epoch + 1}/{cfg.epochs}", i + 1, len(batches), None)
        record = {"stage": stage, "step": epoch, loss: sum(losses) / len(losses), f"{loss}_first": losses[0],
                  f"{loss}_last": losses[-1], "episodes": len(eps), "train_s": time.monotonic() - t0,
                  "time": time.time()}
        append_metrics(out / "metrics.jsonl", record)
        ckpt = learner.save(out, epoch, meta)
        progress(f"{stage} epoch {epoch + 1}/{cfg.epochs}", len(batches), len(batches), record)
    if ckpt is not None:
        _export_final(ckpt, out)
    return read_metrics(out / "metrics.jsonl")


def critic_stage(cfg: TrainConfig, out: Path, progress: Progress = _quiet) -> list[dict]:
    """Pre-train a critic on the returns of stored episodes; `final/critic` is verl's
    `critic.model.path` and this project's `critic`."""
    out.mkdir(parents=True, exist_ok=True)
    eps = [e for e in _episodes(cfg, out) if e.model_tokens > 0]
    if not eps:
        raise StageError("no stored episode has model tokens to learn values on")
    ckpt, start = _resume(out)
    dev = cfg.train_device
    base = resolve_model(cfg.model, out, cfg.seed)
    actor, tok = load_actor(ckpt / "actor" if ckpt else base, dev)
    critic = load_critic(ckpt / "critic" if ckpt else (resolve_model(cfg.critic, out) if cfg.critic else base), dev)
    learner = Learner(actor, tok, critic, cfg.optim)
    if ckpt is not None:
        learner.load_optim(ckpt)
    return _epochs(cfg, out, "critic", "value_loss", eps,
                   lambda batch: learner.critic_update(batch, cfg.ppo.gamma)["value_loss"], learner, ckpt, start,
                   progress)
