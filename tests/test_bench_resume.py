"""`cuda-agent bench` keeps every (task, candidate) pair and every pair the judge could not judge:
two solutions of one reference source are two rows, and a task whose eager baseline fails is a row
of category `baseline`, in the database, the table, the metrics, the JSON lines and the HTML report.
Killed with SIGKILL mid-run it loses no finished verdict, leaves no worker behind, and the same run
resumes without judging again what it had finished. Real judge, CPU backend (a pool that cannot
start uses the pool's stand-in judge, tests/pool_fakes.py)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import json
import time
from pathlib import Path

import pytest

from conftest import judge_cache_dir

N_TASKS = 6

TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * {k}.0

def get_inputs():
    return [torch.randn(8192)]

def get_init_inputs():
    return []
'''

# Lenient policy: torch glue is allowed, so no build is needed and each judgement takes seconds.
SOLUTION = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * {k}.0
'''


# Imported as the module "model" only in the judge's sandboxed baseline process (the judge loads a
# reference under another name): the eager baseline fails while the reference itself is fine.
BROKEN_BASELINE = '''if __name__ == "model":
    raise RuntimeError("this reference cannot run in the baseline process")
'''


def rows(db: Path) -> dict[tuple[str, str], tuple[float, str]]:
    if not db.exists():
        return {}
    try:
        with sqlite3.connect(db, timeout=30) as conn:
            return {(t, c): (f, v) for t, c, f, v in conn.execute(
                "SELECT task_id, candidate_hash, finished_at, verdict FROM verdicts WHERE run='r'")}
    except sqlite3.OperationalError:  # the schema is not there yet
        return {}


def session_pids(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(entry))
    return out


@pytest.mark.slow
def test_kill_minus_nine_loses_nothing_and_the_run_resumes(tmp_path):
    tasks, sols = tmp_path / "tasks" / "level1", tmp_path / "solutions"
    tasks.mkdir(parents=True)
    sols.mkdir()
    for k in range(N_TASKS):
        (tasks / f"{k + 1}_Tanh_x{k + 2}.py").write_text(TASK.format(k=k + 2))
        (sols / f"{k + 1}_Tanh_x{k + 2}.py").write_text(SOLUTION.format(k=k + 2))
    # A second solution of task 1's reference, under a second name; and a task whose baseline fails.
    (tasks / "7_Tanh_x2_again.py").write_text(TASK.format(k=2))
    (sols / "7_Tanh_x2_again.py").write_text(SOLUTION.format(k=2) + "# the same, stored again\n")
    (tasks / "8_Broken_baseline.py").write_text(BROKEN_BASELINE + TASK.format(k=9))
    (sols / "8_Broken_baseline.py").write_text(SOLUTION.format(k=9))
    db = tmp_path / "results.sqlite"
    cmd = [sys.executable, "-m", "cuda_agent.cli", "bench", str(tmp_path / "tasks"), "--solutions", str(sols),
           "--device", "cpu", "--policy", "lenient", "--compile-mode", "none", "--db", str(db), "--run", "r",
           "--compile-workers", "0", "-c", "n_timed=3", "-c", f"cache_dir=\"{tmp_path / 'cache'}\""]

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while len(rows(db)) < 2:
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "no verdict within 10 minutes"
        time.sleep(0.2)
    before = rows(db)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    assert len(before) < N_TASKS, "the run finished before it could be killed"

    # The pool's workers die with it (and the judges' sandboxed processes with them).
    deadline = time.monotonic() + 30
    while session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not session_pids(proc.pid), "worker processes outlived the killed bench"

    after_kill = rows(db)
    assert before.items() <= after_kill.items(), "a finished verdict was lost or changed"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(after_kill)} already judged" in res.stdout and "(resumed)" in res.stdout
    final = rows(db)
    assert len(final) == N_TASKS + 1, "both solutions of task 1's reference have a verdict"
    assert after_kill.items() <= final.items(), "finished work was judged again"
    assert "pass rate 7/8" in res.stdout and "not judged (counted as not correct): 1 pair (baseline: 1)" in res.stdout
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT task_name, category FROM judge_failures WHERE run='r'").fetchall() == [
            ("8_Broken_baseline", "baseline")]

    # Once more: nothing left but the pair the judge could not judge, which is tried again.
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{N_TASKS + 1} already judged; judging 1" in res.stdout
    assert rows(db) == final


def suite_gelu(device: str) -> tuple[str, str]:
    """The suite's GELU task and its solution for `device`."""
    from cuda_agent.suite import suite_dir

    root = suite_dir()
    task = root / "cpu" / "2_GELU.py" if device == "cpu" else root / "cuda" / "level1" / "2_GELU.py"
    return task.read_text(), (root / "solutions" / device / "2_GELU.py").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_every_pair_and_every_judge_failure_reaches_every_output(tmp_path, tmp_path_factory, device):
    """The suite's GELU (strict policy: C++/OpenMP on the CPU, a CUDA kernel on the GPU) under two
    task names with two solutions, and a copy whose eager baseline fails: three rows everywhere."""
    tasks, sols = tmp_path / "tasks" / "level1", tmp_path / "solutions"
    tasks.mkdir(parents=True)
    sols.mkdir()
    gelu, solution = suite_gelu(device)
    (tasks / "2_GELU.py").write_text(gelu)
    (tasks / "2_GELU_copy.py").write_text(gelu)
    (tasks / "3_GELU_broken.py").write_text(BROKEN_BASELINE + gelu)
    (sols / "2_GELU.py").write_text(solution)
    (sols / "2_GELU_copy.py").write_text(solution + "# the same kernel, stored under a second name\n")
    (sols / "3_GELU_broken.py").write_text(solution)
    db, out, report = tmp_path / "results.sqlite", tmp_path / "run.jsonl", tmp_path / "run.html"
    cache = judge_cache_dir(tmp_path_factory)
    cmd = [sys.executable, "-m", "cuda_agent.cli", "bench", str(tmp_path / "tasks"), "--solutions", str(sols),
           "--device", device, "--compile-mode", "none", "--db", str(db), "--run", "pairs", "--compile-workers", "0",
           "-c", "n_timed=3", "-c", f"cache_dir=\"{cache}\"", "--out", str(out), "--report", str(report)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stdout + res.stderr

    # the table and the metrics
    text = res.stdout
    assert "2_GELU_copy.py" in text and "not judged, baseline" in text and "3_GELU_broken" in text
    assert "pass rate 2/3 (66.7%) of (task, candidate) pairs" in text
    assert "best candidate per task: pass rate 1/2" in text
    assert "not judged (counted as not correct): 1 pair (baseline: 1)" in text
    assert "3_GELU_broken (3_GELU_broken.py): baseline: task 3_GELU_broken: eager baseline failed" in text

    # the JSON lines
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [(r["record"], r["task_name"], r["correct"]) for r in lines] == [
        ("verdict", "2_GELU", True), ("verdict", "2_GELU_copy", True), ("judge_failure", "3_GELU_broken", False)]
    assert lines[0]["task_id"] == lines[1]["task_id"] and lines[0]["candidate_hash"] != lines[1]["candidate_hash"]
    assert lines[2]["failure"]["category"] == "baseline" and "RuntimeError" in lines[2]["failure"]["message"]
    assert lines[1]["solution"] == str(sols / "2_GELU_copy.py") and lines[2]["level"] == 1

    # the database
    with sqlite3.connect(db) as conn:
        judged = conn.execute("SELECT task_name, correct FROM verdicts WHERE run='pairs' ORDER BY task_name").fetchall()
        failed = conn.execute("SELECT task_name, category, finished_at FROM judge_failures WHERE run='pairs'").fetchall()
    assert judged == [("2_GELU", 1), ("2_GELU_copy", 1)]
    assert [f[:2] for f in failed] == [("3_GELU_broken", "baseline")]

    # the HTML report
    html = report.read_text()
    assert html.count('<tr data-task="') == 3 and '<tr data-task="3_GELU_broken" data-judged="no">' in html
    assert "candidate failures</th><td>none</td>" in html
    assert 'not judged</th><td class="bad">baseline: 1 ' in html
    assert "per task, best of its candidates" in html

    # resumed: the two verdicts stay, the pair without one is tried again (and fails again)
    before = rows_of(db, "pairs")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 already judged; judging 1" in res.stdout and "(resumed)" in res.stdout
    assert rows_of(db, "pairs") == before
    with sqlite3.connect(db) as conn:
        again = conn.execute("SELECT task_name, category, finished_at FROM judge_failures WHERE run='pairs'").fetchall()
    assert [f[:2] for f in again] == [("3_GELU_broken", "baseline")] and again[0][2] > failed[0][2]
    assert len(out.read_text().splitlines()) == 3


def rows_of(db: Path, run: str) -> dict:
    with sqlite3.connect(db) as conn:
        return {(t, n, c): (f, v) for t, n, c, f, v in conn.execute(
            "SELECT task_id, task_name, candidate_hash, finished_at, verdict FROM verdicts WHERE run=?", (run,))}


def test_pairs_a_broken_pool_left_are_recorded_and_judged_on_resume(tmp_path):
    """A pool whose judge cannot start: every pair becomes a judge failure of category `pool`
    (not a printed line), the run still has its table; the resumed run, with a working judge,
    replaces them with verdicts."""
    from cuda_agent.bench import run_bench
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.pool import PoolConfig

    tasks, sols = tmp_path / "tasks" / "level1", tmp_path / "solutions"
    tasks.mkdir(parents=True)
    sols.mkdir()
    for k in (2, 3):
        (tasks / f"{k}_Tanh_x{k}.py").write_text(TASK.format(k=k))
        (sols / f"{k}_Tanh_x{k}.py").write_text(SOLUTION.format(k=k))
    config = JudgeConfig(device="cpu", policy="lenient", compile_mode="none", n_timed=3, cache_dir=tmp_path / "cache")
    db, out = tmp_path / "results.sqlite", tmp_path / "run.jsonl"
    broken = run_bench(str(tmp_path / "tasks"), sols, config, db_path=db, run_name="r", out=out,
                       pool_config=PoolConfig(judge_factory="pool_fakes:BrokenJudge", compile_workers=0))
    assert broken.pool_error and "CUDA is not available" in broken.pool_error
    assert broken.failed_now == 2 and broken.judged_now == 0
    assert [(f.task_name, f.category) for f in broken.failures] == [("2_Tanh_x2", "pool"), ("3_Tanh_x3", "pool")]
    assert broken.table.overall.n == 2 and broken.table.overall.n_judge_errors == 2
    assert [json.loads(ln)["record"] for ln in out.read_text().splitlines()] == ["judge_failure"] * 2

    fixed = run_bench(str(tmp_path / "tasks"), sols, config, db_path=db, run_name="r", out=out,
                      pool_config=PoolConfig(compile_workers=0))
    assert fixed.pool_error is None and fixed.judged_now == 2 and fixed.already_done == 0
    assert fixed.failures == [] and [v.verdict.correct for v in fixed.verdicts] == [True, True]
    assert fixed.table.overall.n_judge_errors == 0 and fixed.table.overall.pass_rate == 1.0
