"""A timing claim far below the judge's clock fails the candidate only if a second round of timed
calls says the same: a burst of load on the judge's machine must not fail an honest kernel, a
candidate that lies about its time lies in both rounds. Real build, real isolated process (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import judge_cache_dir
from cuda_agent.candidate import Candidate
from cuda_agent.judge import FailureCategory, Judge, JudgeConfig, harness
from cuda_agent.tasks import load_task_file
from cuda_agent.reward import reward_of

FIXTURES = Path(__file__).parent / "fixtures"
N_TIMED = 4


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    cfg = JudgeConfig(device="cpu", compile_mode="none", n_timed=N_TIMED,
                      cache_dir=judge_cache_dir(tmp_path_factory))
    with Judge(cfg) as j:
        yield j


def _judge_with_gross_rounds(judge, monkeypatch, gross_rounds: int):
    """Judge the honest softmax fixture with the first `gross_rounds` reconciliations turned into
    gross lies (what an overloaded machine does to an honest claim)."""
    real = harness.reconcile
    rounds: list[int] = []

    def reconcile(inside, outside, overhead_ms, **kw):
        rounds.append(len(inside))
        rec = real(inside, outside, overhead_ms, **kw)
        if len(rounds) <= gross_rounds:
            rec.believed, rec.gross_lie, rec.note = False, True, "claimed far less than the judge's clock measured"
        return rec

    monkeypatch.setattr(harness, "reconcile", reconcile)
    task = load_task_file(FIXTURES / "tasks" / "softmax_tiny.py")
    return judge.evaluate(task, Candidate.from_path(FIXTURES / "cpu" / "honest" / "softmax_omp.py")), rounds


def test_one_gross_round_is_measured_again_and_the_honest_kernel_passes(judge, monkeypatch):
    v, rounds = _judge_with_gross_rounds(judge, monkeypatch, gross_rounds=1)
    assert v.correct and v.failure is None, v.failure
    assert len(rounds) == 2, rounds
    cfg = judge.config
    first_round = cfg.n_check + cfg.n_warmup + cfg.n_timed
    # the second round's calls are numbered after the first's and every one was checked
    later = [c for c in v.calls if c.index >= first_round]
    assert len(later) == N_TIMED and all(c.ok and c.role == "timed" for c in later)
    assert v.runtime is not None and v.runtime.n == N_TIMED


def test_two_gross_rounds_fail_the_candidate_on_timing(judge, monkeypatch):
    v, rounds = _judge_with_gross_rounds(judge, monkeypatch, gross_rounds=2)
    assert len(rounds) == 2
    assert not v.correct and v.failure is not None and v.failure.category == FailureCategory.TIMING
    assert reward_of(v).value == -1
