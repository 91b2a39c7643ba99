"""`cuda-agent train`: usage errors exit 2 with a message that says what is wrong; the data and
config commands write what they say."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cuda_agent.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["train", *args])


def test_help_names_the_four_stages():
    res = run("--help")
    assert res.exit_code == 0
    for name in ("warmup", "rft", "critic", "ppo", "prepare", "verl-config", "toy"):
        assert name in res.output


def test_a_wrong_setting_is_a_usage_error_that_lists_the_fields(tmp_path):
    pytest.importorskip("transformers")
    res = run("ppo", "--out", str(tmp_path / "o"), "-c", "stepz=3")
    assert res.exit_code == 2 and "stepz" in res.output and "steps" in res.output
    res = run("warmup", "--out", str(tmp_path / "o"), "-c", "ppo.lam=2")
    assert res.exit_code == 2 and "lam" in res.output
    res = run("warmup", "--out", str(tmp_path / "o"), "-c", "judge.n_timd=2")
    assert res.exit_code == 2 and "n_timd" in res.output


def test_rft_without_episodes_is_a_usage_error(tmp_path):
    pytest.importorskip("transformers")
    res = run("rft", "--out", str(tmp_path / "rft"), "--episodes", str(tmp_path / "none"))
    assert res.exit_code == 2 and "no such episode file" in " ".join(res.output.split())


def test_prepare_and_verl_config(tmp_path):
    res = run("prepare", "--out", str(tmp_path / "data"), "--tasks", "suite:cpu", "--device", "cpu")
    assert res.exit_code == 0 and (tmp_path / "data" / "train.parquet").exists()
    assert run("prepare", "--out", str(tmp_path / "d2"), "--mode", "bogus").exit_code == 2
    assert run("prepare", "--out", str(tmp_path / "d3"), "--tasks", str(tmp_path / "missing.py")).exit_code == 2
    res = run("verl-config", "--out", str(tmp_path / "launch"))
    assert res.exit_code == 2 and "base_model" in res.output and "out" in res.output
    res = run("verl-config", "--out", str(tmp_path / "launch"), "--preset", "one-node", "-c", "base_model=/m",
              "-c", f"out={tmp_path / 'run'}", "-c", f"data={tmp_path / 'data'}")
    assert res.exit_code == 0 and (tmp_path / "launch" / "ppo.sh").exists()
    assert (tmp_path / "launch" / "README.txt").exists()
