"""The second learning check's PPO dynamics in minutes on a CPU: the `calls` toy (five tool-call
tokens, a reply a sampled sequence of them) with the product's engine, tools, policy and trainer,
but a scripted judge that knows the solution and a two-line prompt instead of the agent's 6k-token
one. What it answers: how many episodes a step and how many steps the check needs to rise clearly,
apart from the cost of the real judge and the long prompt (`cuda-agent train toy --kind calls`
measures those). Prints one JSON line: the mean reward and the policy's entropy per step.

    python benchmarks/calls_check_sim.py OUT --steps 20 --episodes 16 --seed 0
    python benchmarks/calls_check_sim.py OUT -c optim.actor_lr=1e-3 -c ppo.epochs=1
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from importlib.resources import files
from pathlib import Path

import torch

import cuda_agent.rollout.engine as engine_module
import cuda_agent.train.episode as episode_module
from cuda_agent.judge.builds import BuildOutcome
from cuda_agent.judge.verdict import Failure, FailureCategory, Timing, Verdict
from cuda_agent.settings import apply_overrides
from cuda_agent.train.config import TrainConfig
from cuda_agent.train.stages import rollout_stage
from cuda_agent.train.toy import TASK, build_toy


def short_prompt(task, device: str) -> list[dict]:
    return [{"role": "system", "content": "You write kernels with tools."},
            {"role": "user", "content": f"Task {task.name}: write model_new.py and its kernels, then submit."}]


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, p10_ms=ms, p90_ms=ms, std_ms=0.0, n=5, source="cpu")


class SolutionJudge:
    """An `Evaluator` that calls a candidate correct (twice as fast as eager: reward 2) exactly when
    its files are the bundled solution's, as the real judge does for this toy's five replies."""

    device = "cpu"
    local = True

    def __init__(self):
        root = files("cuda_agent") / "suite" / "solutions" / "cpu" / TASK
        self.model_new = (root / "model_new.py").read_text()
        self.kernels = {"rmsnorm.cpp": (root / "kernels" / "rmsnorm.cpp").read_text(),
                        "rmsnorm_binding.cpp": (root / "kernels" / "rmsnorm_binding.cpp").read_text()}
        self._lock = threading.Lock()

    def evaluate(self, task, cand) -> Verdict:
        ok = cand.model_new == self.model_new and all(dict(cand.kernels).get(k) == v for k, v in self.kernels.items())
        common = dict(task_id=task.id, task_name=task.name, candidate_hash=cand.hash, device="cpu", compiled=True)
        if ok:
            return Verdict(**common, correct=True, runtime=_timing(1.0), eager=_timing(2.0))
        return Verdict(**common, failure=Failure(category=FailureCategory.MISMATCH, message="not the solution"))

    def build(self, cand, task) -> BuildOutcome:
        return BuildOutcome(compiled=True)

    def exclusive(self):
        return self._lock

    def close(self) -> None:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for the toy and its run (replaced)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--episodes", type=int, default=16, help="episodes a step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-c", dest="overrides", action="append", default=[], help="a training setting, KEY=VALUE")
    a = p.parse_args()
    torch.set_num_threads(1)
    engine_module.agentic_messages = short_prompt    # the engine's and the context check's prompt
    episode_module.agentic_messages = short_prompt
    settings = json.loads(build_toy(a.out, kind="calls", seed=a.seed, steps=a.steps).read_text())["train"]
    settings.update(episodes_per_step=a.episodes, judge_memo=False)
    cfg = TrainConfig.model_validate(apply_overrides(settings, a.overrides, TrainConfig))
    t0 = time.monotonic()
    metrics = rollout_stage(cfg, a.out / "run", SolutionJudge(), mode="agentic")
    print(json.dumps({"seed": a.seed, "episodes": a.episodes, "overrides": a.overrides,
                      "reward_mean": [m["reward_mean"] for m in metrics],
                      "entropy": [round(m["entropy"], 3) for m in metrics],
                      "seconds": round(time.monotonic() - t0)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
