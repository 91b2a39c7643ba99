"""`cuda-agent train collect`: episodes of a model over tasks, without updating it.

CUDA Agent initialises the actor by rejection fine-tuning on positive *agentic* trajectories and the
critic by value pre-training on the same kind of episodes it will then score: multi-turn episodes
in the workspace with the tools, not the single-turn warm-up's replies (which hold no tool calls,
so RFT's filters for invalid calls and loops would have nothing to filter). This stage produces
them: the model (the warm-up's final actor, normally) runs `steps` x `episodes_per_step` episodes
through the same engine, tools and judge as PPO, in eval mode, and nothing is trained.

    OUT/episodes/step-N.jsonl   the episodes (EpisodeRecord lines), the input of `rft` and `critic`
    OUT/metrics.jsonl           one line per step (reward, pass rate, terminations, time split)

A step's file is written whole or not at all; a rerun skips the steps already written, so a killed
collection resumes where it stopped. `mode` is `agentic` (the default, the paper's stages 2 and 3)
or `single_turn`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .config import TrainConfig
from .episode import ChatRenderer, EpisodeRecord
from .generate import HFPolicy
from .models import ModelError, load_actor
from .rollout import append_metrics, episode_metrics, read_metrics, run_episodes, select_tasks, step_tasks, write_episodes
from .stages import Progress, StageError, _quiet, allowed_ids, check_context, resolve_model


def collect_stage(cfg: TrainConfig, out: Path, gate, *, mode: str = "agentic",
                  progress: Progress = _quiet) -> list[dict]:
    """Run the model over the tasks for `cfg.steps` steps; returns every step's metrics so far."""
    if mode not in ("agentic", "single_turn"):
        raise StageError(f"collect mode must be agentic or single_turn, not {mode!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"stage": "collect", "mode": mode, **cfg.model_dump(mode="json")},
                                                indent=1))
    done_steps = {m["step"] for m in read_metrics(out / "metrics.jsonl")
                  if (out / "episodes" / f"step-{m['step']:06d}.jsonl").exists()}
    todo = [s for s in range(cfg.steps) if s not in done_steps]
    if not todo:
        return read_metrics(out / "metrics.jsonl")
    dev = cfg.train_device
    dtype = torch.bfloat16 if cfg.dtype_name == "bf16" else torch.float32
    try:
        actor, tok = load_actor(resolve_model(cfg.model, out, cfg.seed), dev, dtype=dtype)
    except ModelError as exc:
        raise StageError(str(exc)) from None
    actor.eval()
    allowed = allowed_ids(tok, cfg.allowed_tokens)
    renderer = ChatRenderer(tok)
    tasks = select_tasks(cfg)
    check_context(cfg, tasks, renderer, mode, gate.device)
    for step in todo:
        what = f"collect step {step + 1}/{cfg.steps}"
        count = [0]

        def tick(ep: EpisodeRecord) -> None:
            count[0] += 1
            progress(what, count[0], cfg.episodes_per_step, None)

        t0 = time.monotonic()
        with HFPolicy(actor, tok.eos_token_id, seed=cfg.seed * 100_003 + step, device=dev, allowed=allowed) as policy:
            eps, failures = run_episodes(step_tasks(tasks, step, cfg.episodes_per_step, cfg.ppo.group_size),
                                         mode=mode, gate=gate, policy=policy, renderer=renderer, cfg=cfg, step=step,
                                         workdir=out / "workspaces", on_done=tick)
        rollout_s = time.monotonic() - t0
        write_episodes(eps, out / "episodes" / f"step-{step:06d}.jsonl")
        record = {"stage": "collect", "step": step, **episode_metrics(eps), "rollout_s": rollout_s,
                  "judge_failures": failures, "time": time.time(),
                  "episodes_per_hour": len(eps) / max(rollout_s, 1e-9) * 3600}
        append_metrics(out / "metrics.jsonl", record)
        progress(what, cfg.episodes_per_step, cfg.episodes_per_step, record)
    return read_metrics(out / "metrics.jsonl")
