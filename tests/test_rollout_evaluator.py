"""The Evaluator protocol: every way of reaching the judge passes one conformance check
(`check_evaluator`, Gymnasium's `check_env` idea). The scripted checks are fast; the local judge,
the pool, the memo wrapper, the service on loopback and the Ray actor judge a bundled CPU solution
for real (slow tier: they build C++)."""

from __future__ import annotations

import contextlib
import threading

import pytest

from conftest import judge_cache_dir
from cuda_agent.candidate import Candidate
from cuda_agent.judge import JudgeConfig
from cuda_agent.judge.builds import BuildOutcome
from cuda_agent.rollout.evaluator import (Evaluator, EvaluatorCheckError, LocalEvaluator, MemoEvaluator,
                                          PoolEvaluator, check_evaluator)
from cuda_agent.suite import suite_solutions, suite_tasks
from cuda_agent.tasks import Task

from train_fakes import verdict

NAME = "6_Batched_Transpose"   # a single-file CPU solution: one small build


@pytest.fixture(scope="module")
def cpu_case() -> tuple[Task, Candidate, Candidate]:
    task = next(t for t in suite_tasks("cpu") if t.name == NAME)
    honest = Candidate.from_path(suite_solutions("cpu")[NAME])
    line = "return transpose_cpu.batched_transpose_forward(x)"
    assert line in honest.model_new
    # the same kernel (a build cache hit), an output that is not the reference's
    broken = Candidate.from_source(honest.model_new.replace(line, line + ".flip(0)"))
    return task, honest, broken


@pytest.fixture(scope="module")
def judge_config(tmp_path_factory) -> JudgeConfig:
    return JudgeConfig(device="cpu", compile_mode="none", n_timed=5,
                       cache_dir=judge_cache_dir(tmp_path_factory))


# ---------------------------------------------------------------------------------------------
# The check itself, on scripted evaluators (fast)


class Scripted:
    """A conforming evaluator without a judge: a candidate whose source says GOOD is correct."""

    device = "cpu"
    local = True

    def __init__(self):
        self.calls = 0
        self.closed = 0
        self._lock = threading.Lock()

    def evaluate(self, task, cand):
        self.calls += 1
        return verdict(task, cand, correct="GOOD" in cand.model_new)

    def build(self, cand, task):
        return BuildOutcome(compiled=True)

    def exclusive(self):
        return self._lock

    def close(self):
        self.closed += 1


def scripted_case() -> tuple[Task, Candidate, Candidate]:
    from agent_server import RELU_TASK

    return (Task.from_source(RELU_TASK, name="relu"), Candidate.from_source("# GOOD\nclass ModelNew: pass\n"),
            Candidate.from_source("# bad\nclass ModelNew: pass\n"))


def test_a_conforming_evaluator_passes_and_is_closed_twice():
    ev = Scripted()
    check_evaluator(ev, *scripted_case())
    assert ev.closed == 2 and ev.calls == 2


@pytest.mark.parametrize("breakage, message", [
    (lambda ev: setattr(ev, "device", "gpu"), "device is 'gpu'"),
    (lambda ev: setattr(ev, "local", "yes"), "local is 'yes'"),
    (lambda ev: setattr(ev, "evaluate", lambda task, cand: verdict(task, cand, correct=True)),
     "broken candidate was judged correct"),
    (lambda ev: setattr(ev, "evaluate", lambda task, cand: {"correct": True}), "expected Verdict"),
    (lambda ev: setattr(ev, "build", lambda cand, task: BuildOutcome(compiled=False)), "did not build"),
    (lambda ev: setattr(ev, "exclusive", lambda: None), "not a context manager"),
    (lambda ev: setattr(ev, "close", None), "lacks part of the Evaluator"),
], ids=["device", "local", "lenient", "untyped", "build", "exclusive", "protocol"])
def test_the_check_names_what_an_evaluator_breaks(breakage, message):
    ev = Scripted()
    breakage(ev)
    with pytest.raises(EvaluatorCheckError, match=message):
        check_evaluator(ev, *scripted_case())


def test_the_memo_judges_an_identical_pair_once_and_is_an_evaluator():
    inner = Scripted()
    memo = MemoEvaluator(inner)
    assert isinstance(memo, Evaluator) and memo.device == "cpu" and memo.local is True
    task, good, bad = scripted_case()
    first = memo.evaluate(task, good)
    assert memo.evaluate(task, good) is first and memo.hits == 1 and inner.calls == 1
    assert not memo.evaluate(task, bad).correct and inner.calls == 2
    with memo.exclusive():   # the inner evaluator's lock
        assert inner._lock.locked()
    check_evaluator(MemoEvaluator(Scripted()), task, good, bad)


# ---------------------------------------------------------------------------------------------
# Every implementation, judging for real (slow tier)


@pytest.mark.slow
def test_local_evaluator_conforms(cpu_case, judge_config):
    check_evaluator(LocalEvaluator(judge_config), *cpu_case)


@pytest.mark.slow
def test_memo_over_local_conforms(cpu_case, judge_config):
    check_evaluator(MemoEvaluator(LocalEvaluator(judge_config)), *cpu_case)


@pytest.mark.slow
def test_pool_evaluator_conforms(cpu_case, judge_config):
    from cuda_agent.pool import Pool, PoolConfig

    with Pool(judge_config, PoolConfig(judge_workers=1, compile_workers=0)) as pool:
        check_evaluator(PoolEvaluator(pool, judge_config), *cpu_case)


@pytest.mark.slow
def test_remote_evaluator_conforms(cpu_case, judge_config, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from test_serve import TOKEN, LoopbackServer

    from cuda_agent.pool import PoolConfig
    from cuda_agent.rollout.remote import RemoteEvaluator
    from cuda_agent.serve.client import ClientConfig, JudgeClient
    from cuda_agent.serve.service import JudgeService, ServiceConfig

    service = JudgeService(judge_config, PoolConfig(compile_workers=0, judge_workers=1),
                           ServiceConfig(db=tmp_path / "results.sqlite"))
    server = LoopbackServer(service)
    try:
        client = JudgeClient(server.url, TOKEN, run="conformance", config=ClientConfig(poll_wait_s=5))
        assert client.wait_ready(120)
        ev = RemoteEvaluator(client, url=server.url)
        assert ev.local is False
        check_evaluator(ev, *cpu_case)
    finally:
        server.stop()
        with contextlib.suppress(Exception):
            service.close()


@pytest.mark.slow
def test_ray_evaluator_conforms(cpu_case, judge_config):
    ray = pytest.importorskip("ray")
    from cuda_agent.rollout.ray_judge import RayEvaluator, judge_actor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = judge_actor(judge_config.model_dump(mode="json"), {"judge_workers": 1, "compile_workers": 0})
        try:
            check_evaluator(RayEvaluator(actor, judge_config), *cpu_case)
            assert ray.get(actor.stats.remote())["judged"] >= 2
        finally:
            ray.kill(actor)
    finally:
        ray.shutdown()


def _sabotaged(honest: Candidate) -> Candidate:
    """The honest candidate with every output shifted by one: it loads and builds like the honest
    one, and is wrong (a mismatch, or a policy failure for the PyTorch op)."""
    wrapper = ("\n\n_honest_forward = ModelNew.forward\n\n\ndef _shifted(self, *args):\n"
               "    return _honest_forward(self, *args) + 1\n\n\nModelNew.forward = _shifted\n")
    return Candidate.from_source(honest.model_new + wrapper)


@pytest.mark.gpu
@pytest.mark.slow
def test_local_and_pool_evaluators_conform_on_cuda(tmp_path_factory):
    from cuda_agent.pool import Pool, PoolConfig

    name = "10_RMSNorm"   # a single-file CUDA solution
    task = next(t for t in suite_tasks("cuda") if t.name == name)
    honest = Candidate.from_path(suite_solutions("cuda")[name])
    config = JudgeConfig(device="cuda", compile_mode="none", n_timed=10,
                         cache_dir=judge_cache_dir(tmp_path_factory))
    check_evaluator(LocalEvaluator(config), task, honest, _sabotaged(honest))
    with Pool(config, PoolConfig(judge_workers=1, compile_workers=0)) as pool:
        check_evaluator(MemoEvaluator(PoolEvaluator(pool, config)), task, honest, _sabotaged(honest))


class JudgeBreaks(Scripted):
    """The judge's own failure (FailureCategory.JUDGE: its worker died before the candidate's code
    ran, the GPU out of memory at set-up) for the first `breaks` verdicts, then the real one."""

    def __init__(self, breaks: int):
        super().__init__()
        self.breaks = breaks

    def evaluate(self, task, cand):
        from cuda_agent.judge import FailureCategory

        if self.breaks > 0:
            self.breaks -= 1
            self.calls += 1
            return verdict(task, cand, correct=False, category=FailureCategory.JUDGE)
        return super().evaluate(task, cand)


def test_a_verdict_on_the_judges_own_failure_is_asked_again_then_raised_never_scored():
    from cuda_agent.judge import JudgeError
    from cuda_agent.rollout.evaluator import candidate_verdict

    task, good, _ = scripted_case()
    once = JudgeBreaks(1)
    assert candidate_verdict(once, task, good).correct and once.calls == 2   # passing: asked again
    always = JudgeBreaks(10)
    with pytest.raises(JudgeError, match="not the candidate's doing"):
        candidate_verdict(always, task, good, retries=2)
    assert always.calls == 3
    memo = MemoEvaluator(JudgeBreaks(1))   # the memo keeps verdicts on candidates only
    assert memo.evaluate(task, good).failure is not None
    assert memo.evaluate(task, good).correct and memo.hits == 0
    assert memo.evaluate(task, good).correct and memo.hits == 1


def test_the_tools_turn_the_judges_own_failure_into_a_judge_failure_not_a_reward(tmp_path):
    """The verify tool never shows (or scores) a verdict on the judge itself as the candidate's
    failure: the episode ends as JudgeFailure (dropped from training, retried by the runner)."""
    from cuda_agent.agent.tools import Toolbox
    from cuda_agent.agent.workspace import create_workspace
    from cuda_agent.rollout.outcome import JudgeFailure
    from cuda_agent.llm import ToolCall

    task, _, _ = scripted_case()
    create_workspace(task, tmp_path / "ws", "cpu")
    box = Toolbox(task, tmp_path / "ws", JudgeBreaks(10))
    with pytest.raises(JudgeFailure, match="not the candidate's doing"):
        box.step(ToolCall(id="c1", name="verify", raw_arguments="{}", arguments={}))
    box = Toolbox(task, tmp_path / "ws", JudgeBreaks(1))
    step = box.step(ToolCall(id="c1", name="verify", raw_arguments="{}", arguments={}))
    assert step.verdict is not None and step.verdict.failure.category.value == "mismatch" and step.reward.value == -1.0
