"""Nsight Compute's counters for the agent: parsing ncu's CSV, the per-kernel summary and its
diagnosis, what the profile tool says when ncu fails, and (GPU tier) the tool on bundled solutions."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import judge_cache_dir

from cuda_agent.hardware import ncu

FIXTURE = Path(__file__).parent / "fixtures" / "ncu" / "softmax_gemm_h200.csv"


@pytest.fixture
def report() -> str:
    return FIXTURE.read_text()


def test_parse_reads_every_launch_in_base_units(report):
    launches = ncu.parse_ncu(report)
    assert [k.id for k in launches] == ["0", "1", "2", "3", "4"]
    assert launches[0].metrics[ncu.DURATION] == 512384.0          # thousands separators
    assert launches[1].metrics[ncu.DURATION] == 509120.0          # usecond scaled to ns
    assert launches[2].kernel.startswith("void cutlass::Kernel2<")
    assert launches[2].metrics[ncu.REGISTERS] == 202
    assert set(ncu.NCU_METRICS) >= set(launches[0].metrics)
    assert ncu.parse_ncu("==PROF== nothing profiled\n") == []
    # the duration-only view the fidelity benchmark uses
    assert [k["ns"] for k in ncu.parse_ncu_csv(report)][:2] == [512384.0, 509120.0]


def test_summary_groups_launches_and_diagnoses_each_kernel(report):
    summaries = ncu.summarize(ncu.parse_ncu(report))
    by_name = {ncu._short_name(s.kernel): s for s in summaries}
    assert [s.duration_us for s in summaries] == sorted((s.duration_us for s in summaries), reverse=True)
    softmax = by_name["softmax_rows_kernel"]
    assert softmax.launches == 2 and softmax.duration_us == pytest.approx((512384 + 509120) / 1e3)
    # counters weighted by each launch's duration
    assert softmax.dram_pct == pytest.approx((89.71 * 512384 + 90.35 * 509120) / (512384 + 509120))
    assert softmax.dram_gbs == pytest.approx((2147852288 + 2147811328) / (512384 + 509120))
    assert softmax.stalls[0][0] == "long_scoreboard" and "selected" not in dict(softmax.stalls)
    assert softmax.diagnosis.startswith("memory-bound")
    gemm = next(s for s in summaries if "sgemm" in s.kernel)
    assert gemm.diagnosis.startswith("compute-bound") and "math_pipe_throttle" in gemm.diagnosis
    assert by_name["scale_kernel"].diagnosis.startswith("launch-bound")
    row_sum = by_name["row_sum_kernel"]
    assert row_sum.diagnosis.startswith("latency-bound") and "long_scoreboard" in row_sum.diagnosis
    assert "occupancy 48% of 50% possible" in row_sum.diagnosis


def test_busy_sm_pipes_waiting_on_global_memory_are_not_called_compute_bound():
    """The bundled transpose on the H200: SM 64% (its shared-memory pipe), DRAM 60%, warps waiting
    mostly on global loads. "Do fewer instructions" would be the wrong advice; the latency line names
    the stall. A GEMM with the same SM share but waiting on its math stays compute-bound."""
    transpose = ncu.KernelSummary(kernel="batched_transpose_kernel", launches=1, duration_us=730.9, dram_pct=60.0,
                                  mem_pct=60.0, sm_pct=64.0, occupancy_pct=94.0, theoretical_occupancy_pct=100.0,
                                  stalls=[("long_scoreboard", 9.3), ("barrier", 3.8), ("not_selected", 2.9)])
    text = ncu.diagnose(transpose)
    assert text.startswith("latency-bound") and "long_scoreboard" in text and "occupancy 94%" in text
    gemm = transpose.model_copy(update={"kernel": "gemm", "dram_pct": 5.0, "mem_pct": 60.0,
                                        "stalls": [("not_selected", 1.9), ("short_scoreboard", 0.7)]})
    assert ncu.diagnose(gemm).startswith("compute-bound")


def test_render_is_concise_and_names_what_to_do(report):
    summaries = ncu.summarize(ncu.parse_ncu(report))
    text = ncu.render(summaries, peak_dram_gbs=4800)
    assert text.splitlines()[0] == "4 kernels, 5 launches, 3227.5 us of GPU time in one call:"
    assert "softmax_rows_kernel: 1021.5 us in 2 launches" in text and "of 4800" in text
    assert "(const float *" not in text           # argument lists cut
    assert len(text) < 2500                        # well inside the observation budget
    short = ncu.render(summaries, max_kernels=2)
    assert "2 more kernels" in short and "row_sum_kernel" not in short


def test_recorded_h200_report_parses_and_diagnoses():
    """A report recorded on the lent H200 (ncu's own units: ns, inst, register/thread)."""
    text = (FIXTURE.parent / "h200_torch_ops_recorded.csv").read_text()
    launches = ncu.parse_ncu(text)
    assert len(launches) == 4 and all(set(ncu.NCU_METRICS) <= set(k.metrics) for k in launches)
    by_kind = {s.kernel.split("<")[0].split("::")[-1].split("(")[0].strip(): s for s in ncu.summarize(launches)}
    gemm = next(s for s in by_kind.values() if "gemm" in s.kernel)
    assert gemm.duration_us == pytest.approx(3484.288) and gemm.registers == 254
    assert gemm.diagnosis.startswith("compute-bound")
    reduce_ = next(s for s in by_kind.values() if "reduce_kernel" in s.kernel)
    assert reduce_.diagnosis.startswith("memory-bound")
    tiny = next(s for s in by_kind.values() if "elementwise" in s.kernel)
    assert tiny.diagnosis.startswith("launch-bound")


def test_problems_are_recognised():
    assert "ERR_NVGPUCTRPERM" in ncu.ncu_problem("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    assert ncu.ncu_problem("==WARNING== No kernels were profiled.\n") == "ncu saw no kernel launches in the profiled call"
    assert ncu.ncu_problem("==ERROR== Failed to connect\n").startswith("==ERROR== Failed")
    assert ncu.ncu_problem(FIXTURE.read_text()) is None


FAKE_NCU = """#!{python}
# Stand-in for ncu: records its command line, whether this GPU's counters lock is held while it
# runs, and writes {what} to --log-file.
import fcntl, json, os, sys
args = sys.argv[1:]
open({argv_file!r}, "w").write(json.dumps(args))
held = None
if os.path.exists({lock!r}):
    fd = os.open({lock!r}, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = False
    except BlockingIOError:
        held = True
open({argv_file!r} + ".lock", "w").write(json.dumps(held))
log = args[args.index("--log-file") + 1]
open(log, "w").write(open({report!r}).read())
print({stdout!r})
"""


def _fake_ncu(folder: Path, report: Path, stdout: str = "") -> Path:
    from cuda_agent.judge.devlock import counters_lock

    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "ncu"
    exe.write_text(FAKE_NCU.format(python=sys.executable, what=report.name, argv_file=str(folder / "argv.json"),
                                   report=str(report), stdout=stdout,
                                   lock=str(counters_lock().path)))
    exe.chmod(0o755)
    return exe


@pytest.fixture
def toolbox(tmp_path):
    from cuda_agent.agent.tools import Toolbox
    from cuda_agent.rollout.evaluator import LocalEvaluator
    from cuda_agent.agent.workspace import create_workspace
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.suite import suite_dir
    from cuda_agent.tasks import load_task_file

    task = load_task_file(suite_dir() / "cuda" / "level1" / "3_Softmax_Rows.py")
    box = Toolbox(task, create_workspace(task, tmp_path / "ws", "cuda"), LocalEvaluator(JudgeConfig(device="cpu")))
    yield box
    box.close()


def test_profile_tool_starts_ncu_with_the_candidate_confined(toolbox, tmp_path, monkeypatch, report):
    from cuda_agent.hardware import count_work, speed_of_light
    from cuda_agent.judge.verdict import Verdict

    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "test-ncu-lock")  # a lock of its own
    _fake_ncu(bin_dir, FIXTURE)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sol = speed_of_light(count_work(toolbox.task.source), "NVIDIA H200")
    v = Verdict(task_id="t", task_name="3_Softmax_Rows", candidate_hash="c", device="cuda", speed_of_light=sol)
    text, why = toolbox._ncu_run(["--candidate", "model_new.py", "--library", "lib.so", "--confine"], v)
    assert why == "" and text is not None
    assert "memory-bound" in text and "of 4800" in text
    argv = json.loads((bin_dir / "argv.json").read_text())
    assert argv[:6] == ["--csv", "--print-units", "base", "--profile-from-start", "off", "--clock-control"]
    assert argv[argv.index("--metrics") + 1] == ",".join(ncu.NCU_METRICS)
    tail = argv[argv.index("cuda_agent.agent.profile_run"):]
    assert {"--ncu", "--confine", "--candidate"} <= set(tail)
    # the GPU's counters serve one ncu at a time: the tool held this GPU's lock while ncu ran
    assert json.loads((bin_dir / "argv.json.lock").read_text()) is True


def test_profile_tool_says_why_ncu_gave_nothing(toolbox, tmp_path, monkeypatch):
    from cuda_agent.judge.verdict import Verdict

    denied = tmp_path / "denied.txt"
    denied.write_text("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                      "permission to access NVIDIA GPU Performance Counters on the target device 0.\n")
    bin_dir = tmp_path / "bin"
    _fake_ncu(bin_dir, denied)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    v = Verdict(task_id="t", task_name="x", candidate_hash="c", device="cuda")
    text, why = toolbox._ncu_run(["--candidate", "model_new.py"], v)
    assert text is None and "no permission to read the GPU's performance counters" in why
    monkeypatch.setenv("PATH", "/nonexistent")
    assert toolbox._ncu_run([], v) == (None, "ncu is not on PATH")


def test_confinement_works_under_the_tool_runners_lower_file_size_limit(tmp_path):
    """The tools start profiling with `ulimit -f` already set (ToolConfig.shell_output_bytes); the
    profiling process then shuts itself in without trying to raise that hard limit (which fails)."""
    import subprocess

    code = ("import resource; from cuda_agent.agent.profile_run import confine; confine(); "
            "print(resource.getrlimit(resource.RLIMIT_FSIZE)[1])")
    out = subprocess.run(["bash", "-c", f'ulimit -f 65536 && exec "{sys.executable}" -c "$0"', code],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) == 65536 * 1024


# ------------------------------------------------------------------------------------------ GPU tier
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["3_Softmax_Rows", "1_Linear_Bias_ReLU", "9_Cumsum_Rows", "6_Batched_Transpose"])
def test_profile_tool_on_a_bundled_solution(name, tmp_path, tmp_path_factory):
    """The profile tool on a bundled workspace solution: the judge's verdict with its share of
    speed-of-light, then Nsight Compute's per-kernel summary (or, without ncu, the fallback that says why)."""
    from cuda_agent.agent.tools import Toolbox
    from cuda_agent.rollout.evaluator import LocalEvaluator
    from cuda_agent.agent.workspace import create_workspace
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.suite import suite_dir
    from cuda_agent.tasks import load_task_file

    task = next((suite_dir() / "cuda").glob(f"level*/{name}.py"))
    task = load_task_file(task)
    ws = create_workspace(task, tmp_path / "ws", "cuda")
    shutil.copytree(suite_dir() / "solutions" / "cuda" / name, ws, dirs_exist_ok=True)  # model_new.py, kernels/
    gate = LocalEvaluator(JudgeConfig(device="cuda", compile_mode="none", n_timed=10, cache_dir=judge_cache_dir(tmp_path_factory)))
    box = Toolbox(task, ws, gate)
    try:
        obs = box.call("profile", {"target": "candidate"})
    finally:
        box.close()
        gate.close()
    print(obs.text)
    assert obs.ok and obs.verdict is not None and obs.verdict.correct, obs.text
    assert "speed-of-light" in obs.text and "your runtime is" in obs.text
    assert obs.verdict.sol_share is not None and 0 < obs.verdict.sol_share <= 1.0
    if shutil.which("ncu") is None:
        assert "Nsight Compute unavailable: ncu is not on PATH" in obs.text
        return
    assert "per-kernel profile (Nsight Compute" in obs.text, obs.text
    assert any(word in obs.text for word in ("memory-bound", "compute-bound", "latency-bound", "launch-bound"))
    assert "DRAM" in obs.text and "occupancy" in obs.text
