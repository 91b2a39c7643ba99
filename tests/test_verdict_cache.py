"""The judge's verdict cache (`-c verdict_cache=true`): a candidate judged before is answered from
the stored verdict when task, bytes, deciding settings and machine are the same, and judged again
otherwise; only settled outcomes are stored."""

from __future__ import annotations

import json

import pytest

from cuda_agent.candidate import Candidate
from cuda_agent.judge import Judge, JudgeConfig
from cuda_agent.judge.verdict import Failure, FailureCategory, Verdict
from cuda_agent.judge.verdict_cache import VerdictCache, settled
from cuda_agent.suite import suite_solutions, suite_tasks

MACHINE = {"device": "cpu", "device_name": "cpu x2", "torch": "2.13.0", "harness": 8, "judge_code": "abc"}


def verdict(correct=True, category=None, task="t1", cand="c1") -> Verdict:
    failure = None if category is None else Failure(category=category, message="m")
    return Verdict(task_id=task, task_name="T", candidate_hash=cand, device="cpu", correct=correct,
                   compiled=category is not FailureCategory.COMPILE, failure=failure, judge_s=3.0)


def cache(tmp_path, **settings) -> VerdictCache:
    return VerdictCache(tmp_path, settings={"n_timed": 20, "policy": "strict", "cache_dir": "/x"} | settings,
                        machine=MACHINE)


def test_a_stored_verdict_is_answered_and_says_so(tmp_path):
    c = cache(tmp_path)
    assert c.get("t1", "c1") is None
    assert c.put(verdict())
    got = c.get("t1", "c1")
    assert got is not None and got.from_cache and got.correct
    assert any("verdict cache" in n and "nothing was run" in n for n in got.notes)
    assert got.summary()["from_cache"] is True
    assert c.get("t1", "c2") is None and c.get("t2", "c1") is None


def test_only_settled_outcomes_are_stored():
    assert settled(verdict())
    for category in (FailureCategory.LOAD, FailureCategory.POLICY, FailureCategory.COMPILE):
        assert settled(verdict(False, category))
    for category in (FailureCategory.MISMATCH, FailureCategory.TIMEOUT, FailureCategory.CRASH, FailureCategory.OOM,
                     FailureCategory.RUNTIME, FailureCategory.JUDGE, FailureCategory.TIMING, FailureCategory.TAMPERING):
        assert not settled(verdict(False, category)), category
    assert not settled(verdict(correct=False))


def test_deciding_settings_and_the_machine_are_part_of_the_key_placement_is_not(tmp_path):
    cache(tmp_path).put(verdict())
    assert cache(tmp_path, cache_dir="/elsewhere", spares=4, timing_cpus=[0, 1]).get("t1", "c1") is not None
    assert cache(tmp_path, n_timed=50).get("t1", "c1") is None
    assert cache(tmp_path, policy="lenient").get("t1", "c1") is None
    other = VerdictCache(tmp_path, settings={"n_timed": 20, "policy": "strict"}, machine=MACHINE | {"judge_code": "d"})
    assert other.get("t1", "c1") is None, "changed judge code judges again"


def test_a_torn_or_foreign_file_is_judged_again(tmp_path):
    c = cache(tmp_path)
    c.put(verdict())
    path = next(tmp_path.glob("*.json"))
    path.write_text(path.read_text()[:40])
    assert c.get("t1", "c1") is None
    path.write_text(json.dumps({"judged_at": 0, "verdict": verdict(cand="other").model_dump(mode="json")}))
    assert c.get("t1", "c1") is None, "a file whose verdict is of another candidate is not an answer"


@pytest.mark.slow
def test_the_judge_answers_a_repeated_candidate_from_its_cache(tmp_path):
    task = next(t for t in suite_tasks("cpu") if t.name == "2_GELU")
    good = Candidate.from_path(suite_solutions("cpu")["2_GELU"])
    broken = Candidate.from_source(good.model_new.replace("#include <cmath>", "#include <cmath>\n#error broken"))
    base = dict(device="cpu", compile_mode="none", n_timed=5, cache_dir=tmp_path / "cache")
    with Judge(JudgeConfig(**base, verdict_cache=True)) as judge:
        first = judge.evaluate(task, good)
        again = judge.evaluate(task, good)
        bad = judge.evaluate(task, broken)
        bad_again = judge.evaluate(task, broken)
    assert first.correct and not first.from_cache
    assert again.from_cache and again.correct and again.runtime == first.runtime and again.judge_s < 1.0
    assert bad.failure.category is FailureCategory.COMPILE and bad_again.from_cache
    with Judge(JudgeConfig(**base)) as judge:  # off: judged again (the timing is a new measurement)
        fresh = judge.evaluate(task, good)
    assert fresh.correct and not fresh.from_cache
    with Judge(JudgeConfig(**base | {"n_timed": 6}, verdict_cache=True)) as judge:
        other = judge.evaluate(task, good)
    assert other.correct and not other.from_cache and other.runtime.n == 6
