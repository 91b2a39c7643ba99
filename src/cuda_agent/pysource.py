"""Parsing Python source from many threads at once.

CPython 3.11 before 3.11.8 keeps the AST constructor's recursion count in global state, and a
garbage collection that releases the GIL inside it lets another thread's parse interleave: the
parse then fails with `SystemError: AST constructor recursion depth mismatch` (python/cpython
gh-106905). The service and the pool parse tasks and candidates in many threads, so every parse of
this package goes through one lock; a parse takes microseconds to milliseconds.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
