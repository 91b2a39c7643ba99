"""The size budget of the library: no function over 150 lines, no file over 800 (the bundled suite
aside). Today's exceptions are listed with their size; the list may only shrink: an exception that
grew fails, and so does one that now fits (delete its line), so that the budget ratchets down."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "cuda_agent"
MAX_FUNCTION_LINES = 150
MAX_FILE_LINES = 800

# path relative to src/cuda_agent -> lines today (may go down, never up)
FILE_EXCEPTIONS: dict[str, int] = {
}
# "path:qualified.name" -> lines today
FUNCTION_EXCEPTIONS: dict[str, int] = {
    "judge/compare.py:compare_outputs": 167,
    "synth/pipeline.py:run_synth": 173,
}


def _library_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "suite" not in p.relative_to(ROOT).parts)


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node.end_lineno - node.lineno + 1
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    files, functions = {}, {}
    for path in _library_files():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        files[rel] = len(text.splitlines())
        for name, lines in _functions(ast.parse(text)):
            functions[f"{rel}:{name}"] = lines
    return files, functions


def test_no_file_or_function_outgrows_the_budget():
    files, functions = _sizes()
    over = [f"{rel}: {n} lines (budget {MAX_FILE_LINES}, exception {FILE_EXCEPTIONS.get(rel)})"
            for rel, n in files.items() if n > max(MAX_FILE_LINES, FILE_EXCEPTIONS.get(rel, 0))]
    over += [f"{key}: {n} lines (budget {MAX_FUNCTION_LINES}, exception {FUNCTION_EXCEPTIONS.get(key)})"
             for key, n in functions.items() if n > max(MAX_FUNCTION_LINES, FUNCTION_EXCEPTIONS.get(key, 0))]
    assert not over, "over the size budget (split it; exceptions may only shrink):\n" + "\n".join(over)


@pytest.mark.parametrize("table", ["files", "functions"])
def test_the_exception_list_only_shrinks(table):
    files, functions = _sizes()
    sizes, exceptions, budget = ((files, FILE_EXCEPTIONS, MAX_FILE_LINES) if table == "files"
                                 else (functions, FUNCTION_EXCEPTIONS, MAX_FUNCTION_LINES))
    stale = [f"{key}: now {sizes.get(key, 0)} lines" for key in exceptions if sizes.get(key, 0) <= budget]
    assert not stale, "these fit the budget now: delete their exception lines\n" + "\n".join(stale)
    slack = [f"{key}: listed at {limit}, now {sizes[key]}" for key, limit in exceptions.items()
             if key in sizes and sizes[key] < limit]
    assert not slack, "lower these exceptions to their size today\n" + "\n".join(slack)
