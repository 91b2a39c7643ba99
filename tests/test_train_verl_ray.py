"""The judge on its own GPUs (rollout/ray_judge.py) on a local Ray instance that declares two GPUs
(`ray.init(num_gpus=2)`; Ray assigns declared GPUs as it would real ones): a judge actor that asks
for one gets one, its pool's judge is started on that GPU only, and every verdict says the GPU was
the judge's own. The judges are scripted stand-ins (tests/pool_fakes.py), so no CUDA is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from cuda_agent.judge import JudgeConfig  # noqa: E402
from cuda_agent.rollout.ray_judge import RayEvaluator, judge_actor  # noqa: E402
from test_pool import scripted, task  # noqa: E402

TESTS = Path(__file__).resolve().parent


def test_a_judge_actor_with_gpus_times_on_its_own(tmp_path):
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(TESTS)}})
    try:
        config = JudgeConfig(device="cuda", compile_mode="none", cache_dir=tmp_path / "cache")
        actor = judge_actor(config.model_dump(mode="json"),
                            {"judge_factory": "pool_fakes:ScriptedJudge", "compile_workers": 0}, gpus=1)
        try:
            placement = ray.get(actor.placement.remote())
            assert len(placement["gpus"]) == 1 and placement["shared"] is False
            ev = RayEvaluator(actor, config)
            assert ev.gpu_shared is False
            verdict = ev.evaluate(task(), scripted("correct"))
            assert verdict.correct
            assert any(n.startswith("judge gpu: dedicated") and placement["gpus"][0] in n for n in verdict.notes)
            assert ray.get(actor.stats.remote())["worker_starts"] == 1   # one judge, on the one GPU it has
        finally:
            ray.kill(actor)
    finally:
        ray.shutdown()
