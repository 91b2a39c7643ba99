"""The one-GPU learner: an actor, an optional critic (a separate model or a value head sharing the
actor's backbone), one optimiser, the updates of every stage, and checkpoints that lose nothing on a
crash.

Updates read `EpisodeRecord`s only (token ids, masks, rollout logprobs, rewards):

    sft_update        RFT: cross-entropy on the model's tokens (mask 1) of kept episodes
    critic_update     value pre-training: MSE of the critic's values against Monte-Carlo returns
                      (a shared value head trains alone: pre-training the critic leaves the actor be)
    ppo_update        PPO: old logprobs, values, reference logprobs and advantages (GAE, GRPO or
                      RLOO) computed once per batch, then `epochs` passes over shuffled mini-batches
                      of the clipped policy loss + value loss + KL to the reference - entropy bonus

Log-probabilities never materialise [B, L, V] logits: the backbone runs once per micro-batch and
`hf.chunked_logprobs` applies the lm_head chunk by chunk over the model's tokens only.

A checkpoint is a folder written beside its final name and renamed into place (`os.replace`), so a
kill leaves either the previous checkpoint or the new one, never half of one; `LATEST` names the
newest. The actor is a `save_pretrained` folder (with LoRA: the adapter only, loaded back onto the
base model); a separate critic is an `AutoModelForTokenClassification(num_labels=1)` folder, as
verl's `critic.model.path` expects; a shared value head is `critic/value_head.pt`. `optim.pt` holds
the optimiser's and the LR schedule's state.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from . import ppo
from .episode import EpisodeRecord
from .hf import chunked_logprobs, hidden_states, pad_batch, token_values
from .optim import AdamW32, warmup_lambda


class OptimConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    actor_lr: float = Field(1e-6, gt=0, description="actor learning rate (AdamW, fp32 moments)")
    critic_lr: float = Field(1e-5, gt=0, description="critic (or shared value head) learning rate")
    weight_decay: float = 0.0
    grad_clip: float = Field(1.0, gt=0, description="max gradient norm (actor and critic clipped apart)")
    micro_batch: int = Field(4, ge=1, description="episodes per forward pass")
    warmup_steps: int = Field(0, ge=0, description="optimiser steps (mini-batches, not rollout steps) of linear "
                                                   "LR warm-up from lr/warmup_steps to lr, then constant")


class PPOConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    estimator: Literal["gae", "grpo", "rloo"] = Field(
        "gae", description="advantages: gae (a critic, token-level), grpo (group-normalised outcome reward), "
                           "rloo (leave-one-out baseline); grpo and rloo load and train no critic")
    group_size: int = Field(1, ge=1, description="episodes per task in a step (the grpo/rloo group); "
                                                 "episodes_per_step must be a multiple")
    norm_std: bool = Field(True, description="grpo: divide by the group's reward std (off: Dr. GRPO)")
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda")
    clip_low: float = 0.2
    clip_high: float = Field(0.28, description="upper clip (clip-higher)")
    clip_c: float = Field(3.0, gt=1, description="dual-clip constant")
    value_clip: float = 0.5
    vf_coef: float = Field(1.0, description="weight of the value loss against the policy loss")
    epochs: int = Field(2, ge=1, description="passes over each batch of episodes")
    mini_batch: int | None = Field(None, ge=1, description="episodes per optimiser step (default: a quarter of "
                                                           "the batch, so the ratio departs from 1 and clipping acts)")
    whiten: bool = Field(True, description="gae: whiten advantages over the batch's model tokens")
    kl_coef: float = Field(0.0, ge=0, description="weight of the KL to the frozen reference (the base model; "
                                                  "with LoRA the adapter disabled); 0 loads no reference")
    kl_estimator: Literal["k1", "k3"] = Field("k3", description="per-token KL estimate: k1 = logp - ref, "
                                                                "k3 = exp(ref-logp) - (ref-logp) - 1")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight (entropy is reported either way)")

    @property
    def needs_critic(self) -> bool:
        return self.estimator == "gae"


def _device(model) -> torch.device:
    return next(model.parameters()).device


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class ValueHead(torch.nn.Module):
    """The shared critic: Linear(hidden, 1) on the actor's final hidden states, zero-initialised (values
    start at 0), fp32 (hidden states are cast up: the head is tiny and a value's precision matters)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.score = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.score.weight)
        torch.nn.init.zeros_(self.score.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.score(hidden.float()).squeeze(-1)


class Learner:
    """`critic` (a separate token-classification model) and `value_head` (shared backbone) are
    exclusive; neither is needed for RFT, GRPO or RLOO. `ref` is the frozen reference model for the
    KL term (None with a PEFT actor: its adapter is disabled instead)."""

    def __init__(self, actor, tokenizer, critic=None, optim: OptimConfig = OptimConfig(), *,
                 temperature: float = 1.0, allowed: list[int] | None = None, value_head: ValueHead | None = None,
                 ref=None, chunk: int = 1024, seed: int = 0):
        if critic is not None and value_head is not None:
            raise ValueError("a learner has a separate critic or a shared value head, not both")
        self.actor, self.critic, self.value_head, self.ref = actor, critic, value_head, ref
        self.tok, self.cfg, self.chunk = tokenizer, optim, chunk
        self.temperature, self.allowed = temperature, allowed   # the sampler's distribution
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.actor_params = [p for p in actor.parameters() if p.requires_grad]
        critic_mod = critic if critic is not None else value_head
        self.critic_params = [p for p in critic_mod.parameters() if p.requires_grad] if critic_mod is not None else []
        groups = [{"params": self.actor_params, "lr": optim.actor_lr}]
        if self.critic_params:
            groups.append({"params": self.critic_params, "lr": optim.critic_lr})
        self.opt = AdamW32(groups, weight_decay=optim.weight_decay, seed=seed)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, warmup_lambda(optim.warmup_steps))

    @property
    def has_critic(self) -> bool:
        return self.critic is not None or self.value_head is not None

    # ------------------------------------------------------------------------------ batches
    def _batch(self, eps: list[EpisodeRecord], device):
        """ids [B, L], attention, and over positions 1..L-1: response mask, rollout logprobs."""
        seqs = [e.prompt_ids + e.response_ids for e in eps]
        ids, att = pad_batch(seqs, self.pad, device)
        L = ids.shape[1]
        mask = torch.zeros(len(eps), L - 1, device=device)
        rollout = torch.zeros(len(eps), L - 1, device=device)
        for i, e in enumerate(eps):
            p, r = len(e.prompt_ids), len(e.response_ids)
            if r:
                mask[i, p - 1: p - 1 + r] = torch.tensor(e.response_mask, dtype=torch.float32)
                rollout[i, p - 1: p - 1 + r] = torch.tensor(e.response_logprobs, dtype=torch.float32)
        return ids, att, mask, rollout

    def _chunks(self, eps: list):
        n = self.cfg.micro_batch
        return [eps[i:i + n] for i in range(0, len(eps), n)]

    def _forward(self, model, ids, att, mask, *, values: bool = False, temperature: float | None = None,
                 allowed: bool = True):
        """(logprobs, entropy, values or None), [B, L-1] each, from one backbone forward: log-probs
        and entropy at the model's tokens only (0 elsewhere), values from the shared head on the
        same hidden states or from the separate critic."""
        hidden = hidden_states(model, ids, att)
        logp, ent = chunked_logprobs(model, hidden, ids, mask, chunk=self.chunk,
                                     temperature=self.temperature if temperature is None else temperature,
                                     allowed=self.allowed if allowed else None)
        v = None
        if values and self.value_head is not None:
            v = self.value_head(hidden[:, :-1])
        elif values and self.critic is not None:
            v = token_values(self.critic, ids, att)
        return logp, ent, v

    def _ref_logp(self, ids, att, mask) -> torch.Tensor:
        if is_peft(self.actor):
            with self.actor.disable_adapter():
                return self._forward(self.actor, ids, att, mask)[0]
        if self.ref is None:
            raise ValueError("ppo.kl_coef > 0 needs a reference model (or a LoRA actor)")
        return self._forward(self.ref, ids, att, mask)[0]

    def _clip(self, params) -> float:
        with_grad = [p for p in params if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(with_grad, self.cfg.grad_clip)) if with_grad else 0.0

    def _step(self) -> dict:
        """Clip actor and critic gradients apart, one optimiser and schedule step; their norms."""
        norms = {"grad_norm": self._clip(self.actor_params), "critic_grad_norm": self._clip(self.critic_params)}
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        return norms

    def _train(self, on: bool) -> None:
        for m in (self.actor, self.critic, self.value_head):
            if m is not None:
                m.train(on)

    # ------------------------------------------------------------------------------ RFT
    def sft_update(self, eps: list[EpisodeRecord]) -> dict:
        """One optimiser step of cross-entropy over the model tokens of `eps` (token-mean)."""
        self._train(True)
        dev = _device(self.actor)
        total = sum(e.model_tokens for e in eps) or 1
        loss_sum = 0.0
        for chunk in self._chunks(eps):
            ids, att, mask, _ = self._batch(chunk, dev)
            # the model's own distribution (temperature 1, whole vocabulary)
            logp = self._forward(self.actor, ids, att, mask, temperature=1.0, allowed=False)[0]
            loss = -(logp * mask).sum() / total
            loss.backward()
            loss_sum += float(loss.detach())
        norms = self._step()
        return {"sft_loss": loss_sum, "grad_norm": norms["grad_norm"], "tokens": total}

    # ------------------------------------------------------------------------------ critic
    def critic_update(self, eps: list[EpisodeRecord], gamma: float = 1.0) -> dict:
        """One optimiser step of the critic towards Monte-Carlo returns over model tokens. A shared
        value head reads the actor's hidden states without gradient: the actor does not move."""
        if not self.has_critic:
            raise ValueError("critic_update needs a critic (critic_mode separate or shared)")
        self._train(True)
        dev = _device(self.actor)
        total = sum(e.model_tokens for e in eps) or 1
        loss_sum = 0.0
        for chunk in self._chunks(eps):
            ids, att, mask, _ = self._batch(chunk, dev)
            rewards = torch.tensor([e.reward for e in chunk], device=dev)
            target = ppo.discounted_returns(rewards, mask, gamma)
            if self.value_head is not None:
                with torch.no_grad():
                    hidden = hidden_states(self.actor, ids, att)
                values = self.value_head(hidden[:, :-1])
            else:
                values = token_values(self.critic, ids, att)
            loss = 0.5 * (((values - target) ** 2) * mask).sum() / total
            loss.backward()
            loss_sum += float(loss.detach())
        return {"value_loss": loss_sum, "critic_grad_norm": self._step()["critic_grad_norm"]}

    # ------------------------------------------------------------------------------ PPO
    @torch.no_grad()
    def _prepare(self, eps: list[EpisodeRecord], cfg: PPOConfig, dev) -> tuple[list, float, float]:
        """Per micro-batch, with the weights that sampled the batch: (episodes, mask, old logprobs,
        values or None, reference logprobs or None); and the summed |trainer - sampler| logprob gap
        and model-token count."""
        self._train(False)
        prepared, gap, n_tok = [], 0.0, 0.0
        for chunk in self._chunks(eps):
            ids, att, mask, rollout = self._batch(chunk, dev)
            old, _, vals = self._forward(self.actor, ids, att, mask, values=cfg.needs_critic)
            ref = self._ref_logp(ids, att, mask) if cfg.kl_coef > 0 else None
            gap += float(((old - rollout).abs() * mask).sum())
            n_tok += float(mask.sum())
            prepared.append((chunk, mask, old, vals, ref))
        return prepared, gap, n_tok

    def _advantages(self, all_eps: list[EpisodeRecord], prepared: list, cfg: PPOConfig, dev):
        """(advantages, returns or None), each [N, W] over the prepared episodes in order."""
        width = max(p[1].shape[1] for p in prepared)

        def cat(i):
            return torch.cat([torch.nn.functional.pad(p[i], (0, width - p[i].shape[1])) for p in prepared])

        mask = cat(1)
        eps = [e for p in prepared for e in p[0]]
        if cfg.estimator == "gae":
            rewards = torch.tensor([e.reward for e in eps], device=dev)
            return ppo.gae(ppo.last_token_rewards(rewards, mask), cat(3), mask, cfg.gamma, cfg.lam, cfg.whiten)
        # group baselines over every episode of the step, those without model tokens included
        rewards = torch.tensor([e.reward for e in all_eps])
        groups = ppo.group_ids([e.task_id for e in all_eps])
        one = torch.ones(len(all_eps), 1)
        scalar = (ppo.grpo_advantages(rewards, groups, one, cfg.norm_std) if cfg.estimator == "grpo"
                  else ppo.rloo_advantages(rewards, groups, one))[:, 0]
        by_id = {e.id: float(a) for e, a in zip(all_eps, scalar)}
        adv = torch.tensor([by_id[e.id] for e in eps], device=dev)[:, None] * mask
        return adv, None

    def _minibatch(self, rows: list, cfg: PPOConfig, dev, stats: dict) -> int:
        """Losses of one mini-batch, micro-batch by micro-batch, gradients accumulated (token-mean
        over the mini-batch); returns the tokens (all positions) it ran through the model."""
        mb_tokens = sum(r["ep"].model_tokens for r in rows) or 1
        seen = 0
        for sub in self._chunks(rows):
            ids, att, mask, _ = self._batch([r["ep"] for r in sub], dev)
            T = ids.shape[1] - 1
            seen += int(att.sum())

            def stack(key):
                return torch.stack([torch.nn.functional.pad(r[key], (0, T - r[key].shape[0]))[:T] for r in sub])

            share = float(mask.sum()) / mb_tokens
            logp, ent, v = self._forward(self.actor, ids, att, mask, values=cfg.needs_critic)
            pl, ps = ppo.policy_loss(logp, stack("old"), stack("adv"), mask, cfg.clip_low, cfg.clip_high, cfg.clip_c)
            entropy = ppo.masked_mean(ent, mask)
            loss = pl - cfg.entropy_coef * entropy
            out = {"pg_loss": float(pl.detach()), "entropy": float(entropy.detach()), **ps}
            if cfg.kl_coef > 0:
                kl = ppo.masked_mean(ppo.kl_penalty(logp, stack("ref"), cfg.kl_estimator), mask)
                loss = loss + cfg.kl_coef * kl
                out["kl_ref"] = float(kl.detach())
            if v is not None:
                vl, vs = ppo.value_loss(v, stack("vals"), stack("ret"), mask, cfg.value_clip)
                loss = loss + cfg.vf_coef * vl
                out.update(vf_loss=float(vl.detach()), **vs)
            (loss * share).backward()
            for name, val in out.items():
                stats.setdefault(name, []).append(val)
        return seen

    def ppo_update(self, eps: list[EpisodeRecord], cfg: PPOConfig, seed: int = 0) -> dict:
        if cfg.needs_critic and not self.has_critic:
            raise ValueError("PPO with GAE needs a critic (critic_mode separate or shared, or pre-train one with "
                             "`cuda-agent train critic`); grpo and rloo need none")
        dev = _device(self.actor)
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.monotonic()
        trainable = [e for e in eps if e.model_tokens > 0]
        if not trainable:
            return {}
        prepared, gap, n_tok = self._prepare(trainable, cfg, dev)
        adv_all, ret_all = self._advantages(eps, prepared, cfg, dev)
        rows, k = [], 0
        for chunk, mask, old, vals, ref in prepared:
            T = mask.shape[1]
            for i, e in enumerate(chunk):
                row = {"ep": e, "old": old[i], "adv": adv_all[k, :T]}
                if vals is not None:
                    row.update(vals=vals[i], ret=ret_all[k, :T])
                if ref is not None:
                    row["ref"] = ref[i]
                rows.append(row)
                k += 1
        mini = cfg.mini_batch or max(1, len(rows) // 4)
        order = list(range(len(rows)))
        rng = random.Random(seed)
        stats: dict[str, list[float]] = {}
        tokens = sum(len(e.prompt_ids) + len(e.response_ids) for e in trainable)   # the preparing pass
        self._train(True)
        for _ in range(cfg.epochs):
            rng.shuffle(order)
            for start in range(0, len(order), mini):
                tokens += self._minibatch([rows[j] for j in order[start:start + mini]], cfg, dev, stats)
                stats.setdefault("lr", []).append(self.opt.param_groups[0]["lr"])
                for name, val in self._step().items():
                    stats.setdefault(name, []).append(val)
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        if not self.critic_params:
            out.pop("critic_grad_norm", None)
        elapsed = time.monotonic() - t0
        out["rollout_logprob_gap"] = gap / max(n_tok, 1)   # mean |trainer - sampler| logprob
        mask_all = torch.cat([torch.nn.functional.pad(p[1], (0, adv_all.shape[1] - p[1].shape[1])) for p in prepared])
        out["advantage_abs"] = float((adv_all.abs() * mask_all).sum() / mask_all.sum().clamp(min=1))
        out["optimizer_steps"] = len(stats["lr"])
        out["train_tokens"] = tokens
        out["train_tokens_per_s"] = tokens / max(elapsed, 1e-9)
        if cuda:
            out["peak_mem_gib"] = torch.cuda.max_memory_allocated(dev) / 1024 ** 3
        return out

    # ------------------------------------------------------------------------------ checkpoints
    def save(self, root: Path, step: int, extra: dict | None = None) -> Path:
        """Write checkpoint `step` under root/ckpt atomically and point LATEST at it."""
        ckpt = Path(root) / "ckpt"
        ckpt.mkdir(parents=True, exist_ok=True)
        final = ckpt / f"step-{step:06d}"
        tmp = ckpt / f".step-{step:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.actor.save_pretrained(tmp / "actor")   # a PEFT model writes its adapter only
        self.tok.save_pretrained(tmp / "actor")
        if self.critic is not None:
            self.critic.save_pretrained(tmp / "critic")
            self.tok.save_pretrained(tmp / "critic")
        if self.value_head is not None:
            (tmp / "critic").mkdir(parents=True, exist_ok=True)
            torch.save(self.value_head.state_dict(), tmp / "critic" / "value_head.pt")
        torch.save({"optim": self.opt.state_dict(), "sched": self.sched.state_dict()}, tmp / "optim.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, "lora": is_peft(self.actor), **(extra or {})}))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest = ckpt / ".LATEST.tmp"
        latest.write_text(final.name)
        os.replace(latest, ckpt / "LATEST")
        return final

    def load_optim(self, ckpt: Path) -> None:
        state = torch.load(Path(ckpt) / "optim.pt", weights_only=True)
        if "optim" not in state:
            raise ValueError(f"{ckpt}: an optimiser state of the older two-optimiser format; start a new OUT")
        self.opt.load_state_dict(state["optim"])
        self.sched.load_state_dict(state["sched"])

def latest_checkpoint(root: Path) -> Path | None:
    pointer = Path(root) / "ckpt" / "LATEST"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def checkpoint_step(ckpt: Path) -> int:
    return int(json.loads((Path(ckpt) / "state.json").read_text())["step"])
