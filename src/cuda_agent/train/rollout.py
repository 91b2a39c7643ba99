"""Rollouts of a training step: tasks, the judge behind the tools, models, episodes in flight, and
what a step writes (episodes JSONL, a metrics line).

The judge is any `cuda_agent.rollout.evaluator.Evaluator`: for training a `PoolEvaluator` (the
tools' judge calls go to a `cuda_agent.pool.Pool` whose futures are awaited by the episode's
thread, so many episodes wait on the judge at once while the pool keeps its GPUs busy; builds for
the `compile` tool use a judge of this process, as in `solve`), often wrapped in a `MemoEvaluator`
(an identical (task, candidate) judged once per run). Each agentic episode's Toolbox scores with
the run's `cfg.reward`, so the reward the model reads is the reward it is trained on.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from cuda_agent.agent.tools import Toolbox
from cuda_agent.agent.workspace import create_workspace
from cuda_agent.judge import JudgeError
from cuda_agent.rollout.evaluator import Evaluator
from cuda_agent.rollout.outcome import JudgeFailure
from cuda_agent.tasks import Task, load_tasks

from .config import TrainConfig
from .episode import ChatRenderer, EpisodeRecord, TokenPolicy, run_agentic_episode, run_single_turn_episode


def select_tasks(cfg: TrainConfig) -> list[Task]:
    tasks = load_tasks(cfg.tasks, cfg.levels or None)
    if not tasks:
        raise ValueError(f"{cfg.tasks}: no tasks")
    random.Random(cfg.seed).shuffle(tasks)
    return tasks[: cfg.limit] if cfg.limit else tasks


def step_tasks(tasks: list[Task], step: int, n: int, group_size: int = 1) -> list[Task]:
    """The `n` episodes' tasks of step `step`: n / group_size distinct tasks of the seeded order,
    walked round-robin, each repeated `group_size` times in a row (GRPO/RLOO compare the episodes of
    one task within a step)."""
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} episodes per step cannot be split into groups of {group_size}")
    distinct = n // group_size
    return [tasks[(step * distinct + i) % len(tasks)] for i in range(distinct) for _ in range(group_size)]


def run_episodes(tasks: list[Task], *, mode: str, gate: Evaluator, policy: TokenPolicy, renderer: ChatRenderer,
                 cfg: TrainConfig, step: int, workdir: Path, on_done: Callable[[EpisodeRecord], None] | None = None
                 ) -> tuple[list[EpisodeRecord], list[str]]:
    """Run one episode per task, `cfg.concurrency` at a time. Returns the episodes (in task order)
    and the messages of episodes the judge could not serve (they are left out of the batch)."""
    failures: list[str] = []

    def one(i: int, task: Task) -> EpisodeRecord | None:
        eid = f"s{step:06d}-e{i:04d}"
        try:
            if mode == "single_turn":
                return run_single_turn_episode(task, gate, policy, renderer, cfg.episode, cfg.reward,
                                               step=step, episode_id=eid)
            ws = workdir / eid
            shutil.rmtree(ws, ignore_errors=True)
            create_workspace(task, ws, gate.device)
            box = Toolbox(task, ws, gate, reward=cfg.reward)   # the run's reward, shown and trained on
            try:
                return run_agentic_episode(task, box, policy, renderer, cfg.episode, step=step, episode_id=eid)
            finally:
                box.close()
                if not cfg.episode.keep_workspace:
                    remove_workspace(ws)
        except (JudgeFailure, JudgeError) as exc:   # the judge could not work: the episode measures nothing
            failures.append(f"{task.name}: {exc}")
            return None

    with ThreadPoolExecutor(max_workers=cfg.concurrency) as ex:
        futures = [ex.submit(one, i, t) for i, t in enumerate(tasks)]
        out = []
        for f in futures:
            ep = f.result()
            if ep is not None:
                out.append(ep)
                if on_done is not None:
                    on_done(ep)
    return out, failures


def remove_workspace(path: Path) -> None:
    """Delete an episode's workspace, its read-only files included."""
    for p in [path, *path.rglob("*")]:   # the read-only files of a workspace
        try:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Storage


def write_episodes(eps: list[EpisodeRecord], path: Path) -> None:
    """Write a step's episodes beside their final name and rename: a file is whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as fh:
        for ep in eps:
            fh.write(ep.model_dump_json() + "\n")
    os.replace(tmp, path)


def read_episodes(paths: list[str | Path]) -> list[EpisodeRecord]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.glob("*.jsonl"))
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such episode file or folder")
    eps = []
    for f in files:
        with f.open() as fh:
            eps += [EpisodeRecord.model_validate_json(line) for line in fh if line.strip()]
    return eps


def append_metrics(path: Path, record: dict) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def episode_metrics(eps: list[EpisodeRecord]) -> dict:
    """What a person plots per step: reward mean and distribution, pass rate, speed-ups, turns,
    tokens, and where the time went."""
    if not eps:
        return {"episodes": 0}
    rewards = [e.reward for e in eps]
    correct = [e for e in eps if e.correct]
    sp_e = [e.verdict["speedup_vs_eager"] for e in correct if e.verdict.get("speedup_vs_eager")]
    sp_c = [e.verdict["speedup_vs_compile"] for e in correct if e.verdict.get("speedup_vs_compile")]

    def geomean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None

    return {
        "episodes": len(eps), "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "reward_counts": {f"{k:g}": v for k, v in sorted(Counter(rewards).items())},
        "pass_rate": len(correct) / len(eps), "speedup_vs_eager_geomean": geomean(sp_e),
        "speedup_vs_compile_geomean": geomean(sp_c), "turns_mean": statistics.fmean(e.turns for e in eps),
        "model_tokens_mean": statistics.fmean(e.model_tokens for e in eps),
        "response_tokens_mean": statistics.fmean(len(e.response_ids) for e in eps),
        "terminations": dict(Counter(e.termination for e in eps)),
        "malformed_calls": sum(e.malformed_calls for e in eps),
        "generate_s": sum(e.generate_s for e in eps), "tool_s": sum(e.tool_s for e in eps),
        "judge_s": sum(e.judge_s for e in eps),
        "judge_s_per_episode": statistics.fmean(e.judge_s for e in eps),
    }
