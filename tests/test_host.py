"""The host layer: cores, GPUs, sandbox uid ranges, fp32 numerics and out-of-memory detection have
one definition each (cuda_agent.host), and no other module computes them on its own."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cuda_agent import host
from cuda_agent.judge.verdict import Failure, FailureCategory

SRC = Path(__file__).resolve().parents[1] / "src" / "cuda_agent"


def test_usable_cores_are_this_processes_share():
    assert host.usable_cores() == len(os.sched_getaffinity(0)) >= 1


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0, 2,-1,GPU-abc")
    assert host.visible_gpus() == ["0", "2", "GPU-abc"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert host.visible_gpus() == []
    from cuda_agent.pool import visible_gpus

    assert visible_gpus is host.visible_gpus   # the pool's name for it is the same function


def test_uid_ranges_do_not_overlap():
    from cuda_agent.judge.config import JudgeConfig
    from cuda_agent.pool.pool import MAX_SLOTS

    spares = JudgeConfig.model_fields["spares"].metadata[-1].le   # the most a judge may keep
    judge = set(host.JUDGE_UIDS)
    builds = {host.build_uid(u) for u in host.JUDGE_UIDS}
    spare = {host.spare_uid(u, k) for u in host.JUDGE_UIDS for k in range(1, spares + 1)}
    ranges = [judge, builds, spare, set(host.SYNTH_UIDS), set(host.PREBUILD_UIDS)]
    for i, a in enumerate(ranges):
        for b in ranges[i + 1:]:
            assert not a & b
    # a pool's judge and compile slots fit the judges' range
    assert 2 * MAX_SLOTS < len(host.JUDGE_UIDS)


def test_a_process_that_is_not_root_holds_no_uids(monkeypatch):
    """Only a root judge runs processes under sandbox uids, so one that is not root leases none:
    its lease names the range's first uids, holds no lock and needs no lease folder."""
    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(host, "_lease_dir", lambda: pytest.fail("a process that is not root made a lease folder"))
    with host.lease_uids(host.PREBUILD_UIDS, range(3), 77) as one, host.lease_uids(host.PREBUILD_UIDS, range(3), 5) as two:
        assert one.base == two.base == host.PREBUILD_UIDS.start and one.uids == [150000, 150001, 150002]
        assert one._fds == [] == two._fds
    with pytest.raises(ValueError):   # offsets are checked all the same
        host.lease_uids(range(10), range(11), 0)


_HOLD = """
import sys
from cuda_agent import host
lease = host.lease_uids(host.JUDGE_UIDS, range(3), int(sys.argv[1]))
print(lease.base, flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="uid leases are taken only by a root judge")
def test_uid_leases_keep_processes_apart_until_one_ends():
    """Two processes that pick the same starting place get disjoint uids; one's uids are free
    again once it ends, killed or not (the kernel drops its locks), or once it closes its lease."""
    spread = 1234
    other = subprocess.Popen([sys.executable, "-c", _HOLD, str(spread)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        theirs = int(other.stdout.readline())
        assert theirs == host.JUDGE_UIDS.start + spread
        with host.lease_uids(host.JUDGE_UIDS, range(3), spread) as mine:
            assert not set(mine.uids) & {theirs, theirs + 1, theirs + 2}
            # a second lease in the same process is kept apart from the first as well
            with host.lease_uids(host.JUDGE_UIDS, [0], spread + 2) as third:
                assert third.base not in mine.uids and third.base != theirs + 2
        other.kill()
        other.wait(timeout=30)
        with host.lease_uids(host.JUDGE_UIDS, range(3), spread) as again:
            assert again.base == theirs
        folder = os.stat(host._lease_dir())
        assert folder.st_uid == 0 and not folder.st_mode & 0o077
        for offsets in (range(11), [], [-1, 0]):
            with pytest.raises(ValueError):
                host.lease_uids(range(10), offsets, 0)
    finally:
        other.kill()
        other.wait(timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="uid leases are taken only by a root judge")
def test_judges_and_synthesis_pools_of_two_processes_never_share_a_uid(tmp_path):
    """A judge takes a leased uid and gives it back on close; a synthesis worker pool leases its
    workers' uids, so a second pool (another synthesis run) gets others."""
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.synth.filters import FilterConfig, Worker, WorkerPool

    room = len(host.JUDGE_UIDS)
    place = (os.getpid() + 997 * (Judge._instances + 1)) % room   # where the next judge starts its search
    with host.lease_uids(host.JUDGE_UIDS, [0], place) as taken:
        with Judge(JudgeConfig(device="cpu", cache_dir=tmp_path)) as judge:
            assert taken.base == host.JUDGE_UIDS.start + place
            assert judge.uid == host.JUDGE_UIDS.start + (place + 1) % room
            with host.lease_uids(host.JUDGE_UIDS, [0], place + 1) as beside:
                assert beside.base != judge.uid
        with host.lease_uids(host.JUDGE_UIDS, [0], place + 1) as after:   # the judge gave it back
            assert after.base == judge.uid
    with WorkerPool(FilterConfig(device="cpu"), 2) as one, WorkerPool(FilterConfig(device="cpu"), 2) as two:
        uids = [{w.uid_base + k for k in range(Worker.UID_WAYS)} for w in one._all + two._all]
        assert sum(map(len, uids)) == len(set().union(*uids)) == 4 * Worker.UID_WAYS
        assert set().union(*uids) <= set(host.SYNTH_UIDS)


def test_true_fp32_turns_tf32_off():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        host.true_fp32(torch)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("error, expected", [
    (MemoryError(), True),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported asynchronously"), True),
    (RuntimeError("shape mismatch"), False),
    (Failure(category=FailureCategory.OOM, message="the candidate process exceeded 4096 MiB"), True),
    (Failure(category=FailureCategory.JUDGE, message="torch.OutOfMemoryError: CUDA out of memory"), True),
    (Failure(category=FailureCategory.RUNTIME, message="forward failed: boom"), False),
    ("cuInit: CUDA_ERROR_OUT_OF_MEMORY", True),
    ("RuntimeError: wrong dtype", False),
    (None, False),
])
def test_out_of_memory_is_one_decision(error, expected):
    assert host.is_out_of_memory(error) is expected


def _violations() -> list[str]:
    """Places outside host.py that compute what host.py owns."""
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "host.py" and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(SRC)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and node.attr in ("sched_getaffinity", "allow_tf32") and \
                    isinstance(node.ctx, ast.Store if node.attr == "allow_tf32" else ast.Load):
                found.append(f"{where}: {node.attr}")
            elif isinstance(node, ast.Attribute) and node.attr == "OutOfMemoryError":
                found.append(f"{where}: OutOfMemoryError")
            elif isinstance(node, ast.FunctionDef) and node.name == "visible_gpus":
                found.append(f"{where}: def visible_gpus")
            elif isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool) \
                    and node.value in (58000, 61000, 150000):
                found.append(f"{where}: uid {node.value}")
    return found


def test_no_other_module_computes_host_facts():
    assert _violations() == []
