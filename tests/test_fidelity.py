"""cuda_agent.fidelity (`cuda-agent fidelity`): the corpus format and its problem mapping, the classification rules, the
statistics, the ncu CSV parser, and an end-to-end run on a tiny corpus of C++ (load_inline)
solutions judged for real on the CPU backend (correct ones, a compile error, wrong results, a result
just above the tolerance, a lenient-policy refusal), resumed, re-reported with reviewed records."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import judge_cache_dir

from cuda_agent import fidelity as fid

REPO = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "cuda_agent.cli", "fidelity"]
RUNNER = [sys.executable, "-m", "cuda_agent.fidelity.ncu_runner"]

# ------------------------------------------------------------------------------- a tiny corpus

SILU_TASK = '''import torch
import torch.nn as nn

ROWS = 128
COLS = 512


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * torch.sigmoid(x)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
'''

RELU_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, shift):
        super().__init__()
        self.shift = shift

    def forward(self, x):
        return torch.relu(x) + self.shift


def get_inputs():
    return [torch.randn(96, 384)]


def get_init_inputs():
    return [0.5]
'''

SILU_CPP = r'''
torch::Tensor silu_forward(torch::Tensor x) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "contiguous fp32 input expected");
  torch::Tensor y = torch::empty_like(x);
  const float* a = x.data_ptr<float>();
  float* b = y.data_ptr<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) b[i] = a[i] / (1.0f + std::exp(-a[i]));
  return y;
}
'''


def silu_solution(glue: str) -> str:
    """A published-style solution: load_inline at module level, `glue` as forward's return."""
    return f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

silu_source = r"""{SILU_CPP}"""

silu = load_inline(name="fid_silu_cpu", cpp_sources=[silu_source], functions=["silu_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {glue}
'''


BROKEN = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
torch::Tensor silu_forward(torch::Tensor x) {
  return y;  // y was never declared
}
"""

ext = load_inline(name="fid_broken_cpu", cpp_sources=[src], functions=["silu_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.silu_forward(x)
'''

# Refused by the lenient policy too (no fallbacks), though KernelBench would accept it.
TRY_EXCEPT = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        try:
            return x * torch.sigmoid(x)
        except RuntimeError:
            raise
'''

RELU = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_source = r"""
torch::Tensor relu_shift(torch::Tensor x, double shift) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "contiguous fp32 input expected");
  torch::Tensor y = torch::empty_like(x);
  const float* a = x.data_ptr<float>();
  float* b = y.data_ptr<float>();
  const float s = static_cast<float>(shift);
  for (int64_t i = 0; i < x.numel(); ++i) b[i] = (a[i] > 0.0f ? a[i] : 0.0f) + s;
  return y;
}
"""

ext = load_inline(name="fid_relu_cpu", cpp_sources=[relu_source], functions=["relu_shift"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, shift):
        super().__init__()
        self.shift = shift

    def forward(self, x):
        return ext.relu_shift(x, self.shift)
'''

# (display_name, level, problem_id, code, recorded torch_speedup)
RECORDS = [
    ("model-a", 1, 0, silu_solution("silu.silu_forward(x)"), 1.2),
    ("model-b", 1, 0, BROKEN, 0.8),
    ("model-c", 1, 0, TRY_EXCEPT, 0.9),
    ("model-d", 1, 0, silu_solution("silu.silu_forward(x) * 1.5"), 1.1),
    ("model-e", 1, 0, silu_solution("silu.silu_forward(x) + 0.03"), 1.0),
    ("model-g", 1, 0, silu_solution("silu.silu_forward(x.contiguous())"), 1.3),
    ("model-f", 2, 4, RELU, 2.0),
]
EXPECTED = {
    "l1_p1_model-a": ("correct", "correct"),
    "l1_p1_model-b": ("solution_error", "compile-error"),
    "l1_p1_model-c": ("policy_difference", "policy-refusal"),
    "l1_p1_model-d": ("solution_error", "wrong-results"),
    "l1_p1_model-e": ("judge_problem", "near-tolerance"),
    "l1_p1_model-g": ("correct", "correct"),
    "l2_p5_model-f": ("correct", "correct"),
}


def make_corpus(root: Path, records=RECORDS, with_data_json: bool = True) -> Path:
    """The leaderboard's layout: docs/assets/{raw_data.json, data.json, problems/l{L}_p{N}.py}."""
    assets = root / "docs" / "assets"
    (assets / "problems").mkdir(parents=True)
    (assets / "problems" / "l1_p1.py").write_text(SILU_TASK)
    (assets / "problems" / "l2_p5.py").write_text(RELU_TASK)
    raw, data = [], {}
    for i, (name, level, pid, code, speedup) in enumerate(records):
        file = f"{i:02d}" + "ab" * 15
        raw.append({"problem_id": pid, "code": code, "torch_speedup": speedup, "torch_compile_speedup": speedup / 2,
                    "baseline_torch_time": 1.0, "baseline_torch_compile_time": 2.0, "kernel_eval_time": 1.0 / speedup,
                    "level": level, "model": name.upper(), "display_name": name, "file": file})
        title = "Level 1: 1_SiLU" if level == 1 else "Level 2: 5_ReLU_Shift"
        data.setdefault(title, []).append({"display_name": name, "torch_speedup": speedup, "file": file})
    (assets / "raw_data.json").write_text(json.dumps(raw))
    if with_data_json:
        (assets / "data.json").write_text(json.dumps(data))
    return assets


def run_script(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


# ------------------------------------------------------------------------------- corpus and mapping

def test_problem_id_counts_from_zero_and_data_json_decides(tmp_path):
    assets = make_corpus(tmp_path)
    corpus = fid.load_corpus(tmp_path)            # a checkout's root: docs/assets is found
    assert corpus.root == assets
    keys = {r.key: r for r in corpus.records}
    assert set(keys) == set(EXPECTED)
    assert keys["l2_p5_model-f"].problem == assets / "problems" / "l2_p5.py"
    assert keys["l2_p5_model-f"].task_name == "5_ReLU_Shift"
    assert keys["l1_p1_model-a"].problem_id == 0 and keys["l1_p1_model-a"].number == 1
    assert corpus.conflicts == [] and corpus.skipped == []

    # data.json names the problem of a record; a problem_id that disagrees is reported, data.json wins.
    raw = json.loads((assets / "raw_data.json").read_text())
    raw[0]["problem_id"] = 7
    raw.append(dict(raw[1], problem_id=41, file="no-such-entry", display_name="orphan"))
    (assets / "raw_data.json").write_text(json.dumps(raw))
    corpus = fid.load_corpus(assets)
    assert len(corpus.conflicts) == 1 and "problem_id 7" in corpus.conflicts[0]
    assert "l1_p1_model-a" in {r.key for r in corpus.records}
    assert any("l1_p42.py" in s for s in corpus.skipped)  # not in data.json: problem_id + 1, no such file


def test_problem_mapping_without_data_json(tmp_path):
    make_corpus(tmp_path, with_data_json=False)
    corpus = fid.load_corpus(tmp_path)
    assert {r.key for r in corpus.records} == set(EXPECTED)
    assert {r.task_name for r in corpus.records} == {"l1_p1", "l2_p5"}


REAL_CORPUS = Path(os.environ.get("FIDELITY_CORPUS", "/work/corpus/docs/assets"))


@pytest.mark.skipif(not (REAL_CORPUS / "raw_data.json").is_file(), reason="leaderboard corpus not on disk")
def test_real_corpus_maps_every_record():
    corpus = fid.load_corpus(REAL_CORPUS)
    raw = json.loads((REAL_CORPUS / "raw_data.json").read_text())
    assert len(corpus.records) == len(raw) and not corpus.skipped and not corpus.conflicts
    by_file, names = fid.names_by_file(REAL_CORPUS)
    named = [r for r in corpus.records if r.file in by_file]
    assert len(named) > len(raw) // 2
    assert all(r.number == r.problem_id + 1 for r in corpus.records)
    # The name data.json gives a problem matches the reference's own description.
    first = next(r for r in corpus.records if (r.level, r.number) == (1, 1))
    assert first.task_name == "1_Square_matrix_multiplication_"
    assert "square matrix multiplication" in first.problem.read_text().lower()
    assert len({r.key for r in corpus.records}) == len(corpus.records)


def make_record(level: int, number: int) -> "fid.Record":
    return fid.Record(key=f"l{level}_{number - 1}", level=level, problem_id=number - 1, number=number, model="m",
                      file="", code="", problem=Path("/nonexistent"), task_name="", torch_speedup=None,
                      torch_compile_speedup=None, baseline_torch_time=None, kernel_eval_time=None)


def test_stratified_sample_keeps_level_shares():
    recs = [make_record(lv, i + 1) for lv, n in ((1, 60), (2, 30), (3, 10)) for i in range(n)]
    sample = fid.stratified_sample(recs, 20, seed=3)
    assert [sum(r.level == lv for r in sample) for lv in (1, 2, 3)] == [12, 6, 2]
    assert sample == fid.stratified_sample(recs, 20, seed=3)
    assert sample != fid.stratified_sample(recs, 20, seed=4)
    assert fid.stratified_sample(recs, None, 0) == recs
    assert len(fid.stratified_sample(recs, 7, 0)) == 7


# ------------------------------------------------------------------------------- rules

def verdict_entry(category: str | None, message: str = "", correct: bool = False) -> dict:
    failure = None if category is None else {"category": category, "message": message}
    return {"key": "k", "verdict": {"correct": correct, "failure": failure}, "error": None}


@pytest.mark.parametrize("category,message,cls,rule", [
    ("compile", "error: 'y' was not declared in this scope\n  return y;", "solution_error", "compile-error"),
    ("compile", "compiler/linker flags not allowed: -lcublas_static", "judge_problem", "build-flags"),
    ("compile", 'cuda.cu(59): error: no suitable conversion function from "const at::DeprecatedTypeProperties" '
                'to "c10::ScalarType" exists', "solution_error", "removed-torch-api"),
    ("compile", "CUDA sources cannot be built for the CPU backend", "judge_problem", "wrong-backend"),
    ("compile_timeout", "build exceeded 300 s", "judge_problem", "build-time-limit"),
    ("mismatch", "call 0 (checked): output: 5000 of 65536 values outside atol=0.01, rtol=0.01 (max abs error 0.03; "
                 "first at flat index 3: expected 0.1, got 0.13)", "judge_problem", "near-tolerance"),
    ("mismatch", "call 0 (checked): output: 65536 of 65536 values outside atol=0.01, rtol=0.01 (max abs error 4.2; "
                 "first at flat index 0: expected 1, got 1.5)", "solution_error", "wrong-results"),
    ("mismatch", "call 2 (checked): output: relative L2 error 0.0003 exceeds 0.0001 for float32 (lower precision "
                 "than the task, or outputs too small for atol)", "judge_problem", "near-tolerance"),
    ("mismatch", "call 2 (checked): output: relative L2 error 0.5 exceeds 0.0001 for float32", "solution_error",
     "wrong-results"),
    # The noise-scaled bound: a tanh GELU for the exact one (5000x the reference's own rounding) is an
    # approximation KernelBench accepted; just above a bound that reordering reaches is the judge's doing.
    ("mismatch", "call 0 (checked): output: relative L2 error 0.000198 against the float64 reference exceeds the "
                 "bound 0.0001 = clamp(16 x 3.8e-08, 0.0001, 0.01), 3.8e-08 being the float32 reference's own error",
     "policy_difference", "approximation"),
    ("mismatch", "call 0 (checked): output: relative L2 error 0.00023 against the float64 reference exceeds the "
                 "bound 0.00016 = clamp(16 x 1e-05, 0.0001, 0.01), 1e-05 being the float32 reference's own error",
     "judge_problem", "near-tolerance"),
    ("mismatch", "call 0 (checked): output: relative L2 error 0.000198 against the float64 reference exceeds the "
                 "bound 0.0001 = min(max(0.0001, 16 x 3.8e-08), 0.01 + 3.8e-08), 3.8e-08 being the float32 "
                 "reference's own error", "policy_difference", "approximation"),
    ("mismatch", "call 0 (checked): output: relative L2 error 0.00023 against the float64 reference exceeds the "
                 "bound 0.00016 = min(max(0.0001, 16 x 1e-05), 0.01 + 1e-05), 1e-05 being the float32 reference's "
                 "own error", "judge_problem", "near-tolerance"),
    ("mismatch", "call 0 (checked): output: relative L2 error 0.8 against the float64 reference exceeds the "
                 "bound 0.0001 = clamp(16 x 3.8e-08, 0.0001, 0.01), 3.8e-08 being the float32 reference's own error",
     "solution_error", "wrong-results"),
    ("mismatch", "call 0 (checked): output: shape (2, 3), expected (3, 2)", "solution_error", "wrong-results"),
    ("mismatch", "call 1: forward modified input 0 in place", "policy_difference", "input-mutation"),
    ("policy", "line 12: try/except is not allowed (no fallbacks)", "policy_difference", "policy-refusal"),
    ("policy", "line 50: use of 'input' is not allowed", "judge_problem", "input-as-a-name"),
    ("policy", "fused_ops/cuda.cu:30: threads ('clone(') is not allowed", "judge_problem", "clone-pattern"),
    ("policy", "src:3: threads ('std::thread') is not allowed", "policy_difference", "policy-refusal"),
    ("policy", "line 9: ModelNew must derive from nn.Module, not Model", "hack", "reference-fallback"),
    ("tampering", "the judge's own files changed during the run", "hack", "tampering"),
    ("judge", "Traceback (most recent call last): ...", "judge_problem", "judge-error"),
    ("timeout", "judging did not finish within the pool's time limit of 1260 s; the judge worker was killed",
     "judge_problem", "pool-time-limit"),
    ("timeout", "loading the candidate did not finish within its time limit", "judge_problem", "load-time-limit"),
    ("timeout", "call 4 did not finish within its time limit", "solution_error", "call-timeout"),
    ("timing", "call 3: the outside clock saw 9.1 ms, the candidate claimed 2.0 ms", "judge_problem",
     "timing-disagreement"),
    ("oom", "the candidate process exceeded 16384 MiB of host memory during call 0", "judge_problem", "memory-limit"),
    ("runtime", "call 0: reading back the inputs failed: boom", "judge_problem", "reading-back-inputs"),
    ("runtime", "RuntimeError: CUDA error: an illegal memory access was encountered", "solution_error",
     "raised-or-crashed"),
    ("crash", "the candidate process died during call 0 (killed by SIGSEGV)", "solution_error", "raised-or-crashed"),
    ("init", "TypeError: __init__() takes 1 positional argument but 3 were given", "solution_error",
     "raised-or-crashed"),
    ("load", "the candidate defines no class ModelNew at module level", "solution_error", "raised-or-crashed"),
    ("load", "Traceback (most recent call last):\n ...\nRuntimeError: extra_include_paths is not supported by the "
             "judge", "judge_problem", "unsupported-build-call"),
    ("something_new", "a category no rule knows", "judge_problem", "unclassified"),
])
def test_rules(category, message, cls, rule):
    got_cls, got_rule, reason = fid.classify(verdict_entry(category, message), {"near_factor": 10.0})
    assert (got_cls, got_rule) == (cls, rule)
    assert reason


def test_the_bundled_reviews_are_valid_and_explain_only_refusals():
    # benchmarks/fidelity_reviewed.json is what the device script passes to --explain
    reviews = fid.load_explain(REPO / "benchmarks" / "fidelity_reviewed.json")
    assert reviews and all(r["class"] != "correct" and len(r["reason"]) > 40 for r in reviews.values())
    assert all(re.fullmatch(r"l[123]_p\d+_[\w.-]+", key) for key in reviews)


def test_rules_for_results_without_a_verdict():
    cfg = {"near_factor": 10.0}
    baseline = {"key": "k", "verdict": None, "error": {"kind": "judge_error",
                                                      "message": "task 3_X: eager baseline failed: oom"}}
    assert fid.classify(baseline, cfg)[:2] == ("judge_problem", "baseline-failed")
    pool = {"key": "k", "verdict": None, "error": {"kind": "pool_error", "message": "no judge worker could start"}}
    assert fid.classify(pool, cfg)[:2] == ("judge_problem", "pool-error")
    task = {"key": "k", "verdict": None, "error": {"kind": "task_error", "message": "missing get_inputs"}}
    assert fid.classify(task, cfg)[:2] == ("judge_problem", "reference-unusable")
    assert fid.classify(verdict_entry(None, correct=True), cfg)[0] == "correct"


def test_near_factor_sets_where_a_mismatch_is_a_tolerance_question():
    msg = ("call 0 (checked): output: 10 of 100 values outside atol=0.01, rtol=0.01 (max abs error 0.05; "
           "first at flat index 1: expected 0, got 0.05)")
    assert fid.classify(verdict_entry("mismatch", msg), {"near_factor": 10.0})[0] == "judge_problem"
    assert fid.classify(verdict_entry("mismatch", msg), {"near_factor": 2.0})[0] == "solution_error"


def test_message_line_says_what_happened():
    build_log = ("In file included from main.cpp:1:\nmain.cpp: In function 'at::Tensor f(at::Tensor)':\n"
                 "main.cpp:4:10: error: 'y' was not declared in this scope\n")
    assert fid.first_line(build_log, "compile") == "main.cpp:4:10: error: 'y' was not declared in this scope"
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: \'weight\'\n'
    assert fid.first_line(tb, "judge") == "KeyError: 'weight'"
    assert fid.first_line("\n  call 3: boom\nmore\n", "runtime") == "call 3: boom"
    assert fid.first_line("", "runtime") == ""


def test_prescreen_finds_static_refusals_in_the_judges_words(tmp_path):
    """Without a device: the judge's own static checks over the records, classified by the rules."""
    blank_flags = silu_solution("silu.silu_forward(x)").replace(
        "verbose=False)", 'verbose=False, extra_cflags=[""], extra_cuda_cflags=FLAGS)').replace(
        "silu_source = ", 'FLAGS = ["-O3", "--restrict"]\nsilu_source = ')
    clone = silu_solution("silu.silu_forward(x)").replace("torch::Tensor y = torch::empty_like(x);",
                                                          "torch::Tensor y = x.clone();")
    input_name = TRY_EXCEPT.replace("def forward(self, x):\n        try:\n            return x * torch.sigmoid(x)\n"
                                    "        except RuntimeError:\n            raise",
                                    "def forward(self, input):\n        return input * torch.sigmoid(input)")
    assert "try:" not in input_name
    records = [("flags", 1, 0, blank_flags, 1.0), ("clone", 1, 0, clone, 1.0), ("input", 1, 0, input_name, 1.0),
               ("try", 1, 0, TRY_EXCEPT, 1.0), ("clean", 1, 0, silu_solution("silu.silu_forward(x)"), 1.0),
               ("syntax", 1, 0, "class ModelNew(:\n", 1.0)]
    make_corpus(tmp_path / "c", records)
    proc = run_script("--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "out"), "--prescreen", timeout=300)
    assert proc.returncode == 0, proc.stderr
    pre = json.loads((tmp_path / "out" / "prescreen.json").read_text())
    first = {x["key"]: (x["findings"][0]["class"], x["findings"][0]["rule"]) for x in pre["list"]}
    # Blank and harmless flags, `.clone()` in C++ and a parameter named `input` are published
    # solutions' habits, not refusals; a try/except fallback (lenient policy) and a syntax error are.
    assert first == {"l1_p1_try": ("policy_difference", "policy-refusal"),
                     "l1_p1_syntax": ("solution_error", "raised-or-crashed")}
    assert pre["records"] == 6 and pre["refused"] == 2
    assert "| l1_p1_try | policy_difference | policy-refusal |" in (tmp_path / "out" / "prescreen.md").read_text()


# ------------------------------------------------------------------------------- statistics

def test_spearman_with_ties_and_degenerate_inputs():
    # Hand-computed: ranks x = 1..5, y = (1, 2, 3.5, 5, 3.5): rho = 0.8207826816681233 (scipy agrees).
    assert fid.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233, abs=1e-12)
    assert fid.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert fid.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert fid.spearman([1, 2], [1, 2]) is None
    assert fid.spearman([1, 1, 1], [1, 2, 3]) is None
    assert fid.rankdata([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]
    scipy_stats = pytest.importorskip("scipy.stats")
    x, y = [0.3, 1.2, 1.2, 4.0, 2.2, 0.9, 7.0], [1.0, 0.2, 3.0, 3.0, 2.5, 0.1, 9.0]
    assert fid.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)


# ------------------------------------------------------------------------------- ncu

# Recorded from `ncu --csv --print-units base --metrics gpu__time_duration.sum --profile-from-start off`
# (Nsight Compute 2025.x layout), with the program's and ncu's own lines around the report.
NCU_SAMPLE = '''==PROF== Connected to process 41233 (/usr/bin/python3.12)
Using /root/.cache/torch_extensions/py312_cu128 as PyTorch extensions root...
==PROF== Profiling "layernorm_kernel" - 0: 0%....50%....100% - 1 pass
==PROF== Profiling "layernorm_kernel" - 1: 0%....50%....100% - 1 pass
==PROF== Profiling "add_bias_kernel" - 2: 0%....50%....100% - 1 pass
==PROF== Profiling "layernorm_kernel" - 3: 0%....50%....100% - 1 pass
==PROF== Disconnected from process 41233
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","41233","python3.12","127.0.0.1","layernorm_kernel(const float *, float *, int, int, float)","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","12,352"
"1","41233","python3.12","127.0.0.1","layernorm_kernel(const float *, float *, int, int, float)","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","12,416"
"2","41233","python3.12","127.0.0.1","add_bias_kernel(float *, const float *, int)","1","7","(256, 1, 1)","(512, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.5"
"3","41233","python3.12","127.0.0.1","layernorm_kernel(const float *, float *, int, int, float)","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","980"
'''


def test_parse_ncu_csv():
    kernels = fid.parse_ncu_csv(NCU_SAMPLE)
    assert [k["id"] for k in kernels] == ["0", "1", "2", "3"]
    assert [k["ns"] for k in kernels] == [12352.0, 12416.0, 2500.0, 980.0]
    assert kernels[2]["kernel"].startswith("add_bias_kernel")
    assert fid.parse_ncu_csv("==PROF== nothing profiled\n") == []
    other = NCU_SAMPLE.replace('"gpu__time_duration.sum","usecond"', '"dram__bytes.sum","byte"')
    assert [k["ns"] for k in fid.parse_ncu_csv(other)] == [12352.0, 12416.0, 980.0]


FAKE_NCU = """#!{python}
# Stand-in for ncu: records its command line and writes the recorded report to --log-file.
import json, sys
args = sys.argv[1:]
open({argv_file!r}, "w").write(json.dumps(args))
open(args[args.index("--log-file") + 1], "w").write({report!r})
"""


def test_run_ncu_sums_kernel_time_per_forward(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "argv.json"
    ncu = bin_dir / "ncu"
    ncu.write_text(FAKE_NCU.format(python=sys.executable, argv_file=str(argv_file), report=NCU_SAMPLE))
    ncu.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assets = make_corpus(tmp_path / "corpus")
    record = next(r for r in fid.load_corpus(assets).records if r.key == "l1_p1_model-a")
    entry = {"verdict": {"correct": True, "runtime": {"median_ms": 0.0565}}}
    result = fid.run_ncu(record, entry, tmp_path / "out", forwards=2, timeout_s=60)
    assert result["error"] is None
    assert result["ncu_ms"] == pytest.approx((12352 + 12416 + 2500 + 980) / 2 / 1e6)
    assert result["kernels_per_forward"] == 2
    assert result["ratio"] == pytest.approx(0.0565 / result["ncu_ms"])
    assert result["reading"] == ""  # two kernels of 14 us behind the gate: nothing to explain away
    args = json.loads(argv_file.read_text())
    assert args[:4] == ["--csv", "--print-units", "base", "--metrics"] and "gpu__time_duration.sum" in args
    assert args[args.index("--profile-from-start") + 1] == "off"
    runner = args[args.index("-m"):]
    assert runner[1] == "cuda_agent.fidelity.ncu_runner" and runner[2:4] == [str(record.problem), str(tmp_path / "out" / "ncu" /
                                                                                  record.key / "solution.py")]
    assert (tmp_path / "out" / "ncu" / record.key / "solution.py").read_text() == record.code


def test_ncu_reading_names_what_the_sum_of_kernels_leaves_out():
    """The judge times a forward, Nsight Compute sums its kernels: where those differ by design the
    report says why (the four cases seen on the H200's sample), and says nothing otherwise."""
    assert "events" in fid.ncu_reading(3.88, "events", 1.48, 257)
    assert "judge's own clock" in fid.ncu_reading(1.0, "outside", 0.5, 2)
    assert "209 launches" in fid.ncu_reading(13.97, "gated", 6.72, 209)
    assert "markers" in fid.ncu_reading(0.0040, "gated", 0.0029, 1)
    # a gated forward of two kernels, slower than their sum: left for a reader to explain
    assert fid.ncu_reading(0.786, "gated", 0.37, 2) == ""
    # many launches back to back (no idle gaps worth the name) are not blamed on launching
    assert fid.ncu_reading(1.02, "gated", 1.0, 40) == ""
    assert fid.ncu_reading(None, "gated", 0.37, 2) == "" and fid.ncu_reading(0.5, "gated", None, None) == ""


def test_ncu_runner_builds_modelnew_with_reference_globals(tmp_path):
    """The trusted runner (on the CPU here: no profiler, no L2) loads a solution that, as KernelBench
    allows, uses a name from the reference module (COLS) and runs its forwards."""
    problem = tmp_path / "l1_p1.py"
    problem.write_text(SILU_TASK)
    solution = tmp_path / "solution.py"
    solution.write_text(TRY_EXCEPT.replace("return x * torch.sigmoid(x)",
                                           "return (x * torch.sigmoid(x)).reshape(-1, COLS)"))
    proc = subprocess.run([*RUNNER, str(problem), str(solution),
                           "--forwards", "2", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == {"forwards": 2, "output_shapes": [[128, 512]]}


# ------------------------------------------------------------------------------- arguments

def test_rejudge_takes_matching_verdicts_out_and_keeps_the_rest(tmp_path):
    lines = [json.dumps({"key": k, "verdict": {"correct": True}}) for k in
             ("l3_p15_gpt-o1", "l3_p15_deepseek-coder", "l2_p41_gpt-4o", "l1_p1_model-a")]
    (tmp_path / fid.VERDICTS_FILE).write_text("\n".join(lines) + "\n" + '{"key": "l1_p2_cut-sh')  # a torn last line
    assert fid.forget_results(tmp_path, []) == []
    dropped = fid.forget_results(tmp_path, ["l3_p15_*", "l2_p41_gpt-4o"])
    assert sorted(dropped) == ["l2_p41_gpt-4o", "l3_p15_deepseek-coder", "l3_p15_gpt-o1"]
    assert list(fid.read_results(tmp_path)) == ["l1_p1_model-a"]
    assert fid.forget_results(tmp_path, ["l3_p15_*"]) == []  # nothing left to take out
    fid.append_result(tmp_path, {"key": "l3_p15_gpt-o1", "verdict": {"correct": True}})
    assert sorted(fid.read_results(tmp_path)) == ["l1_p1_model-a", "l3_p15_gpt-o1"]


def test_arguments_are_checked(tmp_path):
    missing = run_script("--corpus", str(tmp_path / "nope"), "--out", str(tmp_path / "out"), timeout=120)
    assert missing.returncode == 2 and "corpus folder not found" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = run_script("--corpus", str(tmp_path / "empty"), "--out", str(tmp_path / "out"), timeout=120)
    assert empty.returncode == 2 and "no raw_data.json" in empty.stderr
    bad = run_script("--corpus", str(tmp_path), "--out", str(tmp_path / "out"), "--sample", "0", timeout=120)
    assert bad.returncode == 2 and "--sample" in bad.stderr
    assert run_script("--out", str(tmp_path / "out"), timeout=120).returncode == 2
    make_corpus(tmp_path / "c")
    (tmp_path / "explain.json").write_text(json.dumps({"l1_p1_model-a": {"class": "great"}}))
    bad_explain = run_script("--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "out"), "--device", "cpu",
                             "--explain", str(tmp_path / "explain.json"), timeout=120)
    assert bad_explain.returncode == 2 and "class must be one of" in bad_explain.stderr
    nothing = run_script("--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "out"), "--device", "cpu",
                         "--report-only", timeout=120)
    assert nothing.returncode == 2 and "nothing judged yet" in nothing.stderr


# ------------------------------------------------------------------------------- end to end, CPU backend

JUDGE_FAST = ["-c", "n_check=2", "-c", "n_warmup=1", "-c", "n_timed=3", "--compile-workers", "0"]


@pytest.mark.slow
def test_end_to_end_on_cpu_classifies_resumes_and_reports(tmp_path, tmp_path_factory):
    make_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    cache = judge_cache_dir(tmp_path_factory)
    common = ["--corpus", str(tmp_path / "corpus"), "--out", str(out), "--device", "cpu",
              "-c", f'cache_dir="{cache}"', *JUDGE_FAST]
    first = run_script(*common)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "judging 7 on cpu (lenient policy)" in first.stderr
    # not on a terminal (a log): one line per judged record instead of a progress bar
    assert len(re.findall(r"^\[\d/7\] l\d_p\d+_model-[a-g]: (correct|rejected \(\w+\)|not judged)", first.stderr,
                          re.M)) == 7, first.stderr[-3000:]

    report = json.loads((out / "fidelity.json").read_text())
    got = {x["key"]: (x["class"], x["rule"]) for x in report["records"]}
    assert got == EXPECTED, json.dumps(report["rejections"], indent=1)
    assert report["overall"]["judged"] == 7 and report["overall"]["correct"] == 3
    assert report["overall"]["share"] == pytest.approx(3 / 7)
    assert report["per_level"]["1"]["correct"] == 2 and report["per_level"]["1"]["judged"] == 6
    assert report["per_level"]["2"] == {"judged": 1, "correct": 1, "share": 1.0, "classes": {
        "correct": 1, "solution_error": 0, "hack": 0, "policy_difference": 0, "judge_problem": 0},
        "share_with_policy": 1.0, "share_no_judge_problem": 1.0}
    # the policy refusal counts as agreement in the second share; the near-tolerance one is the
    # only judge problem
    classes = report["overall"]["classes"]
    assert classes["policy_difference"] == 1 and classes["judge_problem"] == 1, classes
    assert report["overall"]["share_with_policy"] == pytest.approx(4 / 7)
    assert report["overall"]["share_no_judge_problem"] == pytest.approx(6 / 7)
    assert "3 of 7 judged correct (42.9%)" in (out / "fidelity.md").read_text()
    assert report["settings"]["config"]["policy"] == "lenient"
    assert report["settings"]["config"]["compile_mode"] == "none"
    assert {x["rule"]: x["count"] for x in report["rules"]} == {
        "compile-error": 1, "policy-refusal": 1, "wrong-results": 1, "near-tolerance": 1}
    rejected = {x["key"]: x for x in report["rejections"]}
    assert set(rejected) == {k for k, (cls, _) in EXPECTED.items() if cls != "correct"}
    assert rejected["l1_p1_model-b"]["category"] == "compile" and rejected["l1_p1_model-b"]["message"]
    assert "values outside atol" in rejected["l1_p1_model-d"]["message"]
    assert "try/except" in rejected["l1_p1_model-c"]["message"]
    # The judge's speed-ups beside the recorded ones: the three correct records.
    corr = report["correlation"]["overall"]
    assert corr["n"] == 3 and corr["geomean_judge_over_recorded"] > 0
    assert corr["spearman"] is None or -1.0 <= corr["spearman"] <= 1.0
    for x in report["records"]:
        assert (x["judge_speedup"] is not None) == x["correct"]
    md = (out / "fidelity.md").read_text()
    assert "| all | 7 | 3 | 42.9% | 2 | 0 | 1 | 1 |" in md
    assert "| l1_p1_model-e | judge_problem | near-tolerance | mismatch |" in md
    for key in rejected:  # every rejection is listed with its class on the console too
        assert key in first.stdout
    lines = (out / "verdicts.jsonl").read_text().splitlines()
    assert len(lines) == 7

    # Resume: a rerun judges nothing; after losing one record (and a line cut short by a kill),
    # it judges exactly that record and keeps the others' verdicts as they were.
    again = run_script(*common)
    assert again.returncode == 0 and "7 already judged" in again.stderr and "judging 0" in again.stderr
    kept = [line for line in lines if json.loads(line)["key"] != "l2_p5_model-f"]
    (out / "verdicts.jsonl").write_text("\n".join(kept) + '\n{"key": "l2_p5_model-f", "verd')
    resumed = run_script(*common)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "6 already judged" in resumed.stderr and "judging 1 on cpu" in resumed.stderr
    after = fid.read_results(out)
    assert len(after) == 7 and after["l2_p5_model-f"]["verdict"]["correct"]
    before = {json.loads(line)["key"]: json.loads(line)["judged_at"] for line in kept}
    assert all(after[k]["judged_at"] == t for k, t in before.items())

    # A time budget: nothing is submitted once it is spent and what still waits is withdrawn; the
    # records it left are judged by the next run.
    kept = [json.dumps(entry) for key, entry in fid.read_results(out).items()
            if key not in ("l1_p1_model-a", "l2_p5_model-f")]
    (out / "verdicts.jsonl").write_text("\n".join(kept) + "\n")
    budget = run_script(*common, "--time-budget", "0.02")
    assert budget.returncode == 0, budget.stderr[-4000:]
    left = re.search(r"(\d+) records left for a later run", budget.stderr)
    assert len(fid.read_results(out)) + (int(left[1]) if left else 0) == 7
    report = json.loads((out / "fidelity.json").read_text())
    assert report["not_judged_yet"] == (int(left[1]) if left else 0)
    finish = run_script(*common)
    assert finish.returncode == 0, finish.stderr[-4000:]
    assert {k: classify_pair for k, classify_pair in (
        (x["key"], (x["class"], x["rule"])) for x in json.loads((out / "fidelity.json").read_text())["records"])
    } == EXPECTED

    # Other judge settings do not mix into this folder.
    other = run_script(*common[:-len(JUDGE_FAST)], "-c", "n_timed=4", timeout=300)
    assert other.returncode == 2 and "other settings" in other.stderr

    # Reviewed records: --explain overrides the rules in a report that judges nothing.
    explain = tmp_path / "explain.json"
    explain.write_text(json.dumps({"l1_p1_model-e": {"class": "solution_error",
                                                     "reason": "adds 0.03 to every output: a real bug"},
                                   # a stale review of a record now judged correct changes nothing
                                   "l2_p5_model-f": {"class": "solution_error", "reason": "was wrong once"}}))
    reviewed = run_script(*common, "--report-only", "--explain", str(explain), "--sample", "3", "--seed", "1")
    assert reviewed.returncode == 0, reviewed.stderr[-4000:]
    report = json.loads((out / "fidelity.json").read_text())
    assert report["selected"] == 3
    by_key = {x["key"]: x for x in report["records"]}
    assert set(by_key) <= set(EXPECTED) and len(by_key) == 3
    full = run_script(*common, "--report-only", "--explain", str(explain))
    assert full.returncode == 0
    report = json.loads((out / "fidelity.json").read_text())
    e = next(x for x in report["records"] if x["key"] == "l1_p1_model-e")
    assert (e["class"], e["rule_class"], e["reviewed"]) == ("solution_error", "judge_problem", True)
    assert e["reason"] == "adds 0.03 to every output: a real bug"
    assert report["reviewed"] == 1 and report["overall"]["classes"]["judge_problem"] == 0
    f = next(x for x in report["records"] if x["key"] == "l2_p5_model-f")
    assert (f["class"], f["reviewed"]) == ("correct", False)


@pytest.mark.slow
def test_blank_compiler_flags_of_published_solutions(tmp_path, tmp_path_factory):
    """KernelBench's template passes `extra_cflags=[""]`, and so do 226 of the leaderboard's 413
    solutions. The judge must build them: blank compiler flags are no reason to refuse."""
    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.tasks import Task

    code = silu_solution("silu.silu_forward(x)").replace(
        'verbose=False)', 'verbose=False, extra_cflags=[""], extra_ldflags=[""])').replace(
        "fid_silu_cpu", "fid_silu_blank_flags_cpu")
    assert 'extra_cflags=[""]' in code
    cfg = JudgeConfig(device="cpu", policy="lenient", compile_mode="none", n_check=2, n_warmup=1, n_timed=3,
                      cache_dir=judge_cache_dir(tmp_path_factory))
    with Judge(cfg) as judge:
        verdict = judge.evaluate(Task.from_source(SILU_TASK, name="1_SiLU", level=1), Candidate.from_source(code))
    assert verdict.correct, verdict.failure
    entry = {"key": "k", "verdict": verdict.model_dump(mode="json"), "error": None}
    cls, _, _ = fid.classify(entry, {"near_factor": fid.NEAR_FACTOR})
    assert cls == "correct"


# ------------------------------------------------------------------------------- GPU

CUDA_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]


def get_init_inputs():
    return []
'''

CUDA_SOLUTION = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    int n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
cpp_source = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"

add = load_inline(name="fid_add_cuda", cpp_sources=cpp_source, cuda_sources=source, functions=["add_cuda"],
                  verbose=True, extra_cflags=[""], extra_ldflags=[""])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.add = add

    def forward(self, a, b):
        return self.add.add_cuda(a, b)
'''


@pytest.mark.gpu
@pytest.mark.slow
def test_end_to_end_on_cuda_with_ncu(tmp_path, tmp_path_factory):
    """Published-style CUDA solutions judged on the GPU: one with KernelBench's blank compiler flags and
    verbose build, the same kernel without flags, and a wrong one. With ncu on PATH, the correct
    solutions' kernel time per forward sits beside the judge's runtime."""
    assets = tmp_path / "corpus" / "docs" / "assets"
    (assets / "problems").mkdir(parents=True)
    (assets / "problems" / "l1_p1.py").write_text(CUDA_TASK)
    plain = CUDA_SOLUTION.replace(', extra_cflags=[""], extra_ldflags=[""]', "").replace(
        "fid_add_cuda", "fid_add_plain_cuda")
    wrong = plain.replace("a[i] + b[i]", "a[i] - b[i]").replace("fid_add_plain_cuda", "fid_add_wrong_cuda")
    (assets / "raw_data.json").write_text(json.dumps([
        {"problem_id": 0, "code": code, "torch_speedup": speedup, "torch_compile_speedup": 1.0, "level": 1,
         "model": name, "display_name": name, "file": name * 4}
        for name, code, speedup in (("published", CUDA_SOLUTION, 1.0), ("plain", plain, 1.1),
                                    ("wrong", wrong, 0.9))]))
    out = tmp_path / "out"
    cache = judge_cache_dir(tmp_path_factory)
    proc = run_script("--corpus", str(tmp_path / "corpus"), "--out", str(out), "-c", f'cache_dir="{cache}"',
                      "--ncu-sample", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((out / "fidelity.json").read_text())
    got = {x["key"]: (x["class"], x["rule"]) for x in report["records"]}
    assert got["l1_p1_plain"] == ("correct", "correct")
    assert got["l1_p1_wrong"] == ("solution_error", "wrong-results")
    if shutil.which("ncu"):
        assert report["ncu"], report["ncu_note"]
        for entry in report["ncu"]:
            if entry["error"] and "ERR_NVGPUCTRPERM" in entry["error"]:
                pytest.skip("ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM)")
            assert entry["error"] is None, entry
            assert entry["kernels_per_forward"] == pytest.approx(1.0)
            assert entry["ncu_ms"] > 0 and 0.3 < entry["ratio"] < 20
    else:
        assert "not on PATH" in report["ncu_note"]
    # Last, so that the rest is checked either way: blank flags are no reason to refuse a solution.
    assert got["l1_p1_published"] == ("correct", "correct"), got["l1_p1_published"]


def test_judging_order_mixes_the_levels_in_proportion():
    # A run cut by its time budget must have judged every level, in proportion, not level 1 alone.
    recs = [make_record(level, n) for level, count in ((1, 6), (2, 3), (3, 1)) for n in range(1, count + 1)]
    order = fid.interleaved(recs)
    assert sorted(r.key for r in order) == sorted(r.key for r in recs)
    assert {r.level for r in order[:4]} == {1, 2, 3}
    for level in (1, 2, 3):  # each level keeps its own order
        assert [r.number for r in order if r.level == level] == sorted(r.number for r in order if r.level == level)


def test_marker_summary_counts_calls_past_their_end_marker_and_stretched_runtimes():
    def call(inside, stream, waited=0.0, role="timed"):
        return {"role": role, "inside_ms": inside, "stream_ms": stream, "run_delay_ms": waited}

    # a first round of 4 timed calls, then the reported second round of 4: 3 of them read past the
    # end marker (2 with the thread waiting for a core), so the median runtime is 1.5x the markers'
    stretched = {"correct": True, "notes": ["... so the second round had the judge open each call's gate"],
                 "runtime": {"median_ms": 0.03, "n": 4, "source": "gated"},
                 "calls": [call(0.02, 0.02, role="check")] + [call(0.02, 0.02)] * 4
                 + [call(0.02, 0.02), call(0.03, 0.02, 0.01), call(0.03, 0.02, 0.02), call(0.04, 0.02)]}
    clean = {"correct": True, "runtime": {"median_ms": 1.0, "n": 2, "source": "gated"},
             "calls": [call(1.0, 1.0), call(1.0, 1.0)]}
    events = {"correct": True, "runtime": {"median_ms": 5.0, "n": 1, "source": "events"},
              "calls": [call(5.0, None)]}
    wrong = {"correct": False, "runtime": None, "calls": [call(9.0, 1.0)]}
    m = fid.marker_summary({"a": stretched, "b": clean, "c": events, "d": wrong})
    assert (m["gated_timed_calls"], m["past_end_marker"], m["past_end_marker_waited"]) == (6, 3, 2)
    assert m["stretched"] == [{"key": "a", "ratio": pytest.approx(1.5), "second_round": True}]
    assert "3 of 6 gated timed calls" in fid.marker_sentence(m)


def test_compare_runs_names_other_verdicts_and_runtimes_apart():
    def entry(correct, ms, source="gated"):
        return {"verdict": {"correct": correct, "runtime": {"median_ms": ms, "source": source} if ms else None}}

    mine = {"a": entry(True, 1.002), "b": entry(True, 0.065), "c": entry(False, None), "d": entry(True, 2.0)}
    other = {"a": entry(True, 1.0), "b": entry(True, 0.049, "events"), "c": entry(True, 3.0), "e": entry(True, 1.0)}
    c = fid.compare_runs(mine, other)
    assert (c["both"], c["verdicts_differ"], c["timed_both"], c["within_close"]) == (3, ["c"], 2, 1)
    assert [(x["key"], x["source"], x["other_source"]) for x in c["apart"]] == [("b", "gated", "events")]
    assert c["apart"][0]["ratio"] == pytest.approx(0.065 / 0.049)
    assert "3 records judged in both runs, 1 with another verdict" in fid.compare_sentence(c)


@pytest.mark.slow
def test_ncu_sample_builds_ahead_in_folders_of_its_own_and_the_run_loads_those_builds(tmp_path):
    """The sampled solutions are compiled before any profiled run, several at once, each into its
    own extensions folder (two published solutions may name their extension alike); the runner then
    finds its build there and compiles nothing. On the CPU here (C++ load_inline, no profiler)."""
    assets = make_corpus(tmp_path / "corpus")
    records = {r.key: r for r in fid.load_corpus(assets).records}
    good, broken = records["l1_p1_model-a"], next(r for r in records.values() if "fid_broken_cpu" in r.code)
    out = tmp_path / "out"
    failed = fid.prebuild_ncu([good, broken], out, parallel=2, timeout_s=600, device="cpu")
    assert list(failed) == [broken.key] and "build exit" in failed[broken.key]
    built = list((out / "ncu" / good.key / "torch_extensions").rglob("*.so"))
    assert len(built) == 1, built
    stamp = built[0].stat().st_mtime_ns
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(out / "ncu" / good.key / "torch_extensions"))
    proc = subprocess.run([*RUNNER, str(good.problem),
                           str(out / "ncu" / good.key / "solution.py"), "--forwards", "1", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not built again
