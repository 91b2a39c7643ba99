"""The judge of a Ray cluster's node: one `JudgeActor` per node, reached through `RayEvaluator`.

Every rollout worker of a node sends its candidates to the node's actor (`judge_actor`), whose
pool keeps the node's GPUs and compile workers busy. Tasks, candidates and verdicts cross as JSON.
This module imports Ray only inside its functions and never imports verl, so it works (and is
tested) with Ray alone; verl's agent loop (`cuda_agent.train.verl_loop`) uses it.
"""

from __future__ import annotations

from cuda_agent.candidate import Candidate
from cuda_agent.judge import JudgeConfig, Verdict
from cuda_agent.tasks import Task

from .evaluator import LocalEvaluator


class JudgeActor:
    """The judge pool of one node, as a Ray actor (`ray.remote(JudgeActor)`, see `judge_actor`)."""

    def __init__(self, judge: dict, pool: dict | None = None):
        from cuda_agent.pool import Pool, PoolConfig

        self.pool = Pool(JudgeConfig(**judge), PoolConfig(**(pool or {})))

    def evaluate(self, task_json: str, candidate_json: str) -> str:
        verdict = self.pool.submit(Task.model_validate_json(task_json),
                                   Candidate.model_validate_json(candidate_json)).result()
        return verdict.model_dump_json()

    def stats(self) -> dict:
        return self.pool.stats().model_dump()

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def judge_actor(judge: dict, pool: dict | None = None, *, max_concurrency: int = 256):
    """This node's JudgeActor, created on first use and pinned to the node; named per node, so every
    rollout worker there finds the same one (detached: it outlives the worker that made it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(JudgeActor).options(
        name=f"cuda_agent_judge_{node}", get_if_exists=True, lifetime="detached", num_cpus=0,
        max_concurrency=max_concurrency,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False))
    return actor.remote(judge, pool)


class RayEvaluator(LocalEvaluator):
    """Verdicts from a node's JudgeActor; builds for the `compile` tool use a judge in this process
    (compiling needs no device). The actor is shared by the node: `close` releases the local judge
    only (`ray.kill` the actor, or call its `shutdown`, to end it)."""

    def __init__(self, actor, config: JudgeConfig):
        super().__init__(config)
        self.actor = actor

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        import ray

        return Verdict.model_validate_json(ray.get(self.actor.evaluate.remote(task.model_dump_json(),
                                                                             candidate.model_dump_json())))
