"""Compile workers build what the judge will ask for: the static reading of load_inline calls agrees
with what the module passes when it runs, and a prebuilt candidate is a build-cache hit for the judge."""

from __future__ import annotations

import json
import time

import pytest
import torch.utils.cpp_extension as cpp_extension

from cuda_agent.candidate import Candidate
from cuda_agent.judge import JudgeConfig
from cuda_agent.judge.build import workspace_spec
from cuda_agent.pool import Pool, PoolConfig
from cuda_agent.pool.prebuild import _spec_like_the_judge, plan_prebuild, workspace_slot
from cuda_agent.suite import suite_solutions, suite_tasks


class _Captured(Exception):
    pass


def run_and_capture(source: str, monkeypatch) -> list[dict]:
    """Run a module with load_inline replaced by a recorder that has the judge's stand-in signature
    (cuda_agent.judge.worker.rpc_load_inline), and return its arguments after a JSON round trip,
    as the judge receives them."""
    calls = []

    def record(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None, extra_cuda_cflags=None,
               extra_ldflags=None, extra_include_paths=None, build_directory=None, verbose=False, with_cuda=None,
               is_python_module=True, with_pytorch_error_handling=True, keep_intermediates=True, use_pch=False, **_):
        calls.append(json.loads(json.dumps({
            "name": name, "cpp_sources": cpp_sources, "cuda_sources": cuda_sources, "functions": functions,
            "extra_cflags": extra_cflags, "extra_cuda_cflags": extra_cuda_cflags, "extra_ldflags": extra_ldflags,
            "with_cuda": with_cuda, "with_pytorch_error_handling": with_pytorch_error_handling})))
        raise _Captured

    monkeypatch.setattr(cpp_extension, "load_inline", record)
    try:
        exec(compile(source, "<solution>", "exec"), {"__name__": "solution"})
    except _Captured:
        pass
    return calls


FILE_SOLUTIONS = [(dev, name, path) for dev in ("cpu", "cuda") for name, path in sorted(suite_solutions(dev).items())
                  if path.is_file()]


@pytest.mark.parametrize("device,name,path", FILE_SOLUTIONS, ids=[f"{d}-{n}" for d, n, _ in FILE_SOLUTIONS])
def test_static_load_inline_specs_match_the_running_module(device, name, path, monkeypatch):
    cand = Candidate.from_path(path)
    plan = plan_prebuild(cand, device, "strict")
    dynamic = [_spec_like_the_judge(args) for args in run_and_capture(cand.model_new, monkeypatch)]
    assert dynamic, "the solution builds an extension with load_inline"
    assert plan.specs == dynamic[:1] and not plan.skipped, plan.skipped


def test_literal_forms_are_read_and_computed_ones_left_to_the_judge(monkeypatch):
    source = '''
from torch.utils.cpp_extension import load_inline
HEAD = "#include <torch/extension.h>\\n"
BODY = HEAD + "torch::Tensor f(torch::Tensor x) { return x; }"
FLAGS = ["-O3"] + ["-DFAST=1"]
ext = load_inline("lit_ext", BODY, functions={"f": "identity"}, extra_cflags=FLAGS, verbose=True)
'''
    plan = plan_prebuild(Candidate.from_source(source), "cpu", "lenient")
    assert plan.specs == [_spec_like_the_judge(a) for a in run_and_capture(source, monkeypatch)]
    assert plan.specs[0].cflags == ("-O3", "-DFAST=1")

    computed = '''
from torch.utils.cpp_extension import load_inline
N = 4
SRC = f"constexpr int n = {N};"
ext = load_inline(name="computed", cpp_sources=SRC, functions=["f"])
flags = ["-O" + str(N - 1)]
ext2 = load_inline(name="computed2", cpp_sources="int g();", extra_cflags=flags)
'''
    plan = plan_prebuild(Candidate.from_source(computed), "cpu", "lenient")
    assert plan.specs == [] and len(plan.skipped) == 2
    assert "line 5" in plan.skipped[0] and "SRC" in plan.skipped[0]


def test_what_the_judge_refuses_is_not_built():
    cuda_on_cpu = Candidate.from_path(suite_solutions("cuda")["2_GELU"])
    assert plan_prebuild(cuda_on_cpu, "cpu", "strict").skipped[0].endswith("CUDA sources on the CPU backend")
    fallback = Candidate.from_source("import torch\nclass ModelNew(torch.nn.Module):\n"
                                     "    def forward(self, x):\n        return torch.matmul(x, x)\n")
    plan = plan_prebuild(fallback, "cpu", "strict")
    assert plan.specs == [] and plan.skipped[0].startswith("policy:")


def test_a_workspace_is_built_in_the_judges_slot():
    path = suite_solutions("cpu")["10_RMSNorm"]
    cand = Candidate.from_path(path)
    plan = plan_prebuild(cand, "cpu", "strict")
    assert plan.specs == [workspace_spec(cand.kernels, f"ws:{path}", "cpu")]
    assert workspace_slot(Candidate.from_files(cand.model_new, dict(cand.kernels))) == \
        f"ws:{Candidate.from_files(cand.model_new, dict(cand.kernels)).hash}"


@pytest.mark.slow
def test_a_prebuilt_candidate_is_a_cache_hit_for_the_judge(tmp_path):
    """Both candidate forms through a pool with a compile worker: the compile worker builds each
    library, and the judge worker loads it from the cache instead of compiling."""
    tasks = {t.name: t for t in suite_tasks("cpu")}
    sols = suite_solutions("cpu")
    cfg = JudgeConfig(device="cpu", compile_mode="none", n_timed=3, cache_dir=tmp_path / "cache")
    with Pool(cfg, PoolConfig(compile_workers=1, judge_workers=1, baseline_db=tmp_path / "r.sqlite")) as pool:
        # The judge worker is kept busy with a candidate that needs no build while the compile worker
        # takes the first of the two: from then on the judge never finds a build that has not started.
        blocker = pool.submit(tasks["3_Softmax_Rows"], Candidate.from_source(
            "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
            "        return torch.softmax(x, dim=-1)\n"))
        deadline = time.monotonic() + 300
        while pool.workers_ready()["compile"] < 1:
            assert time.monotonic() < deadline, "the compile worker did not start"
            time.sleep(0.05)
        futures = [pool.submit(tasks[n], Candidate.from_path(sols[n])) for n in ("5_Sum_Rows", "10_RMSNorm")]
        verdicts = [f.result(timeout=1200) for f in futures]
        assert blocker.result().failure.category.value == "policy"  # torch compute in forward: refused
        stats = pool.stats()
    for v in verdicts:
        assert v.correct and v.build_cached is True, (v.task_name, v.failure, v.build_cached)
        assert "prebuild" in v.phase_s
    # Built by the compile worker (its builder found neither in the fresh cache).
    assert stats.prebuild_built == 2 and stats.prebuild_failed == 0


def test_workspace_builds_link_one_shared_binding_object(tmp_path):
    """The fixed binding.cpp is compiled once, beside the precompiled header, and every workspace
    build of the same flags links that object instead of compiling it again."""
    from pathlib import Path

    from cuda_agent.judge.build import SHARED_BINDING, Builder

    builder = Builder(tmp_path / "cache", tmp_path / "work", arch=None, timeout_s=600, uid=None)
    silu = Candidate.from_path(Path(__file__).parent / "fixtures" / "cpu" / "honest" / "silu_ws")
    first = builder.build(workspace_spec(silu.kernels, "ws:a", "cpu"))
    objects = list(builder.pch_root.glob(f"*/{SHARED_BINDING}"))
    assert len(objects) == 1 and objects[0].stat().st_size > 0
    made = objects[0].stat().st_mtime_ns
    # another workspace (other kernel source, other slot): a new library, the same binding object
    changed = tuple((rel, src + "\n// another candidate\n") for rel, src in silu.kernels)
    second = builder.build(workspace_spec(changed, "ws:b", "cpu"))
    assert not first.cached and not second.cached and first.key != second.key
    assert second.library.exists() and objects[0].stat().st_mtime_ns == made
    for slot_dir in builder.build_root.iterdir():  # no workspace compiled binding.cpp itself
        assert not list(slot_dir.rglob("binding.o")), slot_dir
