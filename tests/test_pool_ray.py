"""The pool's scheduling tests again, with its workers as Ray actors on a local Ray instance
(`ray.init(num_cpus=2)`): the same guarantees through `RayTransport` (parallel judges, a task's
first candidate alone, back-pressure, time limits, replacement of wedged and dead workers, one
retry, crash verdicts, judge errors, a judge that cannot start, shutdown), plus the baselines
that every judge actor reads and writes through the driver's results database. Skipped without Ray."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

import test_pool  # noqa: E402  (the local transport's tests, run here over Ray)
from test_pool import config, scripted, scripted_pool, task  # noqa: E402,F401

from cuda_agent.pool import Pool, PoolConfig, PoolError  # noqa: E402
from cuda_agent.pool import pool as pool_module  # noqa: E402
from cuda_agent.pool.ray_transport import RayTransport  # noqa: E402

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ray_transport():
    # Actors import the scripted judges from tests/ (pool_fakes), as local workers do through sys.path.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(TESTS)}})
    transport = RayTransport()
    try:
        yield transport
    finally:
        transport.close()
        ray.shutdown()


@pytest.fixture(autouse=True)
def pools_use_ray(ray_transport, monkeypatch):
    """Every Pool made in these tests (through test_pool's helpers too) gets the Ray transport."""
    monkeypatch.setattr(pool_module, "LocalTransport", lambda: ray_transport)


def test_placement_counts_the_clusters_cores(ray_transport):
    from cuda_agent.judge import JudgeConfig, JudgeError
    from cuda_agent.pool.transport import PlacementError

    cpu = JudgeConfig(device="cpu")
    assert ray_transport.placement(cpu, 2, 0).judges == 2
    with pytest.raises(PlacementError, match="2 CPUs"):
        ray_transport.placement(cpu, 3, 0)
    with pytest.raises(JudgeError, match="no GPU"):
        ray_transport.placement(JudgeConfig(device="cuda"), None, None)


def test_judge_workers_run_in_parallel_and_verdicts_come_back(config):
    test_pool.test_judge_workers_run_in_parallel_and_verdicts_come_back(config)


def test_a_tasks_first_candidate_runs_alone(config):
    test_pool.test_a_tasks_first_candidate_runs_alone(config)


def test_baselines_are_per_gpu_model(config):
    test_pool.test_baselines_are_per_gpu_model(config)


def test_submit_blocks_when_the_queue_is_full(config):
    test_pool.test_submit_blocks_when_the_queue_is_full(config)


def test_a_wedged_actor_is_replaced_and_the_candidate_times_out(config):
    test_pool.test_a_wedged_worker_is_replaced_and_the_candidate_times_out(config)


def test_an_actor_that_dies_is_replaced_and_the_candidate_retried(config, tmp_path):
    test_pool.test_a_worker_that_dies_is_replaced_and_the_candidate_retried(config, tmp_path, death="Ray actor lost")


def test_an_actor_killed_while_idle_is_noticed_and_replaced(config, ray_transport):
    with scripted_pool(config, judge_workers=1) as pool:
        pool.wait_ready(120)
        assert pool.submit(task(0), scripted(tag="first")).result(timeout=120).correct
        slot = next(s for s in pool._slots if s.role == "judge")
        ray.kill(slot.handle.actor)     # as a node loss would
        deadline = time.monotonic() + 60
        while pool.stats().worker_deaths == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.stats().worker_deaths == 1, "the liveness ping saw the idle actor die"
        v = pool.submit(task(0), scripted(tag="after")).result(timeout=120)
        stats = pool.stats()
    assert v.correct and stats.retries == 0 and stats.worker_starts == 2


def test_judge_errors_reach_the_future(config):
    test_pool.test_judge_errors_reach_the_future(config)


def test_a_judge_that_cannot_start_breaks_the_pool(config):
    test_pool.test_a_judge_that_cannot_start_breaks_the_pool(config)


def test_shutdown_without_waiting_cancels_and_fails_what_is_left(config):
    test_pool.test_shutdown_without_waiting_cancels_and_fails_what_is_left(config)


def test_baselines_go_through_the_drivers_database(config, tmp_path):
    """Judge actors read and write baselines through one actor holding the driver's results database:
    the first candidate stores the task's baseline, a later one on another actor finds it."""
    db = tmp_path / "results.sqlite"
    with Pool(config, PoolConfig(judge_factory=test_pool.SCRIPTED, compile_workers=0, judge_workers=2,
                                 baseline_db=db)) as pool:
        first = pool.submit(task(0), scripted("baseline", tag="a")).result(timeout=120)
        rest = [pool.submit(task(0), scripted("baseline", "sleep: 0.5", tag=str(i))) for i in range(2)]
        rest = [f.result(timeout=120) for f in rest]
    assert first.notes == ["baseline: stored"]
    assert all(v.notes == ["baseline: found"] for v in rest)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM baselines").fetchone()[0] == 1


def test_no_judge_starts_when_the_cluster_has_no_room(config):
    """More judges than the cluster can hold: the pool says so at once, it does not wait forever."""
    with pytest.raises(PoolError, match="CPUs"):
        Pool(config, PoolConfig(judge_factory=test_pool.SCRIPTED, compile_workers=0, judge_workers=3))


def test_the_real_judge_and_a_compile_worker_as_actors(tmp_path):
    """The real judge in a Ray actor (its sandboxed candidate processes included) judges a C++
    candidate that a compile actor builds; the baselines land in the driver's database."""
    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.suite import suite_solutions, suite_tasks

    cfg = JudgeConfig(device="cpu", compile_mode="none", n_timed=3, cache_dir=tmp_path / "cache")
    t = next(t for t in suite_tasks("cpu") if t.name == "5_Sum_Rows")
    cand = Candidate.from_path(suite_solutions("cpu")["5_Sum_Rows"])
    db = tmp_path / "results.sqlite"
    with Pool(cfg, PoolConfig(baseline_db=db, compile_workers=1, judge_workers=1)) as pool:
        deadline = time.monotonic() + 300
        while pool.workers_ready() != {"judge": 1, "compile": 1} and time.monotonic() < deadline:
            time.sleep(0.1)
        v = pool.submit(t, cand).result(timeout=900)   # the compile actor takes it first
        stats = pool.stats()
    assert v.correct, v.summary()
    assert stats.prebuilds == 1 and stats.worker_deaths == 0
    with sqlite3.connect(db) as conn:
        assert sorted(m for (m,) in conn.execute("SELECT mode FROM baselines")) == ["eager", "null"]
