"""The tier lists in conftest.py name tests that exist: a renamed slow test must not drop into the
fast tier unnoticed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import SLOW_MODULES, SLOW_TESTS

TESTS = Path(__file__).parent


def _test_functions(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def test_every_listed_slow_module_and_test_exists():
    for name in SLOW_MODULES | set(SLOW_TESTS):
        assert (TESTS / name).is_file(), f"tests/conftest.py lists {name}, which does not exist"
    for name, tests in SLOW_TESTS.items():
        missing = tests - _test_functions(TESTS / name)
        assert not missing, f"tests/conftest.py lists {sorted(missing)} in {name}, which has no such tests"


def test_the_fast_tier_compiles_nothing(request):
    """Under `-m "not slow"` the compilers on PATH are the failing stand-ins."""
    import shutil
    import subprocess

    if (request.config.getoption("markexpr", "") or "").replace(" ", "") != "notslow":
        pytest.skip('the stand-ins are installed only for -m "not slow"')
    for tool in ("c++", "ninja", "nvcc"):
        path = shutil.which(tool)
        assert path and "fast-tier-toolchain" in path, (tool, path)
        res = subprocess.run([path, "--version"], capture_output=True, text=True)
        assert res.returncode == 97 and "slow tier" in res.stdout
