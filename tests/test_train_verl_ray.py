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


@pytest.mark.gpu
def test_on_a_gpu_node_the_judge_gets_a_gpu_the_training_does_not(tmp_path):
    """As on a cluster node: the training's GPUs reserved in a placement group first (as verl's
    resource pool does), then the judge actor asks for one: Ray gives it one of the others."""
    import torch
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"needs 2 GPUs, {n} visible")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(TESTS)}})
    try:
        pg = placement_group([{"GPU": 1, "CPU": 0}] * (n - 1), strategy="STRICT_PACK")
        ray.get(pg.ready())

        @ray.remote(num_gpus=1, num_cpus=0)
        def gpu_ids():
            return [str(g) for g in ray.get_gpu_ids()]

        training = {g for i in range(n - 1) for g in ray.get(gpu_ids.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)).remote())}
        config = JudgeConfig(device="cuda", compile_mode="none", cache_dir=tmp_path / "cache")
        actor = judge_actor(config.model_dump(mode="json"),
                            {"judge_factory": "pool_fakes:ScriptedJudge", "compile_workers": 0}, gpus=1)
        try:
            placement = ray.get(actor.placement.remote())
            assert len(placement["gpus"]) == 1 and not set(placement["gpus"]) & training, (placement, training)
            assert RayEvaluator(actor, config).gpu_shared is False
        finally:
            ray.kill(actor)
    finally:
        ray.shutdown()
