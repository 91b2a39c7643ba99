"""`cuda-agent doctor`: each check says ok, warn or fail with a reason, and the command's exit code
follows the worst of them."""

from __future__ import annotations

import os
import stat

from typer.testing import CliRunner

from cuda_agent import doctor
from cuda_agent.cli import app


def _broken_compiler(tmp_path, monkeypatch):
    for name in ("g++", "c++"):
        shim = tmp_path / name
        shim.write_text("#!/bin/sh\necho 'g++ (stand-in) 1.0'\necho 'broken' >&2\nexit 1\n")
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_a_compiler_that_cannot_build_openmp_fails_the_doctor(tmp_path, monkeypatch):
    _broken_compiler(tmp_path, monkeypatch)
    check = doctor.check_compiler()
    assert check.status == "fail" and "OpenMP program does not build" in check.detail
    assert doctor.exit_code([check]) == 3


def test_a_missing_tool_is_a_warning_that_names_what_it_costs(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    check = doctor.check_tool("compute-sanitizer", "-c memcheck=true")()
    assert check.status == "warn" and "memcheck" in check.detail
    assert doctor.exit_code([check]) == 0


def test_a_check_that_breaks_is_reported_not_raised(monkeypatch):
    def broken():
        raise OSError("probe exploded")

    monkeypatch.setattr(doctor, "CHECKS", (doctor.check_python, broken))
    checks = doctor.run_checks()
    assert [c.status for c in checks] == ["ok", "fail"] and "probe exploded" in checks[1].detail


def test_the_command_prints_one_line_per_check_and_exits_3_on_a_failure(tmp_path, monkeypatch):
    _broken_compiler(tmp_path, monkeypatch)
    monkeypatch.setattr(doctor, "CHECKS", (doctor.check_python, doctor.check_compiler))
    result = CliRunner().invoke(app, ["doctor"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 3 and len(lines) == 2
    assert lines[0].startswith("ok") and lines[1].startswith("fail  c++ compiler")
