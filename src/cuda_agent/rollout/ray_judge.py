"""The judge of a Ray cluster's node: one `JudgeActor` per node, reached through `RayEvaluator`.

Every rollout worker of a node sends its candidates to the node's actor (`judge_actor`), whose
pool keeps its GPUs and compile workers busy. Tasks, candidates and verdicts cross as JSON.

GPUs: `judge_actor(..., gpus=N)` asks Ray for N GPUs of the node. Ray then sets the actor's
`CUDA_VISIBLE_DEVICES` to those N, and the pool starts its judges there only, away from the GPUs
the rollout engines and the trainer hold (verl reserves its `trainer.n_gpus_per_node` GPUs per node
through Ray too, so Ray keeps the two sets apart). With `gpus=0` Ray leaves `CUDA_VISIBLE_DEVICES`
alone and the pool times candidates on every GPU of the node, the training's included: the speed
tiers of the reward then rest on timings taken on busy GPUs. Every verdict says which it was (a
note, and `RayEvaluator.gpu_shared`).
This module imports Ray only inside its functions and never imports verl, so it works (and is
tested) with Ray alone; verl's agent loop (`cuda_agent.train.verl_loop`) uses it.
"""

from __future__ import annotations

from cuda_agent.candidate import Candidate
from cuda_agent.judge import JudgeConfig, Verdict
from cuda_agent.tasks import Task

from .evaluator import LocalEvaluator


def _ray_gpu_ids() -> list[str]:
    """The GPUs Ray reserved for this process ([] outside Ray or without a GPU request)."""
    try:
        import ray

        return [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else []
    except ImportError:
        return []


def gpu_note(device: str, gpus: list[str]) -> str:
    """The verdict's note on where it was timed."""
    if device != "cuda":
        return f"judge gpu: none ({device} backend)"
    if gpus:
        return f"judge gpu: dedicated (Ray GPUs {','.join(gpus)}, reserved for the judge)"
    return "judge gpu: shared (no GPU reserved for the judge; timings may include training's load)"


class JudgeActor:
    """The judge pool of one node, as a Ray actor (`ray.remote(JudgeActor)`, see `judge_actor`)."""

    def __init__(self, judge: dict, pool: dict | None = None):
        from cuda_agent.pool import Pool, PoolConfig

        config = JudgeConfig(**judge)
        self.gpus = _ray_gpu_ids()
        self.shared = config.device == "cuda" and not self.gpus
        self.note = gpu_note(config.device, self.gpus)
        self.pool = Pool(config, PoolConfig(**(pool or {})))

    def placement(self) -> dict:
        """Where this actor times: {"gpus": Ray's GPU ids, "shared": bool, "note": str}."""
        return {"gpus": self.gpus, "shared": self.shared, "note": self.note}

    def evaluate(self, task_json: str, candidate_json: str) -> str:
        verdict = self.pool.submit(Task.model_validate_json(task_json),
                                   Candidate.model_validate_json(candidate_json)).result()
        if self.note not in verdict.notes:
            verdict = verdict.model_copy(update={"notes": [*verdict.notes, self.note]})
        return verdict.model_dump_json()

    def stats(self) -> dict:
        return self.pool.stats().model_dump()

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def judge_actor(judge: dict, pool: dict | None = None, *, gpus: int = 0, max_concurrency: int = 256):
    """This node's JudgeActor, created on first use and pinned to the node; named per node, so every
    rollout worker there finds the same one (detached: it outlives the worker that made it). `gpus`:
    the node's GPUs reserved for the judge through Ray (0: none, it shares the node's GPUs)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if gpus < 0:
        raise ValueError(f"judge gpus must be 0 or more, got {gpus}")
    if gpus and judge.get("device", "cuda") != "cuda":
        raise ValueError(f"judge gpus={gpus} asked for a {judge.get('device')!r} judge: "
                         "only the cuda backend uses GPUs")
    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(JudgeActor).options(
        name=f"cuda_agent_judge_{node}", get_if_exists=True, lifetime="detached", num_cpus=0, num_gpus=gpus,
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
        self._placement: dict | None = None

    @property
    def gpu_shared(self) -> bool:
        """Whether the node's judge times on GPUs not reserved for it (asked once of the actor)."""
        if self._placement is None:
            import ray

            self._placement = ray.get(self.actor.placement.remote())
        return bool(self._placement["shared"])

    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        import ray

        return Verdict.model_validate_json(ray.get(self.actor.evaluate.remote(task.model_dump_json(),
                                                                             candidate.model_dump_json())))
