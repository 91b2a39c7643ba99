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

Models are loaded by `models.py` as the settings say (precision, gradient checkpointing, LoRA,
critic_mode, a KL reference when ppo.kl_coef > 0, no critic for ppo.estimator grpo/rloo); on CUDA a
pre-flight estimate refuses a run that cannot fit before anything is loaded, and a task prompt
longer than episode.context_tokens stops the stage before its first episode.
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
from .learner import Learner, checkpoint_step, is_peft, latest_checkpoint
from .models import ModelError, Sources, build_learner, load_actor, load_critic, preflight  # noqa: F401 (re-exported)
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
    if not folder.exists():
        raise StageError(f"{folder}: no such model folder (model and critic are Hugging Face model folders, "
                         f"or 'tiny')")
    if not (folder / "config.json").exists():
        raise StageError(f"{folder}: not a Hugging Face model folder (no config.json)")
    return folder


def stage_learner(cfg: TrainConfig, out: Path, ckpt: Path | None, *, critic: bool, ref: bool = False) -> Learner:
    """The stage's learner as the settings say, after the pre-flight memory check; a model that
    cannot be loaded as configured is a StageError."""
    base = resolve_model(cfg.model, out, cfg.seed)
    critic_src = None
    if cfg.critic and critic and cfg.critic_mode == "shared":   # a folder holding value_head.pt
        critic_src = Path(cfg.critic)
        if not critic_src.exists():
            raise StageError(f"{critic_src}: no such critic folder (critic_mode shared: a folder with value_head.pt)")
    elif cfg.critic and critic:
        critic_src = resolve_model(cfg.critic, out)
    need = preflight(cfg, base, critic=critic, ref=ref)
    if need is not None:
        raise StageError(need)
    try:
        return build_learner(cfg, Sources(base=base, ckpt=ckpt, critic=critic_src), critic=critic, ref=ref,
                             allowed_fn=lambda tok: allowed_ids(tok, cfg.allowed_tokens))
    except ModelError as exc:
        raise StageError(str(exc)) from None


def check_context(cfg: TrainConfig, tasks, renderer: ChatRenderer, mode: str, device: str) -> None:
    """Every task's prompt must leave room for a reply within episode.context_tokens (the agentic
    prompt is measured without its tool schemas, so this is a lower bound there)."""
    from .episode import agentic_messages, single_turn_messages

    build = single_turn_messages if mode == "single_turn" else agentic_messages
    for task in tasks:
        n = len(renderer.prompt_ids(build(task, device), None))
        if n >= cfg.episode.context_tokens:
            raise StageError(f"task {task.name}: its prompt is {n} tokens but episode.context_tokens is "
                             f"{cfg.episode.context_tokens}; raise it (-c episode.context_tokens=N) above the prompt")


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


def _export_final(ckpt: Path, out: Path, learner: Learner | None = None) -> None:
    """Copy the last checkpoint to OUT/final. A LoRA actor is exported merged into its base (a plain
    model folder the next stage and verl load); the merge ends the learner's use."""
    final = out / "final"
    tmp = out / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for part in ("actor", "critic"):
        if part == "actor" and learner is not None and is_peft(learner.actor):
            learner.actor.merge_and_unload().save_pretrained(tmp / "actor")
            learner.tok.save_pretrained(tmp / "actor")
        elif (ckpt / part).exists():
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
    learner = stage_learner(cfg, out, ckpt, critic=cfg.ppo.needs_critic, ref=cfg.ppo.kl_coef > 0)
    actor, tok, allowed = learner.actor, learner.tok, learner.allowed
    renderer = ChatRenderer(tok)
    tasks = select_tasks(cfg)
    check_context(cfg, tasks, renderer, mode, gate.device)
    for step in range(start, cfg.steps):
        torch.manual_seed(cfg.seed + step)
        policy = HFPolicy(actor, tok.eos_token_id, seed=cfg.seed * 100_003 + step, device=dev, allowed=allowed)
        done = [0]

        def tick(ep: EpisodeRecord) -> None:
            done[0] += 1
            progress(f"{stage} step {step + 1}/{cfg.steps}", done[0], cfg.episodes_per_step, None)

        t0 = time.monotonic()
        batch = step_tasks(tasks, step, cfg.episodes_per_step, cfg.ppo.group_size)
        try:
            eps, failures = run_episodes(batch, mode=mode, gate=gate, policy=policy, renderer=renderer, cfg=cfg,
                                         step=step, workdir=out / "workspaces", on_done=tick)
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
        _export_final(ckpt, out, learner)
    return read_metrics(out / "metrics.jsonl")


# ---------------------------------------------------------------------------------------------
# Offline stages: rft and critic


def _episodes(cfg: TrainConfig, out: Path) -> list[EpisodeRecord]:
    # the recipe's order: collect's agentic episodes where that stage ran beside this one, else the
    # warm-up's own episodes
    default = next((out.parent / d / "episodes" for d in ("collect", "warmup") if (out.parent / d / "episodes").exists()),
                   out.parent / "collect" / "episodes")
    sources = cfg.episodes or [str(default)]
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
    learner = stage_learner(cfg, out, ckpt, critic=False)
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
        _export_final(ckpt, out, learner)
    return read_metrics(out / "metrics.jsonl")


def critic_stage(cfg: TrainConfig, out: Path, progress: Progress = _quiet) -> list[dict]:
    """Pre-train a critic on the returns of stored episodes; `final/critic` is verl's
    `critic.model.path` and this project's `critic`."""
    out.mkdir(parents=True, exist_ok=True)
    eps = [e for e in _episodes(cfg, out) if e.model_tokens > 0]
    if not eps:
        raise StageError("no stored episode has model tokens to learn values on")
    ckpt, start = _resume(out)
    learner = stage_learner(cfg, out, ckpt, critic=True)
    return _epochs(cfg, out, "critic", "value_loss", eps,
                   lambda batch: learner.critic_update(batch, cfg.ppo.gamma)["value_loss"], learner, ckpt, start,
                   progress)
