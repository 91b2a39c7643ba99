"""The host layer: cores, GPUs, sandbox uid ranges, fp32 numerics and out-of-memory detection have
one definition each (cuda_agent.host), and no other module computes them on its own."""

from __future__ import annotations

import ast
import os
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
    from cuda_agent.pool.pool import MAX_SLOTS

    spares = 4
    judge = set(host.JUDGE_UIDS)
    builds = {host.build_uid(u) for u in host.JUDGE_UIDS}
    spare = {host.spare_uid(u, k) for u in host.JUDGE_UIDS for k in range(1, spares + 1)}
    synth = {host.synth_uid(slot, start, 4) for slot in range(64) for start in range(8)}
    prebuild = {host.prebuild_uid_base(pid) + k for pid in range(0, 4_000_000, 997) for k in range(8)}
    ranges = [judge, builds, spare, synth, prebuild]
    for i, a in enumerate(ranges):
        for b in ranges[i + 1:]:
            assert not a & b
    assert synth <= set(host.SYNTH_UIDS) and prebuild <= set(host.PREBUILD_UIDS)
    # a pool's judge and compile slots stay inside the judges' range, whatever its process id
    for pid in range(30):
        base = host.judge_uid(pid * 2 * MAX_SLOTS)
        assert base in host.JUDGE_UIDS and base + 2 * MAX_SLOTS - 1 in host.JUDGE_UIDS
    # a synthesis slot's restarts cycle through distinct uids
    assert len({host.synth_uid(3, start, 4) for start in range(4)}) == 4


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
