"""The one-GPU learner: an actor, an optional critic, their optimisers, the updates of every stage,
and checkpoints that lose nothing on a crash.

Updates read `EpisodeRecord`s only (token ids, masks, rollout logprobs, rewards):

    sft_update        RFT: cross-entropy on the model's tokens (mask 1) of kept episodes
    critic_update     value pre-training: MSE of the critic's values against Monte-Carlo returns
    ppo_update        PPO with a GAE critic (ppo.py): old logprobs and values computed once, then
                      `epochs` passes over mini-batches of the actor and critic losses

A checkpoint is a folder written beside its final name and renamed into place (`os.replace`), so a
kill leaves either the previous checkpoint or the new one, never half of one; `LATEST` names the
newest. Actor and critic are `save_pretrained` folders (the critic an
`AutoModelForTokenClassification(num_labels=1)`, as verl's `critic.model.path` expects).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from . import ppo
from .episode import EpisodeRecord
from .hf import pad_batch, token_logprobs, token_values


class OptimConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    actor_lr: float = Field(1e-6, gt=0, description="actor learning rate (AdamW)")
    critic_lr: float = Field(1e-5, gt=0, description="critic learning rate (AdamW)")
    weight_decay: float = 0.0
    grad_clip: float = Field(1.0, gt=0, description="max gradient norm")
    micro_batch: int = Field(4, ge=1, description="episodes per forward pass")


class PPOConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda")
    clip_low: float = 0.2
    clip_high: float = Field(0.28, description="upper clip (clip-higher)")
    clip_c: float = Field(3.0, gt=1, description="dual-clip constant")
    value_clip: float = 0.5
    vf_coef: float = Field(1.0, description="weight of the value loss against the policy loss")
    epochs: int = Field(1, ge=1, description="passes over each batch of episodes")
    mini_batch: int = Field(8, ge=1, description="episodes per optimiser step")
    whiten: bool = True


def _device(model) -> torch.device:
    return next(model.parameters()).device


class Learner:
    def __init__(self, actor, tokenizer, critic=None, optim: OptimConfig = OptimConfig(), *,
                 temperature: float = 1.0, allowed: list[int] | None = None):
        self.actor, self.critic, self.tok, self.cfg = actor, critic, tokenizer, optim
        self.temperature, self.allowed = temperature, allowed   # the sampler's distribution
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.actor_opt = torch.optim.AdamW(actor.parameters(), lr=optim.actor_lr, weight_decay=optim.weight_decay)
        self.critic_opt = (torch.optim.AdamW(critic.parameters(), lr=optim.critic_lr, weight_decay=optim.weight_decay)
                           if critic is not None else None)

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

    def _chunks(self, eps: list[EpisodeRecord]):
        n = self.cfg.micro_batch
        return [eps[i:i + n] for i in range(0, len(eps), n)]

    def _logp(self, ids, att, mask):
        """Token logprobs under the sampling distribution; zero where the mask is 0 (so -inf of a
        restricted vocabulary never meets a 0 weight as NaN)."""
        logp = token_logprobs(self.actor, ids, att, self.temperature, self.allowed)
        return torch.where(mask.bool(), logp, torch.zeros_like(logp))

    def _step(self, model, opt) -> float:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(norm)

    # ------------------------------------------------------------------------------ RFT
    def sft_update(self, eps: list[EpisodeRecord]) -> dict:
        """One optimiser step of cross-entropy over the model tokens of `eps` (token-mean)."""
        self.actor.train()
        dev = _device(self.actor)
        total = sum(e.model_tokens for e in eps) or 1
        loss_sum = 0.0
        for chunk in self._chunks(eps):
            ids, att, mask, _ = self._batch(chunk, dev)
            logp = token_logprobs(self.actor, ids, att)   # the model's own distribution (temperature 1)
            loss = -(logp * mask).sum() / total
            loss.backward()
            loss_sum += float(loss.detach())
        return {"sft_loss": loss_sum, "grad_norm": self._step(self.actor, self.actor_opt), "tokens": total}

    # ------------------------------------------------------------------------------ critic
    def critic_update(self, eps: list[EpisodeRecord], gamma: float = 1.0) -> dict:
        """One optimiser step of the critic towards Monte-Carlo returns over model tokens."""
        if self.critic is None:
            raise ValueError("critic_update needs a critic")
        self.critic.train()
        dev = _device(self.critic)
        total = sum(e.model_tokens for e in eps) or 1
        loss_sum = 0.0
        for chunk in self._chunks(eps):
            ids, att, mask, _ = self._batch(chunk, dev)
            rewards = torch.tensor([e.reward for e in chunk], device=dev)
            target = ppo.discounted_returns(rewards, mask, gamma)
            values = token_values(self.critic, ids, att)
            loss = 0.5 * (((values - target) ** 2) * mask).sum() / total
            loss.backward()
            loss_sum += float(loss.detach())
        return {"value_loss": loss_sum, "critic_grad_norm": self._step(self.critic, self.critic_opt)}

    # ------------------------------------------------------------------------------ PPO
    def ppo_update(self, eps: list[EpisodeRecord], cfg: PPOConfig, seed: int = 0) -> dict:
        if self.critic is None:
            raise ValueError("PPO with GAE needs a critic (pre-train one with `cuda-agent train critic`)")
        dev = _device(self.actor)
        eps = [e for e in eps if e.model_tokens > 0]
        if not eps:
            return {}
        # old logprobs, values, advantages: once per batch, with the weights that sampled it
        prepared = []
        gaps = []
        with torch.no_grad():
            self.actor.eval()
            self.critic.eval()
            for chunk in self._chunks(eps):
                ids, att, mask, rollout = self._batch(chunk, dev)
                old = self._logp(ids, att, mask)
                vals = token_values(self.critic, ids, att)
                gaps.append(float(((old - rollout).abs() * mask).sum()))
                prepared.append((chunk, ids, att, mask, old, vals))
        n_tok = sum(float(p[3].sum()) for p in prepared)
        # GAE over the whole batch so whitening sees every episode's advantages
        width = max(p[1].shape[1] - 1 for p in prepared)

        def widen(x):
            return torch.nn.functional.pad(x, (0, width - x.shape[1]))

        mask_all = torch.cat([widen(p[3]) for p in prepared])
        vals_all = torch.cat([widen(p[5]) for p in prepared])
        rewards = torch.tensor([e.reward for p in prepared for e in p[0]], device=dev)
        adv_all, ret_all = ppo.gae(ppo.last_token_rewards(rewards, mask_all), vals_all, mask_all, cfg.gamma, cfg.lam,
                                   cfg.whiten)
        rows = []
        k = 0
        for chunk, ids, att, mask, old, vals in prepared:
            for i in range(len(chunk)):
                T = ids.shape[1] - 1
                rows.append((chunk[i], old[i, :T], vals[i, :T], adv_all[k, :T], ret_all[k, :T]))
                k += 1
        order = list(range(len(rows)))
        rng = random.Random(seed)
        stats: dict[str, list[float]] = {}
        self.actor.train()
        self.critic.train()
        for _ in range(cfg.epochs):
            rng.shuffle(order)
            for start in range(0, len(order), cfg.mini_batch):
                mb = [rows[j] for j in order[start:start + cfg.mini_batch]]
                mb_tokens = sum(r[0].model_tokens for r in mb) or 1
                for sub in [mb[i:i + self.cfg.micro_batch] for i in range(0, len(mb), self.cfg.micro_batch)]:
                    ids, att, mask, _ = self._batch([r[0] for r in sub], dev)
                    T = ids.shape[1] - 1

                    def stack(idx):
                        return torch.stack([torch.nn.functional.pad(r[idx], (0, T - r[idx].shape[0]))[:T] for r in sub])

                    old, old_v, adv, ret = stack(1), stack(2), stack(3), stack(4)
                    share = float(mask.sum()) / mb_tokens   # token-mean over the mini-batch
                    logp = self._logp(ids, att, mask)
                    pl, ps = ppo.policy_loss(logp, old, adv, mask, cfg.clip_low, cfg.clip_high, cfg.clip_c)
                    (pl * share).backward()
                    v = token_values(self.critic, ids, att)
                    vl, vs = ppo.value_loss(v, old_v, ret, mask, cfg.value_clip)
                    (cfg.vf_coef * vl * share).backward()
                    for name, val in {"pg_loss": float(pl.detach()), "vf_loss": float(vl.detach()), **ps, **vs}.items():
                        stats.setdefault(name, []).append(val)
                stats.setdefault("grad_norm", []).append(self._step(self.actor, self.actor_opt))
                stats.setdefault("critic_grad_norm", []).append(self._step(self.critic, self.critic_opt))
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        out["rollout_logprob_gap"] = sum(gaps) / max(n_tok, 1)   # mean |trainer - sampler| logprob
        out["advantage_abs"] = float((adv_all.abs() * mask_all).sum() / mask_all.sum().clamp(min=1))
        return out

    # ------------------------------------------------------------------------------ checkpoints
    def save(self, root: Path, step: int, extra: dict | None = None) -> Path:
        """Write checkpoint `step` under root/ckpt atomically and point LATEST at it."""
        ckpt = Path(root) / "ckpt"
        ckpt.mkdir(parents=True, exist_ok=True)
        final = ckpt / f"step-{step:06d}"
        tmp = ckpt / f".step-{step:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.actor.save_pretrained(tmp / "actor")
        self.tok.save_pretrained(tmp / "actor")
        opt = {"actor": self.actor_opt.state_dict()}
        if self.critic is not None:
            self.critic.save_pretrained(tmp / "critic")
            self.tok.save_pretrained(tmp / "critic")
            opt["critic"] = self.critic_opt.state_dict()
        torch.save(opt, tmp / "optim.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **(extra or {})}))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest = ckpt / ".LATEST.tmp"
        latest.write_text(final.name)
        os.replace(latest, ckpt / "LATEST")
        return final

    def load_optim(self, ckpt: Path) -> None:
        state = torch.load(Path(ckpt) / "optim.pt", weights_only=True)
        self.actor_opt.load_state_dict(state["actor"])
        if self.critic is not None and "critic" in state:
            self.critic_opt.load_state_dict(state["critic"])


def latest_checkpoint(root: Path) -> Path | None:
    pointer = Path(root) / "ckpt" / "LATEST"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def checkpoint_step(ckpt: Path) -> int:
    return int(json.loads((Path(ckpt) / "state.json").read_text())["step"])
