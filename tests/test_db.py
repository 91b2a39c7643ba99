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
                   correct=True, runtime=timing(runtime_ms), eager=timing(2.0))


def make(tag: str, level: int = 1) -> tuple[Task, Candidate]:
    task = Task.from_source(TASK.format(tag=tag), name=f"t_{tag}", level=level, group=f"level{level}")
    cand = Candidate.from_files("class ModelNew: pass\n", {"k.cpp": f"// {tag}\n"}, origin=f"/sol/{tag}")
    return task, cand


def test_verdicts_round_trip_with_their_sources(tmp_path):
    with ResultsDB(tmp_path / "r.sqlite") as db:
        run, created = db.open_run("r1", spec="suite:cpu", device="cpu", settings_digest="abc", info={"x": 1})
        assert created and run.info == {"x": 1}
        (t1, c1), (t2, c2) = make("a"), make("b", level=2)
        db.add_verdict("r1", t1, c1, verdict(t1, c1, 1.0), reward=0.0)
        db.add_verdict("r1", t2, c2, verdict(t2, c2, None), reward=0.0)
        assert db.finished("r1") == {(t1.id, t1.name, c1.hash), (t2.id, t2.name, c2.hash)}
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


def test_a_changed_solution_supersedes_its_older_candidate(tmp_path):
    """A run resumed after a solution file changed holds both candidates; the newer one represents
    that solution, and every earlier pair stays in the database."""
    with ResultsDB(tmp_path / "r.sqlite") as db:
        db.open_run("r", spec="s", device="cpu", settings_digest="d", info={})
        task, old = make("a")
        new = Candidate.from_files("class ModelNew: pass\n# v2\n", {}, origin=old.origin)
        db.add_verdict("r", task, old, verdict(task, old, None), reward=0.0)
        db.add_verdict("r", task, new, verdict(task, new, 0.5), reward=0.0)
        assert [v.candidate_hash for v in db.verdicts("r")] == [new.hash]
        assert len(db.verdicts("r", latest_per_solution=False)) == 2


def test_two_solutions_of_one_reference_are_two_rows(tmp_path):
    """Two task names with the same reference source (one task id), each with its own solution:
    both pairs are rows, and so are two names whose solutions are the very same candidate."""
    source = TASK.format(tag="shared")
    t1 = Task.from_source(source, name="3_Softmax", level=1)
    t2 = Task.from_source(source, name="3_Softmax_again", level=1)
    assert t1.id == t2.id
    c1 = Candidate.from_files("class ModelNew: pass\n# one\n", {}, origin="/sol/3_Softmax.py")
    c2 = Candidate.from_files("class ModelNew: pass\n# two\n", {}, origin="/sol/3_Softmax_again.py")
    same = Candidate.from_files("class ModelNew: pass\n# one\n", {}, origin="/sol/copy/3_Softmax_again.py")
    assert same.hash == c1.hash
    with ResultsDB(tmp_path / "r.sqlite") as db:
        for run in ("r", "copies"):
            db.open_run(run, spec="s", device="cpu", settings_digest="d", info={})
        db.add_verdict("r", t1, c1, verdict(t1, c1, 1.0), reward=0.0)
        db.add_verdict("r", t2, c2, verdict(t2, c2, None), reward=0.0)
        assert [(v.task_name, v.solution) for v in db.verdicts("r")] == [
            ("3_Softmax", "/sol/3_Softmax.py"), ("3_Softmax_again", "/sol/3_Softmax_again.py")]
        assert db.finished("r") == {(t1.id, t1.name, c1.hash), (t2.id, t2.name, c2.hash)}
        db.add_verdict("copies", t1, c1, verdict(t1, c1, 1.0), reward=0.0)
        db.add_verdict("copies", t2, same, verdict(t2, same, 1.0), reward=0.0)
        assert [v.task_name for v in db.verdicts("copies")] == ["3_Softmax", "3_Softmax_again"]


def test_a_judge_failure_is_a_row_until_a_verdict_replaces_it(tmp_path):
    with ResultsDB(tmp_path / "r.sqlite") as db:
        db.open_run("r", spec="s", device="cpu", settings_digest="d", info={})
        (t1, c1), (t2, c2) = make("a"), make("b", level=2)
        db.add_verdict("r", t1, c1, verdict(t1, c1, 1.0), reward=0.0)
        rec = db.add_failure("r", t2, c2, "baseline", "task t_b: eager baseline failed: boom")
        assert not rec.correct and rec.solution == "/sol/b"
        records = db.records("r")
        assert [(type(r).__name__, r.task_name) for r in records] == [("StoredVerdict", "t_a"), ("StoredFailure", "t_b")]
        assert db.failures("r")[0].model_dump() == rec.model_dump()
        assert db.finished("r") == {(t1.id, t1.name, c1.hash)}, "a failed pair is tried again on resume"
        assert db.candidate(c2.hash) == c2, "the source of a pair not judged is kept for the report"
        assert db.run_counts()[0][1:] == (1, 1)
        db.add_verdict("r", t2, c2, verdict(t2, c2, 0.5), reward=0.0)
        assert db.failures("r") == [] and len(db.verdicts("r")) == 2


# The version-1 verdicts table, as files written before judge failures and per-name pairs existed.
V1_VERDICTS = """
CREATE TABLE verdicts (
    run TEXT NOT NULL REFERENCES runs(name), task_id TEXT NOT NULL, candidate_hash TEXT NOT NULL,
    task_name TEXT NOT NULL, task_group TEXT NOT NULL, task_origin TEXT NOT NULL, level INTEGER,
    compiled INTEGER NOT NULL, correct INTEGER NOT NULL, reward REAL NOT NULL, failure TEXT, runtime_ms REAL,
    eager_ms REAL, compile_ms REAL, speedup_vs_eager REAL, speedup_vs_compile REAL, judge_s REAL,
    finished_at REAL NOT NULL, verdict TEXT NOT NULL, PRIMARY KEY (run, task_id, candidate_hash));
CREATE INDEX verdicts_by_run ON verdicts (run, finished_at);
"""


def test_a_version_1_file_is_migrated_in_place(tmp_path):
    path = tmp_path / "old.sqlite"
    (t1, c1), (t2, c2) = make("a"), make("b")
    v1 = verdict(t1, c1, 1.0)
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "CREATE TABLE runs (name TEXT PRIMARY KEY, created_at REAL NOT NULL, spec TEXT NOT NULL, "
            "device TEXT NOT NULL, settings_digest TEXT NOT NULL, info TEXT NOT NULL);"
            "CREATE TABLE candidates (hash TEXT PRIMARY KEY, kind TEXT NOT NULL, origin TEXT NOT NULL, "
            "model_new TEXT NOT NULL, kernels TEXT NOT NULL);" + V1_VERDICTS)
        conn.execute("INSERT INTO meta VALUES ('schema', '1')")
        conn.execute("INSERT INTO runs VALUES ('old', 1.0, 's', 'cpu', 'd', '{}')")
        conn.execute("INSERT INTO candidates VALUES (?, ?, ?, ?, '[]')", (c1.hash, c1.kind, c1.origin, c1.model_new))
        conn.execute("INSERT INTO verdicts VALUES ('old', ?, ?, ?, '', '', 1, 1, 1, 2.0, NULL, 1.0, 2.0, NULL, 2.0, "
                     "NULL, 3.0, 5.0, ?)", (t1.id, c1.hash, t1.name, v1.model_dump_json()))
    with ResultsDB(path) as db:
        [stored] = db.verdicts("old")
        assert (stored.task_name, stored.solution, stored.verdict.correct) == ("t_a", c1.origin, True)
        assert db.finished("old") == {(t1.id, t1.name, c1.hash)}
        db.add_failure("old", t2, c2, "judge", "the judge raised X")
        assert [r.task_name for r in db.records("old")] == ["t_a", "t_b"]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == "2"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert {r[1] for r in conn.execute("PRAGMA index_list('verdicts')")} >= {"verdicts_by_run"}
    ResultsDB(path).close()  # a migrated file opens again as it is


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.sqlite"
    ResultsDB(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema'")
    with pytest.raises(DBError, match="schema version 99"):
        ResultsDB(path)


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
