"""Memory safety on request (JudgeConfig.memcheck, judge/memcheck.py).

CPU tier: the sanitizer's report read into a verdict (memcheck and racecheck output, program output
interleaved, a clean run), the tools chosen, the verdict's failure for each way a run ends, and the
missing sanitizer as a clear error. Slow, still CPU: the sandboxed run itself, with stand-ins for
compute-sanitizer that run the program and then print a clean summary or a canned error report.
GPU: the out-of-bounds fixture fails with memcheck on and passes with it off; honest kernels pass
both ways (one with shared memory, so racecheck runs too); the seconds it costs are printed.
"""

from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path

import pytest

from cuda_agent.judge import memcheck as mc
from cuda_agent.judge.verdict import FailureCategory, SanitizerRun

FIXTURES = Path(__file__).parent / "fixtures"

MEMCHECK_OUT = textwrap.dedent("""\
    ========= COMPUTE-SANITIZER
    model output line the program printed
    ========= Invalid __global__ read of size 4 bytes
    =========     at silu_tail_kernel(const float *, float *, long)+0x90
    =========     by thread (219,0,0) in block (48050,0,0)
    =========     Address 0x7f3a5e000010 is out of bounds
    =========     and is 13 bytes after the nearest allocation at 0x7f3a5b000000 of size 49204396 bytes
    =========     Saved host backtrace up to driver entry point at kernel launch time
    =========     Host Frame: [0x2f0bcf] in libcuda.so.1
    =========     Host Frame: [0x15803] in libcudart.so.13
    =========
    ========= Invalid __global__ read of size 4 bytes
    =========     at silu_tail_kernel(const float *, float *, long)+0x90
    =========
    ========= ERROR SUMMARY: 3 errors
    """)

RACECHECK_OUT = textwrap.dedent("""\
    ========= COMPUTE-SANITIZER
    ========= Error: Race reported between Write access at row_softmax(const float *, float *, int)+0x1a0
    =========     and Read access at row_softmax(const float *, float *, int)+0x2c0 [1024 hazards]
    =========
    ========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
    """)


# ------------------------------------------------------------------------------------ the report
def test_the_first_memcheck_report_is_kept_without_host_frames():
    errors, first = mc.parse_report(MEMCHECK_OUT)
    assert errors == 3
    assert first.splitlines()[0] == "Invalid __global__ read of size 4 bytes"
    assert "13 bytes after the nearest allocation" in first
    assert "Host Frame" not in first and "model output" not in first
    assert first.count("Invalid __global__ read") == 1  # the first report only


def test_a_racecheck_hazard_is_read_with_its_error_count():
    errors, first = mc.parse_report(RACECHECK_OUT)
    assert errors == 1
    assert first.startswith("Error: Race reported between Write access") and "Read access" in first


def test_a_clean_run_has_no_report():
    assert mc.parse_report("========= COMPUTE-SANITIZER\nhello\n========= ERROR SUMMARY: 0 errors\n") == (0, None)
    assert mc.parse_report("") == (None, None)


def test_racecheck_runs_only_where_the_sources_declare_shared_memory():
    assert mc.tools_for(["__global__ void k(float* x) { x[0] = 1; }"]) == ["memcheck"]
    assert mc.tools_for(["x", "__global__ void k() { __shared__ float t[32]; }"]) == ["memcheck", "racecheck"]
    assert mc.tools_for(["extern __shared__ float dyn[];"]) == ["memcheck", "racecheck"]


def test_the_sanitizer_decides_by_its_exit_status_and_reports_no_api_errors():
    argv = mc.sanitizer_argv("/cuda/bin/compute-sanitizer", "memcheck", ["python", "-m", "x"])
    assert argv[:3] == ["/cuda/bin/compute-sanitizer", "--tool", "memcheck"]
    assert argv[argv.index("--error-exitcode") + 1] == str(mc.ERROR_EXIT)
    assert argv[argv.index("--report-api-errors") + 1] == "no"
    assert "--padding" in argv and argv[-3:] == ["python", "-m", "x"]
    assert "--padding" not in mc.sanitizer_argv("s", "racecheck", ["p"])


# ------------------------------------------------------------------------------------ the failure
def _run(code, errors=None, first=None, tool="memcheck"):
    return SanitizerRun(tool=tool, exit_code=code, errors=errors, first_report=first, seconds=12.0)


def test_errors_found_fail_with_the_runtime_category_and_the_first_report():
    f = mc.failure_of(_run(mc.ERROR_EXIT, 3, "Invalid __global__ read of size 4 bytes"), mc.START_MARK)
    assert f.category == FailureCategory.RUNTIME
    assert "memcheck found 3 errors" in f.message and "Invalid __global__ read" in f.message


def test_a_clean_run_passes_only_when_the_call_finished():
    assert mc.failure_of(_run(0, 0), f"{mc.START_MARK}\n{mc.DONE_MARK}\n") is None
    f = mc.failure_of(_run(0, 0), f"{mc.START_MARK}\n")  # exited 0 without finishing its call
    assert f is not None and f.category == FailureCategory.RUNTIME


def test_how_a_run_ends_decides_whose_fault_it_is():
    assert mc.failure_of(_run(3), f"{mc.START_MARK}\ncandidate raised").category == FailureCategory.RUNTIME
    assert mc.failure_of(_run(-11), f"{mc.START_MARK}\n").category == FailureCategory.CRASH
    assert mc.failure_of(_run(None), f"{mc.START_MARK}\n").category == FailureCategory.TIMEOUT
    # nothing of the candidate ran: the sanitizer or the confinement failed, which is the judge's
    assert mc.failure_of(_run(4), "seccomp refused").category == FailureCategory.JUDGE
    assert mc.failure_of(_run(1), "==ERROR== unknown option").category == FailureCategory.JUDGE
    assert mc.failure_of(_run(None), "").category == FailureCategory.JUDGE


def test_a_missing_sanitizer_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(mc, "TOOLKIT_ROOTS", (str(tmp_path / "none"),))
    assert mc.find_sanitizer() is None
    problem = mc.sanitizer_problem()
    assert "compute-sanitizer" in problem and "memcheck=false" in problem
    with pytest.raises(RuntimeError, match="compute-sanitizer"):
        mc.run_tool("memcheck", lambda wrap: None, 1.0)


def test_memcheck_is_off_by_default():
    from cuda_agent.judge import JudgeConfig

    assert JudgeConfig(device="cpu").memcheck is False
    assert JudgeConfig(device="cpu", memcheck=True).memcheck is True


# ------------------------------------------------------------------------------------ the sandboxed run (CPU)
CLEAN = """#!/bin/sh
# stand-in for compute-sanitizer: skip its options, run the program, print a clean summary
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift 2; done
"$@"; code=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $code
"""
DIRTY = """#!/bin/sh
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift 2; done
"$@"
echo "========= Invalid __global__ read of size 4 bytes"
echo "=========     at fake_kernel+0x10"
echo "========="
echo "========= ERROR SUMMARY: 1 error"
exit 86
"""
CANDIDATE = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)
"""
REFERENCE = (FIXTURES / "tasks" / "elementwise.py").read_text()


def _sanitizer(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / f"bin{abs(hash(body)) % 1000}"
    folder.mkdir()
    exe = folder / "compute-sanitizer"
    exe.write_text(body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def _check(tmp_path, monkeypatch, body: str, model_new: str = CANDIDATE):
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.sandbox import work_root_dir

    monkeypatch.setenv("PATH", f"{_sanitizer(tmp_path, body)}{os.pathsep}{os.environ['PATH']}")
    live: list = []
    try:
        return mc.check_candidate(task_source=REFERENCE, model_new=model_new, libraries=[], sources=[model_new],
                                  init_seed=1, input_seed=2, config=JudgeConfig(device="cpu", cache_dir=tmp_path / "c"),
                                  work_root=work_root_dir(), uid=None, live=live, device="cpu")
    finally:
        for proc in live:
            proc.cleanup()


@pytest.mark.slow
def test_a_sandboxed_run_under_a_clean_sanitizer_passes(tmp_path, monkeypatch):
    runs, failure = _check(tmp_path, monkeypatch, CLEAN)
    assert failure is None, failure
    assert [r.tool for r in runs] == ["memcheck"] and runs[0].exit_code == 0 and runs[0].errors == 0


@pytest.mark.slow
def test_a_sandboxed_run_with_errors_fails_with_the_report(tmp_path, monkeypatch):
    runs, failure = _check(tmp_path, monkeypatch, DIRTY)
    assert failure is not None and failure.category == FailureCategory.RUNTIME, failure
    assert "Invalid __global__ read" in failure.message and runs[0].errors == 1


@pytest.mark.slow
def test_a_candidate_that_raises_under_the_sanitizer_fails_as_runtime(tmp_path, monkeypatch):
    raising = CANDIDATE.replace("return x * torch.sigmoid(x)", "raise ValueError('boom under memcheck')")
    runs, failure = _check(tmp_path, monkeypatch, CLEAN, raising)
    assert failure is not None and failure.category == FailureCategory.RUNTIME, failure
    assert "boom under memcheck" in failure.message and runs[0].exit_code == 3


@pytest.mark.slow
def test_a_candidate_flooding_the_log_still_fails_as_its_own_fault(tmp_path, monkeypatch):
    """Output past what the log's tail holds cannot hide that candidate code ran (the judge's category)."""
    flooding = CANDIDATE.replace("return x * torch.sigmoid(x)",
                                 "print('x' * 400_000, flush=True); raise ValueError('after the flood')")
    _, failure = _check(tmp_path, monkeypatch, CLEAN, flooding)
    assert failure is not None and failure.category == FailureCategory.RUNTIME, failure


@pytest.mark.slow
def test_the_candidate_runs_confined(tmp_path, monkeypatch):
    """The worker's audit hook is in force in the sanitized process: a candidate that spawns a shell fails."""
    escaping = CANDIDATE.replace("return x * torch.sigmoid(x)",
                                 "import os; os.system('true'); return x * torch.sigmoid(x)")
    _, failure = _check(tmp_path, monkeypatch, CLEAN, escaping)
    assert failure is not None and failure.category == FailureCategory.RUNTIME, failure
    assert "os.system is not allowed" in failure.message


# ------------------------------------------------------------------------------------ GPU
def _judge_fixture(tmp_path, name: str, memcheck: bool):
    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.tasks import load_task_file

    from conftest import read_header

    path = FIXTURES / "cuda" / name
    header = read_header(path)
    task = load_task_file(FIXTURES / "tasks" / header["task"])
    with Judge(JudgeConfig(device="cuda", compile_mode="none", n_timed=5, cache_dir=tmp_path / "cache",
                           memcheck=memcheck)) as j:
        return j.evaluate(task, Candidate.from_path(path))


def _need_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.mark.gpu
@pytest.mark.slow
def test_an_out_of_bounds_read_that_does_not_fault_fails_only_with_memcheck(tmp_path):
    _need_gpu()
    off = _judge_fixture(tmp_path, "memcheck/oob_read_tail.py", memcheck=False)
    assert off.correct, off.failure  # it does not fault, and its values are right
    on = _judge_fixture(tmp_path, "memcheck/oob_read_tail.py", memcheck=True)
    assert on.failure is not None and on.failure.category == FailureCategory.RUNTIME, on.failure
    assert "compute-sanitizer memcheck" in on.failure.message and "out of bounds" in on.failure.message
    print(f"memcheck on the out-of-bounds read: {on.phase_s.get('memcheck'):.1f} s")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name", ["memcheck/silu_bounded.py", "honest/softmax_rows.py", "honest/matmul_tiled.py"])
def test_honest_kernels_pass_with_memcheck_on_and_off_and_its_cost_is_printed(tmp_path, name):
    _need_gpu()
    off = _judge_fixture(tmp_path, name, memcheck=False)
    on = _judge_fixture(tmp_path, name, memcheck=True)  # same cache: builds and baselines are warm for both
    assert off.correct, off.failure
    assert on.correct, on.failure
    assert on.memcheck and all(r.exit_code == 0 for r in on.memcheck)
    print(f"{name}: judged in {off.judge_s:.1f} s without memcheck, {on.judge_s:.1f} s with it "
          f"({', '.join(f'{r.tool} {r.seconds:.1f} s' for r in on.memcheck)})")
