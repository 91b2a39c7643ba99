"""The judge's trust boundary, read from the code: no module of the judge's side (nor anything
else in the package) imports a module of the candidate's side, where everything is assumed
compromised once candidate code runs. Imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "cuda_agent"
# the candidate's side: processes that run candidate code (or fork the processes that do)
CANDIDATE_SIDE = {"cuda_agent.judge.worker", "cuda_agent.judge.guards", "cuda_agent.judge.zygote",
                  "cuda_agent.judge.memcheck_run"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module that `module` (its `source`) imports, absolute (relative imports resolved,
    `from X import y` also counted as X.y, which may be a module)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def test_nothing_trusted_imports_the_candidate_side():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        mod = _module(path)
        if mod in CANDIDATE_SIDE:
            continue
        bad = sorted(_imports(path.read_text(), mod, path.name == "__init__.py") & CANDIDATE_SIDE)
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {', '.join(bad)}")
    assert not offenders, offenders


def test_the_reader_sees_relative_and_in_function_imports():
    """The check above can fail: imports a judge-side module could hide are all read."""
    source = ("import cuda_agent.judge.zygote\n"
              "def f():\n    from . import worker\n    from .guards import x\n"
              "    from ..judge.memcheck_run import main\n")
    found = _imports(source, "cuda_agent.judge.calls") & CANDIDATE_SIDE
    assert found == CANDIDATE_SIDE
    assert _imports("from .worker import y\n", "cuda_agent.judge.builds", is_package=True) \
        == {"cuda_agent.judge.builds.worker", "cuda_agent.judge.builds.worker.y"}
