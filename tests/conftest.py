"""Shared pytest configuration.

Two tiers: the fast one (`-m "not slow"`) is pure Python - parsing, records, units, policy checks,
CLI usage errors - and compiles nothing; the slow one (`-m slow`) builds C++, runs torch.compile,
judges candidates end to end or runs synthesis. Which tests are slow is listed here, in one place,
rather than left to each file. In the fast tier the C++ toolchain is replaced by stand-ins that
exit with status 97 and a message naming the rule (torch's extension builder often reports only
the status: "'c++' ... returned non-zero exit status 97" means this), so a test that starts compiling is caught there instead of
quietly making the fast tier slow. Tests marked `gpu` run only where torch sees a CUDA device.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

# Modules whose every test is slow: each judges candidates end to end, drives a synthesis run or a
# CLI command that does, or builds C++.
SLOW_MODULES = frozenset({
    "test_agent_e2e.py",          # an agent run that builds and judges its kernel
    "test_bench_resume.py",       # a bench run of real candidates, killed and resumed
    "test_check_reference.py",    # references checked in judge worker processes
    "test_synth_pipeline.py",     # synthesis runs (generate, filter, judge, export)
    "test_timing_remeasure.py",   # judges a built OpenMP candidate
    "test_observer.py",           # builds the judge's operator observer and loads it
    "test_sandbox.py",            # real sandboxed processes, judged candidates (the observer is built)
    "test_tolerance.py",          # judged candidates and references (the observer is built)
    "test_train_stages.py",       # training stages with a tiny model: updates, checkpoints, a killed run resumed
    "test_pool_ray.py",           # starts a local Ray instance and a Ray actor per worker (~90 s)
    "test_serve_e2e.py",          # the service judges C++ candidates, is killed and restarted
    "test_train_bench.py",        # ten-turn agentic episodes of a model through the real tools (~1 min on CPU)
    "test_train_collect.py",      # the collect stage with the tiny model through the real tools
    "test_train_verl_ray.py",     # a local Ray instance with declared GPUs and judge actors (~2 min)
})

# Single slow tests in modules that are otherwise fast (module file name -> test function names).
SLOW_TESTS = {
    "test_adversarial.py": {"test_cpu_fixture", "test_cuda_fixture", "test_cpu_judge_survives_faults",
                            "test_cuda_judge_survives_faults"},
    "test_cli.py": {"test_eval_json_contract_for_an_honest_candidate", "test_eval_exits_zero_with_a_failing_verdict",
                    "test_build_ahead_fills_the_judges_cache"},
    "test_judge_units.py": {"test_spare_workers_are_kept_under_distinct_uids_and_used",
                            "test_a_worker_set_up_failure_is_the_judges_not_the_candidates",
                            "test_a_torch_compile_baselines_first_calls_get_a_builds_time_limit",
                            "test_the_op_stand_in_is_valid_cpp_that_declares_what_is_called_and_nothing_else"},
    "test_pool.py": {"test_real_judge_through_the_pool_keeps_baselines_in_the_database"},
    "test_ncu.py": {"test_profile_tool_on_a_bundled_solution"},   # judges and profiles built solutions (GPU)
    "test_launches.py": {"test_launch_observer_sees_every_launch"},  # builds the launch observer (GPU)
    # the service on loopback: restarts, waits for back-pressure, and the load test of 1,000 submissions
    "test_serve.py": {"test_a_restart_keeps_finished_verdicts_and_judges_again_what_was_in_flight",
                      "test_a_full_queue_answers_429_and_the_client_waits_it_out",
                      "test_the_client_retries_through_a_restart",
                      "test_many_clients_with_duplicates_lose_and_duplicate_no_verdict"},
    "test_prebuild.py": {"test_a_prebuilt_candidate_is_a_cache_hit_for_the_judge",
                         "test_built_ahead_by_judge_build_is_a_cache_hit_for_evaluate",
                         "test_builds_fork_from_their_own_zygote_where_workers_start_fresh",
                         "test_workspace_builds_link_one_shared_binding_object",
                         "test_inline_builds_of_one_flag_set_share_a_precompiled_prelude"},
    # every Evaluator judges a bundled CPU solution for real: local, memo, pool, the service, a Ray actor
    "test_rollout_evaluator.py": {"test_local_evaluator_conforms", "test_memo_over_local_conforms",
                                  "test_pool_evaluator_conforms", "test_remote_evaluator_conforms",
                                  "test_ray_evaluator_conforms", "test_local_and_pool_evaluators_conform_on_cuda"},
    "test_suite.py": {"test_cpu_solution_passes", "test_cuda_solution_passes", "test_bench_cli_runs_the_cpu_suite"},
    # torch.compile; and two that wait out a hung task's timeout and a worker's task budget
    "test_synth_filters.py": {"test_compile_filter_keeps_a_matching_task_and_rejects_a_mismatch",
                              "test_a_crashing_or_hanging_task_costs_only_that_task",
                              "test_worker_is_replaced_after_its_task_budget"},
}

# What the fast tier may not run: compilers, the build tool torch's extension builder drives, nvcc.
_TOOLCHAIN = ("c++", "g++", "gcc", "cc", "clang", "clang++", "nvcc", "ninja")


def is_slow(item: pytest.Item) -> bool:
    module = Path(str(item.fspath)).name
    name = getattr(item, "originalname", None) or item.name.split("[")[0]
    return module in SLOW_MODULES or name in SLOW_TESTS.get(module, ()) or "slow" in item.keywords


def _fast_tier_only(config: pytest.Config) -> bool:
    return (config.getoption("markexpr", "") or "").replace(" ", "") in ("notslow", "(notslow)")


def pytest_configure(config: pytest.Config) -> None:
    if not _fast_tier_only(config):
        return
    # Stand-ins first on PATH (inherited by every process the tests start, judge workers included):
    # a fast-tier test that reaches a compiler fails with this message in its build log.
    shims = Path(tempfile.mkdtemp(prefix="fast-tier-toolchain-"))
    shims.chmod(0o755)  # judge workers run under other uids
    config.add_cleanup(lambda: shutil.rmtree(shims, ignore_errors=True))
    for tool in _TOOLCHAIN:
        shim = shims / tool
        shim.write_text(f"#!/bin/sh\necho \"error: fast test tier: {tool} was run; a test that builds C++ or runs "
                        "torch.compile belongs to the slow tier (tests/conftest.py SLOW_MODULES / SLOW_TESTS)\"\n"
                        "exit 97\n")
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["PATH"] = f"{shims}{os.pathsep}{os.environ.get('PATH', '')}"
    for var in ("CC", "CXX"):  # an absolute compiler path in the environment would go around PATH
        os.environ.pop(var, None)


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: no GPU tier
        return False


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = pytest.mark.slow
    for item in items:
        if is_slow(item) and item.get_closest_marker("slow") is None:
            item.add_marker(slow)
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _gpu_lock(exclusive: bool):
    """The GPU between pytest-xdist workers (processes), through the judge's own kind of device lock
    (cuda_agent/judge/devlock.py): GPU tests share it; a `gpu_exclusive` test holds it alone. Why:
    the GPU tier runs several workers on one GPU. The judges of two workers never time a call beside
    each other's calls (every CUDA judge takes its GPU's lock, JudgeConfig.device_lock), but what
    runs outside a judge's calls does not ask: a kernel that spins until the judge kills it (the
    hang fixtures), a model loaded by a training test (tens of GiB, and heavy kernels) would take
    the GPU's time slices or its memory from another worker's timed calls, so an honest kernel's
    wall clock there is several times its GPU time and the judge rightly calls the claim a lie."""
    from cuda_agent.judge.devlock import DeviceLock

    return DeviceLock(Path(tempfile.gettempdir()) / f"cuda-agent-tests-gpu-{os.getuid()}.lock").hold(exclusive)


@pytest.fixture(autouse=True)
def _gpu_share(request: pytest.FixtureRequest):
    if "gpu" not in request.node.keywords or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    with _gpu_lock(exclusive=request.node.get_closest_marker("gpu_exclusive") is not None):
        yield
        # what the test computed on the GPU itself, given back before another worker's test runs
        # (the judge gives back its own after each evaluation)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With CUDA_AGENT_FAILURE_LOG set, each failure's report is appended to that file as it arrives
    (under xdist too: the controller receives every worker's reports), so a run cut short by its time
    limit still says why each test failed, not only which (the GPU tier's case on a lent machine)."""
    path = os.environ.get("CUDA_AGENT_FAILURE_LOG")
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):  # the controller writes
        return
    with open(path, "a") as fh:
        fh.write(f"===== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext[-12000:]}\n")
        for name, text in report.sections:
            if text.strip():
                fh.write(f"----- {name}\n{text[-4000:]}\n")


def judge_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """The judge cache of the test modules: one folder for the whole session,
    fresh each run and shared by the modules that ask for it here, so that a candidate two modules
    judge is compiled once, and the precompiled headers (made in the cache, `Builder._pch`, ~50 s
    each on 2 cores) once per run rather than once per module. Builds are keyed by their sources,
    flags and toolchain, baselines by task, settings and machine, as in a user's own cache. With
    CUDA_AGENT_TEST_CACHE set, that folder instead, shared by the runs too (the GPU tier fills it
    ahead with `cuda-agent build`, so its CUDA builds run many at once instead of one after another
    inside the tests). A test that needs a cache of its own (cache hits and misses, what a build
    leaves there) makes one under its tmp_path."""
    shared = os.environ.get("CUDA_AGENT_TEST_CACHE")
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        return Path(shared)
    folder = tmp_path_factory.getbasetemp() / "judge-cache"
    folder.mkdir(exist_ok=True)
    return folder


def selected_params(session: pytest.Session, module_file: str, test_name: str, param: str) -> list:
    """The values of `param` in this session's items of `test_name` in `module_file` (what -k, -m or
    node ids left of its parametrisation), in order."""
    module = Path(module_file).name
    return [item.callspec.params[param] for item in session.items
            if getattr(item, "originalname", None) == test_name and Path(str(item.fspath)).name == module
            and hasattr(item, "callspec")]


def build_ahead_in_parallel(paths: list[Path], config) -> None:
    """Compile the candidates at `paths` into `config.cache_dir` before a module judges them, as many
    at once as there are cores (`cuda-agent build`: the judge's own plan and build step, sandboxed,
    keyed as the judge keys them). The judge then finds them built, so their compiler time is spread
    over the cores instead of taken one build after another inside the tests, as the GPU tier does
    with its fixtures (benchmarks/gpu/device_gpu.sh prebuild). What cannot be planned ahead (a
    load_inline call computed at run time), or fails to build, the judge builds itself and reports
    as always; the judging itself is unchanged. On one core there is nothing to gain: nothing is done."""
    from cuda_agent import host
    from cuda_agent.candidate import Candidate
    from cuda_agent.pool.prebuild import build_ahead

    cores = host.usable_cores()
    if len(paths) > 1 and cores > 1:
        build_ahead([Candidate.from_path(p) for p in paths], config, parallel=cores, jobs=1)


def read_header(path: Path) -> dict[str, str]:
    """The `# key: value` lines that open a fixture (a file, or a workspace folder's model_new.py)."""
    source = path / "model_new.py" if path.is_dir() else path
    header: dict[str, str] = {}
    for line in source.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        if sep:
            header[key.strip()] = value.strip()
    return header
