"""Compile workers, the agent's compile tool and the judge build the same thing: one plan
(`cuda_agent.judge.builds.plan`), checked here against the judge's own code paths. The static reading
of load_inline calls agrees with what `CandidateBuilds.serve` makes of the request the running module
sends; the workspace spec `Judge.evaluate` builds is the plan's; and a candidate built ahead (by
`Judge.build` or a compile worker) is a build-cache hit for the judge."""

from __future__ import annotations

import glob
import json
import os
import time
from pathlib import Path

import pytest
import torch.utils.cpp_extension as cpp_extension

from conftest import judge_cache_dir, read_header
from cuda_agent.candidate import Candidate
from cuda_agent.judge import Judge, JudgeConfig, Verdict
from cuda_agent.judge import harness
from cuda_agent.judge.builds import CandidateBuilds, plan_build, spec_from_request, workspace_slot, workspace_spec
from cuda_agent.judge.evaluation import Evaluation
from cuda_agent.judge.inline_request import load_inline_request
from cuda_agent.pool import Pool, PoolConfig
from cuda_agent.pool.prebuild import build_plan_ahead
from cuda_agent.suite import suite_solutions, suite_tasks
from cuda_agent.tasks import load_task_file

FIXTURES = Path(__file__).parent / "fixtures"


class _Captured(Exception):
    pass


def run_and_capture(source: str, monkeypatch) -> list[dict]:
    """Run a module with load_inline replaced by the judge's own stand-in request
    (`load_inline_request`, what the candidate process sends), and return the first request after
    the JSON round trip of the judge's channel."""
    calls = []

    def record(*args, **kwargs):
        calls.append(json.loads(json.dumps(load_inline_request(*args, **kwargs))))
        raise _Captured

    monkeypatch.setattr(cpp_extension, "load_inline", record)
    try:
        exec(compile(source, "<solution>", "exec"), {"__name__": "solution"})
    except _Captured:
        pass
    return calls


def _served_specs(judge: Judge, request: dict, monkeypatch) -> tuple[list, dict]:
    """What the judge's build service (`CandidateBuilds.serve`) does with a build request: the specs it hands to its build step
    (recorded, not compiled), and its answer to the candidate."""
    built = []

    def record(self, spec, ev):
        built.append(spec)
        raise harness._Stop(harness.FC.COMPILE, "recorded, not built")

    monkeypatch.setattr(CandidateBuilds, "build", record)
    ev = Evaluation(kind="candidate", verdict=Verdict(task_id="", task_name="", candidate_hash="", device=judge.device))
    answer = judge.builds.serve(request, None, ev)
    return built, answer


@pytest.fixture(scope="module")
def cpu_judges(tmp_path_factory):
    cache = judge_cache_dir(tmp_path_factory)
    judges = {policy: Judge(JudgeConfig(device="cpu", compile_mode="none", cache_dir=cache, policy=policy))
              for policy in ("strict", "lenient")}
    yield judges
    for j in judges.values():
        j.close()


# single files that build with load_inline: suite solutions and the honest fixtures (hacks and
# faults are not run in the test process: their module code is hostile by design)
INLINE_FILES = [(dev, path) for dev in ("cpu", "cuda") for path in sorted(suite_solutions(dev).values())
                if path.is_file()]
INLINE_FILES += [(dev, path) for dev in ("cpu", "cuda") for path in sorted((FIXTURES / dev / "honest").glob("*.py"))
                 if "load_inline" in path.read_text()]


@pytest.mark.parametrize("device,path", INLINE_FILES,
                         ids=[f"{d}-{p.parent.name}-{p.stem}" for d, p in INLINE_FILES])
def test_static_specs_are_what_the_judge_serves(device, path, cpu_judges, monkeypatch):
    cand = Candidate.from_path(path)
    policy = read_header(path).get("policy", "strict")
    plan = plan_build(cand, device, policy)
    requests = run_and_capture(cand.model_new, monkeypatch)
    assert requests, "the module builds an extension with load_inline"
    assert not plan.refused and not plan.skipped, plan.not_built
    judge = cpu_judges[policy]
    if device == "cpu":
        served, answer = _served_specs(judge, requests[0], monkeypatch)
        assert plan.specs == served[:1] and answer == {"ok": False, "message": "recorded, not built"}
        assert plan.specs[0].key(judge.builder.fingerprint) == served[0].key(judge.builder.fingerprint)
        assert judge.build_plan(cand).specs == plan.specs
    else:
        # the CPU judge refuses CUDA sources with the message the CPU plan skips them with
        served, answer = _served_specs(judge, requests[0], monkeypatch)
        assert served == [] and not answer["ok"]
        cpu_plan = plan_build(cand, "cpu", policy)
        assert cpu_plan.specs == [] and cpu_plan.skipped[0].endswith(answer["message"])
        assert plan.specs == [spec_from_request(requests[0])]


WORKSPACES = [p for p in sorted(suite_solutions("cpu").values()) if p.is_dir()]
WORKSPACES += [p for group in ("honest", "hacks") for p in sorted((FIXTURES / "cpu" / group).iterdir()) if p.is_dir()]


@pytest.mark.parametrize("path", WORKSPACES, ids=[f"{p.parent.name}-{p.name}" for p in WORKSPACES])
def test_evaluate_builds_the_plans_workspace_spec(path, cpu_judges, monkeypatch):
    """The build step `Judge.evaluate` takes, recorded instead of compiled, against the plan a
    compile worker makes: the same spec, slot and cache key, or the same refusal."""
    cand = Candidate.from_path(path)
    policy = read_header(path).get("policy", "strict")
    judge = cpu_judges[policy]
    plan = plan_build(cand, "cpu", policy)
    built = []
    monkeypatch.setattr(CandidateBuilds, "build", lambda self, spec, ev: built.append(spec) or Path("/nonexistent"))
    v = Verdict(task_id="", task_name="", candidate_hash=cand.hash, device="cpu")
    try:
        judge.builds.workspace(cand, Evaluation(kind="candidate", verdict=v))
        refused = None
    except harness._Stop as stop:
        refused = stop.failure
    if plan.refused:
        assert built == [] and refused is not None
        assert refused.message == (plan.load_error or plan.violations[0])
        assert v.policy_violations == plan.violations
        assert refused.category.value in read_header(path).get("failure", refused.category.value)
    else:
        assert refused is None and built == plan.specs and built[0].slot == f"ws:{path}"
        assert [s.key(judge.builder.fingerprint) for s in built] == \
            [s.key(judge.builder.fingerprint) for s in plan.specs]


ALL_FIXTURES = [p for dev in ("cpu", "cuda") for group in ("hacks", "faults")
                for p in sorted((FIXTURES / dev / group).iterdir())
                if p.suffix == ".py" or (p / "model_new.py").is_file()]


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=[p.relative_to(FIXTURES).as_posix() for p in ALL_FIXTURES])
def test_a_plan_refuses_only_what_the_fixture_expects_to_fail_so(path):
    """The plan's static refusals are the judge's: a fixture it refuses must expect to fail with
    that category (the adversarial suite checks the full verdicts)."""
    h = read_header(path)
    plan = plan_build(Candidate.from_path(path), path.relative_to(FIXTURES).parts[0], h.get("policy", "strict"))
    if plan.refused:
        assert h["expect"] == "fail"
        category = "load" if plan.load_error is not None else "policy"
        assert category in h.get("failure", category), (plan.load_error, plan.violations)
        assert plan.specs == []


def test_literal_forms_are_read_and_computed_ones_left_to_the_judge(monkeypatch):
    source = '''
from torch.utils.cpp_extension import load_inline
import torch
HEAD = "#include <torch/extension.h>\\n"
BODY = HEAD + "torch::Tensor f(torch::Tensor x) { return x; }"
FLAGS = ["-O3"] + ["-DFAST=1"]
ext = load_inline("lit_ext", BODY, functions={"f": "identity"}, extra_cflags=FLAGS, verbose=True,
                  build_directory=str(HEAD))
class ModelNew(torch.nn.Module):
    pass
'''
    plan = plan_build(Candidate.from_source(source), "cpu", "lenient")
    assert plan.specs == [spec_from_request(r) for r in run_and_capture(source, monkeypatch)]
    assert plan.specs[0].cflags == ("-O3", "-DFAST=1")

    computed = '''
from torch.utils.cpp_extension import load_inline
import torch
N = 4
SRC = f"constexpr int n = {N};"
ext = load_inline(name="computed", cpp_sources=SRC, functions=["f"])
flags = ["-O" + str(N - 1)]
ext2 = load_inline(name="computed2", cpp_sources="int g();", extra_cflags=flags)
ext3 = load_inline("inc", "int h();", extra_include_paths=["/usr/include"])
class ModelNew(torch.nn.Module):
    pass
'''
    plan = plan_build(Candidate.from_source(computed), "cpu", "lenient")
    assert plan.specs == [] and len(plan.skipped) == 3
    assert "line 6" in plan.skipped[0] and "SRC" in plan.skipped[0]
    assert "extra_include_paths" in plan.skipped[2]


def test_what_the_judge_refuses_is_not_built():
    cuda_on_cpu = Candidate.from_path(suite_solutions("cuda")["2_GELU"])
    assert plan_build(cuda_on_cpu, "cpu", "strict").skipped[0].endswith("CUDA sources cannot be built for the "
                                                                         "CPU backend")
    fallback = Candidate.from_source("import torch\nclass ModelNew(torch.nn.Module):\n"
                                     "    def forward(self, x):\n        return torch.matmul(x, x)\n")
    plan = plan_build(fallback, "cpu", "strict")
    assert plan.specs == [] and plan.violations and plan.not_built[0].startswith("policy:")
    assert plan_build(Candidate.from_source("x = ("), "cpu", "strict").load_error.startswith("model_new: syntax")


def test_a_workspace_is_built_in_the_judges_slot():
    path = suite_solutions("cpu")["10_RMSNorm"]
    cand = Candidate.from_path(path)
    plan = plan_build(cand, "cpu", "strict")
    assert plan.specs == [workspace_spec(cand.kernels, f"ws:{path}", "cpu")]
    in_memory = Candidate.from_files(cand.model_new, dict(cand.kernels))
    assert workspace_slot(in_memory) == f"ws:{in_memory.hash}"
    assert plan_build(in_memory, "cpu", "strict").specs[0].slot == f"ws:{in_memory.hash}"


def test_builds_fork_from_their_own_zygote_where_workers_start_fresh(tmp_path):
    """`build_zygote` on while workers start as fresh interpreters (the CUDA backend's way, here on
    the CPU): the builds come from a zygote of their own, kept between evaluations and closed with
    the judge; the candidate builds, loads and passes as it does with one zygote for both."""
    cfg = JudgeConfig(device="cpu", compile_mode="none", n_timed=3, use_zygote=False, build_zygote=True, spares=0,
                      cache_dir=tmp_path / "cache")
    silu = FIXTURES / "cpu" / "honest" / "silu_ws"
    with Judge(cfg) as judge:
        assert judge.supply.zygote() is None and judge._build_zygote is not judge.supply.zygote
        verdict = judge.evaluate(load_task_file(FIXTURES / "tasks" / read_header(silu)["task"]),
                                 Candidate.from_path(silu))
        assert verdict.correct and verdict.build_cached is False, verdict.failure
        pid = judge._build_zygote.pid
        assert pid is not None and pid in judge.standby_pids()
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_built_ahead_by_judge_build_is_a_cache_hit_for_evaluate(tmp_path):
    """The compile tool's path (`Judge.build`) and a compile worker's (`build_plan_ahead`)
    fill the cache with what `Judge.evaluate` then finds: real builds, a real evaluation."""
    cfg = JudgeConfig(device="cpu", compile_mode="none", n_timed=3, cache_dir=tmp_path / "cache")
    silu = FIXTURES / "cpu" / "honest" / "silu_ws"
    with Judge(cfg) as judge:
        cand = Candidate.from_path(silu)
        outcome = judge.build(cand)
        assert outcome.compiled and outcome.failure is None and not outcome.cached, outcome.failure
        assert outcome.library is not None and outcome.library.exists()
        assert outcome.keys == [s.key(judge.builder.fingerprint) for s in judge.build_plan(cand).specs]
        again = judge.build(cand)
        assert again.cached and again.keys == outcome.keys
        verdict = judge.evaluate(load_task_file(FIXTURES / "tasks" / read_header(silu)["task"]), cand)
        assert verdict.correct and verdict.build_cached is True, verdict.failure

        refused = judge.build(Candidate.from_path(FIXTURES / "cpu" / "hacks" / "fallback_cpp_aten_qualified_ws"))
        assert not refused.compiled and refused.failure.category.value == "policy" and refused.policy_violations
        assert refused.keys == [] and refused.library is None

        broken = Candidate.from_files(cand.model_new, {rel: src + "\nthis is not C++;\n" for rel, src in cand.kernels})
        failed = judge.build(broken)
        assert not failed.compiled and failed.failure.category.value == "compile" and failed.library is None

        # the library's imports are checked as the judge checks them before loading it
        blas = judge.build(Candidate.from_path(FIXTURES / "cpu" / "hacks" / "fallback_cpp_blas_symbol.py"))
        assert not blas.compiled and blas.failure.category.value == "policy" and blas.library is None
        assert blas.builds and blas.builds[0].violations == blas.policy_violations

        # a single file: its statically read load_inline spec, built by a compile worker's step
        single = Candidate.from_path(FIXTURES / "cpu" / "honest" / "softmax_omp.py")
        plan = plan_build(single, "cpu", "strict")
        assert build_plan_ahead(judge.builder, plan) == (1, 0, [])
        assert build_plan_ahead(judge.builder, plan) == (0, 1, [])
        assert judge.build(single).cached

    # Each build job ran in a pids cgroup of its own (as root): none may outlive its job, or a
    # long-running judge runs the kernel out of cgroups, and a process left inside one lives on.
    deadline = time.monotonic() + 60   # removal waits for the kernel's teardown, in the background
    while _empty_own_cgroups() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _empty_own_cgroups()


def _empty_own_cgroups() -> list[str]:
    """The pids cgroups this process made that hold no process any more: left behind."""
    tag = f"cuda-agent-{os.getpid()}-"
    empty = []
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified"):
        for path in glob.glob(os.path.join(base, tag + "*")):
            try:
                with open(os.path.join(path, "cgroup.procs")) as fh:
                    if not fh.read().split():
                        empty.append(path)
            except OSError:
                pass
    return empty


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

    from cuda_agent.judge.builds import SHARED_BINDING, Builder

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


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["3_Softmax_Rows", "2_GELU"])
def test_cuda_built_ahead_by_judge_build_is_a_cache_hit_for_evaluate(name, tmp_path):
    """On the GPU: a CUDA workspace (3_Softmax_Rows) and a CUDA load_inline file (2_GELU) built by
    `Judge.build` (the compile tool's path) are build-cache hits for `Judge.evaluate`."""
    tasks = {t.name: t for t in suite_tasks("cuda")}
    cfg = JudgeConfig(device="cuda", compile_mode="none", n_timed=5, cache_dir=tmp_path / "cache")
    with Judge(cfg) as judge:
        cand = Candidate.from_path(suite_solutions("cuda")[name])
        outcome = judge.build(cand)
        assert outcome.compiled and outcome.library is not None and len(outcome.keys) == 1, outcome.failure
        assert outcome.keys == [s.key(judge.builder.fingerprint) for s in judge.build_plan(cand).specs]
        verdict = judge.evaluate(tasks[name], cand)
        assert verdict.correct and verdict.build_cached is True, verdict.failure


def test_inline_builds_of_one_flag_set_share_a_precompiled_prelude(tmp_path):
    """load_inline's torch/extension.h, precompiled at a flag set's second use without the
    extension's name, is the one gcc takes for an extension of another name (a header it refused
    would leave the build correct but slow, so the link is checked, and the library is run)."""
    import importlib.util

    import torch

    from cuda_agent.judge.builds import INLINE_PRELUDE, Builder, inline_spec

    builder = Builder(tmp_path / "cache", tmp_path / "work", arch=None, timeout_s=600, uid=None)

    def spec(name: str, k: int):
        return inline_spec(name=name, cpp_sources=[f"torch::Tensor f(torch::Tensor x) {{ return x + {k}; }}"],
                           cuda_sources=[], functions=["f"], cflags=["-O1"], cuda_cflags=[], ldflags=[],
                           with_cuda=False)

    assert builder._pch(spec("first_name", 1)) is None  # a flag set's first use: none made
    assert not list(builder.pch_root.glob(f"inline-*/{INLINE_PRELUDE}.gch"))
    second = builder.build(spec("second_name", 2))
    made = list(builder.pch_root.glob(f"inline-*/{INLINE_PRELUDE}.gch"))
    assert len(made) == 1 and made[0].stat().st_size > 1 << 20
    linked = [p for p in builder.build_root.rglob(f"{INLINE_PRELUDE}.gch") if p.is_symlink()]
    assert [p.resolve() for p in linked] == [made[0].resolve()]
    # gcc used it: the header it read precompiled is missing from main.o's dependencies (ninja's
    # record, from gcc's -MMD), which list a header gcc parsed (a build without it lists the prelude)
    deps = (linked[0].parent.parent / "out" / ".ninja_deps").read_bytes()
    assert b"main.cpp" in deps and INLINE_PRELUDE.encode() not in deps
    loaded = importlib.util.spec_from_file_location("second_name", second.library)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    assert torch.equal(module.f(torch.zeros(3)), torch.full((3,), 2.0))
