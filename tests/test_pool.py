"""The pool: concurrency, back-pressure, time limits, replacement of dead or wedged workers, and the
real judge through it (CPU backend). Scheduling tests use scripted judges (tests/pool_fakes.py) in
real worker processes, so deaths and hangs are real."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import wait

import pytest

from cuda_agent.candidate import Candidate
from cuda_agent.judge import JudgeConfig, JudgeError
from cuda_agent.judge.verdict import FailureCategory
from cuda_agent.pool import Pool, PoolConfig, PoolError, PoolFull
from cuda_agent.tasks import Task
from cuda_agent.reward import reward_of

TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * {scale}

def get_inputs():
    return [torch.randn(4096)]

def get_init_inputs():
    return []
'''

SCRIPTED = "pool_fakes:ScriptedJudge"


def task(i: int = 0) -> Task:
    return Task.from_source(TASK.format(scale=f"{i + 2}.0"), name=f"relu_x{i + 2}", level=1)


def scripted(*lines: str, tag: str = "") -> Candidate:
    return Candidate.from_source("class ModelNew:\n    pass\n" + "".join(f"# {ln}\n" for ln in lines) + f"# tag: {tag}\n")


@pytest.fixture
def config(tmp_path) -> JudgeConfig:
    return JudgeConfig(device="cpu", compile_mode="none", cache_dir=tmp_path / "cache")


def scripted_pool(config, **kw) -> Pool:
    return Pool(config, PoolConfig(judge_factory=SCRIPTED, compile_workers=0, **kw))


def test_judge_workers_run_in_parallel_and_verdicts_come_back(config):
    with scripted_pool(config, judge_workers=2) as pool:
        pool.wait_ready(120)
        # Two tasks, two candidates each: each task's first candidate runs alone, then both run.
        futures = [pool.submit(task(i % 2), scripted("sleep: 1.0", "runtime: 0.5", tag=str(i))) for i in range(4)]
        verdicts = [f.result(timeout=120) for f in futures]
    assert all(v.correct and v.speedup_vs_eager == pytest.approx(4.0) for v in verdicts)
    assert len({v.phase_s["pid"] for v in verdicts}) == 2, "both workers judged"
    # in parallel: runs of the two workers overlapped (whatever the machine's load did to their starts)
    runs = [(v.phase_s["started_at"], v.phase_s["ended_at"], v.phase_s["pid"]) for v in verdicts]
    assert any(s1 < e2 and s2 < e1 for s1, e1, p1 in runs for s2, e2, p2 in runs if p1 != p2), runs
    assert all("pool_queue" in v.phase_s for v in verdicts)


def test_a_tasks_first_candidate_runs_alone(config):
    """The first candidate of a task measures its baselines; the others wait for it, then share them."""
    with scripted_pool(config, judge_workers=2) as pool:
        pool.wait_ready(120)
        futures = [pool.submit(task(0), scripted("sleep: 0.5", tag=str(i))) for i in range(3)]
        first, *rest = [f.result(timeout=120) for f in futures]
    assert all(v.phase_s["started_at"] >= first.phase_s["ended_at"] for v in rest)
    # the rest ran together: each started before the other ended (run in turn, one would start only
    # after the other's 0.5 s), however slowly a loaded machine starts them
    a, b = (v.phase_s for v in rest)
    assert a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"], "the rest ran in turn"


def test_submit_blocks_when_the_queue_is_full(config):
    with scripted_pool(config, judge_workers=1, max_queue=1) as pool:
        pool.wait_ready(120)
        running = pool.submit(task(0), scripted("sleep: 1.5", tag="a"))
        deadline = time.monotonic() + 10
        while not running.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        queued = pool.submit(task(0), scripted(tag="b"))      # fills the queue
        with pytest.raises(PoolFull):
            pool.submit(task(0), scripted(tag="c"), timeout=0.3)
        t0 = time.monotonic()
        third = pool.submit(task(0), scripted(tag="c"))       # waits for room, then goes in
        assert time.monotonic() - t0 > 0.5
        assert all(f.result(timeout=60).correct for f in (running, queued, third))


def test_a_wedged_worker_is_replaced_and_the_candidate_times_out(config):
    with scripted_pool(config, judge_workers=1, time_limit_s=1.5, baseline_allowance_s=0) as pool:
        pool.wait_ready(120)
        hung = pool.submit(task(0), scripted("hang"))
        after = pool.submit(task(0), scripted(tag="after"))
        v = hung.result(timeout=120)
        assert not v.correct and v.failure.category == FailureCategory.TIMEOUT and reward_of(v).value == -1
        assert "time limit" in v.failure.message
        w = after.result(timeout=120)
        assert w.correct, "the replacement worker judges the next candidate"
        stats = pool.stats()
    assert stats.timeouts == 1 and stats.worker_starts == 2


def test_a_worker_that_dies_is_replaced_and_the_candidate_retried(config, tmp_path, death="killed by signal SIGKILL"):
    # `death`: how the transport reports a worker it lost (test_pool_ray passes Ray's words)
    with scripted_pool(config, judge_workers=1) as pool:
        pool.wait_ready(120)
        once = pool.submit(task(0), scripted(f"die-once: {tmp_path / 'died'}"))
        always = pool.submit(task(1), scripted("die"))
        v_once, v_always = once.result(timeout=180), always.result(timeout=180)
        stats = pool.stats()
    assert v_once.correct, "a death that does not repeat is not the candidate's"
    assert not v_always.correct and v_always.failure.category == FailureCategory.CRASH
    assert death in v_always.failure.message
    assert stats.retries == 2 and stats.worker_deaths == 3


def test_judge_errors_reach_the_future(config):
    with scripted_pool(config, judge_workers=1) as pool:
        bad = pool.submit(task(0), scripted("judge-error"))
        good = pool.submit(task(1), scripted())
        with pytest.raises(JudgeError, match="reference does not import"):
            bad.result(timeout=120)
        assert good.result(timeout=120).correct


def test_a_judge_that_cannot_start_breaks_the_pool(config):
    pool = Pool(config, PoolConfig(judge_factory="pool_fakes:BrokenJudge", compile_workers=0))
    try:
        with pytest.raises(PoolError, match="CUDA is not available"):
            pool.wait_ready(180)
        with pytest.raises(PoolError):
            pool.submit(task(0), scripted())
    finally:
        pool.shutdown()


def test_shutdown_without_waiting_cancels_and_fails_what_is_left(config):
    pool = scripted_pool(config, judge_workers=1)
    pool.wait_ready(120)
    running = pool.submit(task(0), scripted("sleep: 30"))
    waiting = pool.submit(task(1), scripted())
    deadline = time.monotonic() + 10
    while not running.running() and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    pool.shutdown(wait=False)
    assert time.monotonic() - t0 < 15
    assert waiting.cancelled()
    with pytest.raises(PoolError):
        running.result(timeout=1)


def test_cuda_without_a_gpu_is_a_judge_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(JudgeError, match="no GPU"):
        Pool(JudgeConfig(device="cuda", cache_dir=tmp_path), PoolConfig(judge_factory=SCRIPTED))


def test_a_candidate_out_of_gpu_memory_beside_other_judges_is_judged_again_alone(tmp_path, monkeypatch):
    """Judges that share a GPU share its memory: a candidate whose judging ran out of it is judged
    again, once, alone on the GPU: the judge beside it finishes what it holds first, nothing else
    starts there meanwhile, and the verdict says so (scripted judges; the placement is told of one GPU)."""
    from cuda_agent import host
    from cuda_agent.pool.pool import ALONE_NOTE

    monkeypatch.setattr(host, "visible_gpus", lambda: ["0"])
    config = JudgeConfig(device="cuda", compile_mode="none", cache_dir=tmp_path / "cache")
    marker = tmp_path / "ran-out"
    with Pool(config, PoolConfig(judge_factory=SCRIPTED, compile_workers=0, judges_per_gpu=2)) as pool:
        pool.wait_ready(120)
        while pool.workers_ready()["judge"] < 2:
            time.sleep(0.05)
        beside = pool.submit(task(0), scripted("sleep: 1.5", tag="beside"))
        ran_out = pool.submit(task(1), scripted("sleep: 0.3", f"oom-once: {marker}", tag="oom"))
        later = pool.submit(task(2), scripted("sleep: 0.3", tag="later"))
        vb, vo, vl = (f.result(timeout=120) for f in (beside, ran_out, later))
        stats = pool.stats()
    assert marker.exists() and stats.alone_retries == 1
    assert vo.correct and ALONE_NOTE in vo.notes and not any(ALONE_NOTE in v.notes for v in (vb, vl))
    alone = (vo.phase_s["started_at"], vo.phase_s["ended_at"])
    assert vb.phase_s["ended_at"] <= alone[0], "the judge beside it finished first"
    assert vl.phase_s["started_at"] >= alone[1], "nothing started on the GPU while it was judged alone"


def test_only_gpu_memory_beside_others_is_judged_again(tmp_path, monkeypatch):
    """One judge on its GPU: running out of memory is the candidate's own verdict, judged once."""
    from cuda_agent import host

    monkeypatch.setattr(host, "visible_gpus", lambda: ["0"])
    config = JudgeConfig(device="cuda", compile_mode="none", cache_dir=tmp_path / "cache")
    with Pool(config, PoolConfig(judge_factory=SCRIPTED, compile_workers=0)) as pool:
        verdict = pool.submit(task(0), scripted(f"oom-once: {tmp_path / 'ran-out'}")).result(timeout=120)
        assert pool.stats().alone_retries == 0
    assert verdict.failure is not None and verdict.failure.category == FailureCategory.JUDGE
    assert "CUDA out of memory" in verdict.failure.message


LENIENT_SOLUTION = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) * {scale}
'''


@pytest.mark.slow
def test_real_judge_through_the_pool_keeps_baselines_in_the_database(tmp_path):
    """The real judge in a worker: verdicts come back, baselines land in SQLite, and a second pool
    (a later run) takes them from there instead of measuring again."""
    db = tmp_path / "results.sqlite"
    cfg = JudgeConfig(device="cpu", policy="lenient", compile_mode="none", n_timed=3, cache_dir=tmp_path / "cache")
    tasks = [task(0), task(1)]
    cands = [Candidate.from_source(LENIENT_SOLUTION.format(scale=f"{i + 2}.0")) for i in range(2)]
    wrong = Candidate.from_source(LENIENT_SOLUTION.format(scale="9.0"))
    with Pool(cfg, PoolConfig(baseline_db=db, compile_workers=0)) as pool:
        futures = [pool.submit(t, c) for t, c in zip(tasks, cands)] + [pool.submit(tasks[0], wrong)]
        wait(futures, timeout=600)
        first = [f.result() for f in futures]
    assert first[0].correct and first[1].correct, [v.failure for v in first]
    assert not first[2].correct and first[2].failure.category == FailureCategory.MISMATCH
    with sqlite3.connect(db) as conn:
        modes = sorted(m for (m,) in conn.execute("SELECT mode FROM baselines"))
    assert modes == ["eager", "eager", "null", "null"]
    with Pool(cfg, PoolConfig(baseline_db=db, compile_workers=0)) as pool:
        again = pool.submit(tasks[0], cands[0]).result(timeout=600)
    assert again.correct and again.eager == first[0].eager, "the stored eager baseline was reused"


def test_baselines_are_per_gpu_model(config):
    """A task's first candidate runs alone on each GPU model: the other model measures its own baselines."""
    with Pool(config, PoolConfig(judge_factory="pool_fakes:TwoModelJudge", compile_workers=0, judge_workers=2)) as pool:
        pool.wait_ready(120)
        deadline = time.monotonic() + 120
        while pool.workers_ready()["judge"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.device_names() == ["model 0", "model 1"]
        futures = [pool.submit(task(0), scripted("sleep: 1.0", tag=str(i))) for i in range(2)]
        a, b = [f.result(timeout=120) for f in futures]
    assert {a.device_name, b.device_name} == {"model 0", "model 1"}
    # at once: each started before the other's 1 s ended (one after the other, they could not overlap)
    assert a.phase_s["started_at"] < b.phase_s["ended_at"] and b.phase_s["started_at"] < a.phase_s["ended_at"], \
        "each model's first candidate ran at once"
