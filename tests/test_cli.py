"""The CLI contract: `cuda-agent eval --json` and its exit codes, on the real judge (CPU backend)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0

def get_inputs():
    return [torch.randn(1 << 14)]

def get_init_inputs():
    return []
'''

SOLUTION = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
#include <torch/extension.h>
torch::Tensor relu2(torch::Tensor x) {
  auto y = torch::empty_like(x);
  const float* a = x.data_ptr<float>();
  float* b = y.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) b[i] = a[i] > 0 ? 2.0f * a[i] : 0.0f;
  return y;
}
"""
ext = load_inline(name="cli_relu2", cpp_sources=src, functions=["relu2"], extra_cflags=["-O2"])

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu2(x)
'''

KEYS = {"compiled", "correct", "policy_violations", "failure", "runtime_ms", "eager_ms", "compile_ms",
        "speedup_vs_eager", "speedup_vs_compile", "reward"}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    cache = tmp_path_factory.mktemp("cli-cache")
    return {**os.environ, "CUDA_AGENT_CACHE": str(cache)}


def run_cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuda_agent.cli", *args], capture_output=True, text=True,
                          env=env, timeout=900)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    task, sol = tmp_path / "task.py", tmp_path / "sol.py"
    task.write_text(TASK)
    sol.write_text(SOLUTION)
    return task, sol


def test_eval_json_contract_for_an_honest_candidate(files, env):
    task, sol = files
    res = run_cli(["eval", "--task", str(task), "--solution", str(sol), "--json", "--device", "cpu",
                   "--compile-mode", "none", "-c", "n_timed=5"], env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert KEYS <= set(out)
    assert out["compiled"] and out["correct"] and out["failure"] is None and out["reward"] >= 1
    assert out["runtime_ms"] > 0 and out["eager_ms"] > 0 and out["speedup_vs_eager"] > 0


def test_eval_exits_zero_with_a_failing_verdict(files, env, tmp_path):
    task, _ = files
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n"
                   "    def forward(self, x):\n        return torch.relu(x) * 2.0\n")
    res = run_cli(["eval", "--task", str(task), "--solution", str(bad), "--json", "--device", "cpu",
                   "--compile-mode", "none"], env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["reward"] == -1 and out["policy_violations"] and out["failure"]["category"] == "policy"


def test_eval_usage_and_judge_errors_have_distinct_exit_codes(files, env, tmp_path):
    task, sol = files
    assert run_cli(["eval", "--task", str(task)], env).returncode == 2                    # missing option
    assert run_cli(["eval", "--task", str(task), "--solution", str(tmp_path / "nope.py")], env).returncode == 2
    broken = tmp_path / "broken_task.py"
    broken.write_text("def get_inputs():\n    return []\n")
    res = run_cli(["eval", "--task", str(broken), "--solution", str(sol), "--device", "cpu"], env)
    assert res.returncode == 3 and "broken_task.py" in res.stderr and "Model" in res.stderr
    res = run_cli(["eval", "--task", str(task), "--solution", str(sol), "-c", "atol=-"], env)
    assert res.returncode == 2


def test_help_explains_commands(env):
    res = run_cli(["--help"], env)
    assert res.returncode == 0 and "eval" in res.stdout and "bench" in res.stdout
    res = run_cli(["eval", "--help"], env)
    assert "--solution" in res.stdout and "--json" in res.stdout


def test_build_ahead_fills_the_judges_cache(files, tmp_path):
    """`cuda-agent build` compiles into the cache the judge reads: the later eval is a cache hit."""
    task, sol = files
    env = {**os.environ, "CUDA_AGENT_CACHE": str(tmp_path / "cache")}
    res = run_cli(["build", str(sol), "--device", "cpu"], env)
    assert res.returncode == 0, res.stderr
    assert "1 built" in res.stderr and "0 failed" in res.stderr
    res = run_cli(["eval", "--task", str(task), "--solution", str(sol), "--json", "--device", "cpu",
                   "--compile-mode", "none", "-c", "n_timed=5"], env)
    out = json.loads(res.stdout)
    assert out["correct"] and out["build_cached"] is True
    res = run_cli(["build", str(sol), "--device", "cpu"], env)
    assert "0 built, 1 already cached" in res.stderr
    assert run_cli(["build", str(tmp_path / "nope.py"), "--device", "cpu"], env).returncode == 2
