"""`cuda-agent bench` killed with SIGKILL mid-run loses no finished verdict, leaves no worker behind,
and the same run resumes without judging again what it had finished. Real judge, CPU backend."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    assert len(final) == N_TASKS
    assert after_kill.items() <= final.items(), "finished work was judged again"
    assert "pass rate 6/6" in res.stdout
