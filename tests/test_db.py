"""The results database: runs, verdicts with their sources, resume bookkeeping, baselines."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from cuda_agent.candidate import Candidate
from cuda_agent.db import DBError, ResultsDB, SqliteBaselineStore
from cuda_agent.judge.baselines import Baseline, BaselineKey, FileBaselineStore
from cuda_agent.judge.verdict import Failure, FailureCategory, Timing, Verdict
from cuda_agent.tasks import Task

TASK = "import torch\nclass Model(torch.nn.Module):\n    pass\ndef get_inputs():\n    return []\n" \
       "def get_init_inputs():\n    return []\n# {tag}\n"


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, p10_ms=ms, p90_ms=ms, std_ms=0.0, n=3)


def verdict(task: Task, cand: Candidate, runtime_ms: float | None) -> Verdict:
    if runtime_ms is None:
        return Verdict(task_id=task.id, task_name=task.name, candidate_hash=cand.hash, device="cpu",
                       failure=Failure(category=FailureCategory.COMPILE, message="error: x"))
    return Verdict(task_id=task.id, task_name=task.name, candidate_hash=cand.hash, device="cpu", compiled=True,
                   correct=True, runtime=timing(runtime_ms), eager=timing(2.0), reward=2.0)


def make(tag: str, level: int = 1) -> tuple[Task, Candidate]:
    task = Task.from_source(TASK.format(tag=tag), name=f"t_{tag}", level=level, group=f"level{level}")
    cand = Candidate.from_files("class ModelNew: pass\n", {"k.cpp": f"// {tag}\n"}, origin=f"/sol/{tag}")
    return task, cand


def test_verdicts_round_trip_with_their_sources(tmp_path):
    with ResultsDB(tmp_path / "r.sqlite") as db:
        run, created = db.open_run("r1", spec="suite:cpu", device="cpu", settings_digest="abc", info={"x": 1})
        assert created and run.info == {"x": 1}
        (t1, c1), (t2, c2) = make("a"), make("b", level=2)
        db.add_verdict("r1", t1, c1, verdict(t1, c1, 1.0))
        db.add_verdict("r1", t2, c2, verdict(t2, c2, None))
        assert db.finished("r1") == {(t1.id, c1.hash), (t2.id, c2.hash)}
        stored = db.verdicts("r1")
        assert [(s.task_name, s.level, s.verdict.correct) for s in stored] == [("t_a", 1, True), ("t_b", 2, False)]
        assert stored[0].verdict.speedup_vs_eager == pytest.approx(2.0)
        assert stored[1].verdict.failure.category == FailureCategory.COMPILE
        assert db.candidate(c1.hash) == c1
        assert [(r.name, n) for r, n in db.runs()] == [("r1", 2)]
    with sqlite3.connect(tmp_path / "r.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_run_resumes_only_with_the_same_settings(tmp_path):
    with ResultsDB(tmp_path / "r.sqlite") as db:
        db.open_run("r1", spec="s", device="cpu", settings_digest="abc", info={})
        run, created = db.open_run("r1", spec="s", device="cpu", settings_digest="abc", info={})
        assert not created and run.name == "r1"
        with pytest.raises(DBError, match="other judge settings"):
            db.open_run("r1", spec="s", device="cpu", settings_digest="def", info={})
        with pytest.raises(DBError):
            db.open_run("r1", spec="s", device="cuda", settings_digest="abc", info={})


def test_the_latest_candidate_of_a_task_represents_it(tmp_path):
    with ResultsDB(tmp_path / "r.sqlite") as db:
        db.open_run("r", spec="s", device="cpu", settings_digest="d", info={})
        task, old = make("a")
        new = Candidate.from_source("class ModelNew: pass\n# v2\n")
        db.add_verdict("r", task, old, verdict(task, old, None))
        db.add_verdict("r", task, new, verdict(task, new, 0.5))
        assert [v.candidate_hash for v in db.verdicts("r")] == [new.hash]
        assert len(db.verdicts("r", latest_per_task=False)) == 2


def test_a_foreign_file_is_refused(tmp_path):
    bad = tmp_path / "not.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DBError):
        ResultsDB(bad)


KEY = BaselineKey(harness_version=4, task_id="t", device_name="NVIDIA H200", torch_version="2.13", mode="default",
                  flush_l2=True, n_timed=20, n_warmup=3)


def _put_from_another_process(path: str) -> None:
    store = SqliteBaselineStore(path)
    store.put(KEY, Baseline(timing=timing(3.0), overhead_ms=0.01))
    store.close()


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_baseline_stores_keep_what_was_put(tmp_path, kind):
    store = FileBaselineStore(tmp_path / "b") if kind == "file" else SqliteBaselineStore(tmp_path / "r.sqlite")
    assert store.get(KEY) is None
    store.put(KEY, Baseline(timing=timing(1.0), overhead_ms=0.02))
    store.put(KEY, Baseline(timing=timing(1.5), overhead_ms=0.02))   # a second judge measured it too
    assert store.get(KEY).timing.median_ms == 1.5
    other = KEY.model_copy(update={"mode": "eager"})
    assert other.digest() != KEY.digest() and store.get(other) is None


def test_the_sqlite_baseline_store_is_shared_between_processes(tmp_path):
    path = tmp_path / "r.sqlite"
    store = SqliteBaselineStore(path)
    proc = multiprocessing.get_context("spawn").Process(target=_put_from_another_process, args=(str(path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert store.get(KEY).timing.median_ms == 3.0


def test_baseline_key_digest_matches_the_judges_original_file_names():
    # The judge named its cache files sha256(json([...]))[:24] before the store existed; keeping the
    # digest keeps existing caches valid.
    import hashlib
    import json

    expected = hashlib.sha256(json.dumps([4, "t", "NVIDIA H200", "2.13", "default", True, 20, 3]).encode()).hexdigest()[:24]
    assert KEY.digest() == expected
