"""Parsing Python from many threads (cuda_agent.pysource): CPython 3.11 before 3.11.8 fails a parse
with `SystemError: AST constructor recursion depth mismatch` when a garbage collection that
releases the GIL lets another thread's parse interleave (gh-106905); the service met it with 32
client threads submitting tasks."""

from __future__ import annotations

import gc
import threading
import time

from cuda_agent import pysource

SOURCE = "\n".join(f"def f{i}(x):\n    return [y * {i} for y in range(x) if y % 3]\n" for i in range(30))


class _ReleasesTheGilWhenCollected:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it

    def __del__(self):
        time.sleep(0)


def _errors(parse, seconds: float) -> list[str]:
    errors: list[str] = []
    stop = time.monotonic() + seconds

    def work() -> None:
        while time.monotonic() < stop and not errors:
            _ReleasesTheGilWhenCollected()
            try:
                parse(SOURCE)
            except SystemError as exc:
                errors.append(str(exc))

    old = gc.get_threshold()
    gc.set_threshold(10, 1, 1)  # collections inside the parses, often
    try:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*old)
    return errors


def test_parses_from_many_threads_with_collections_releasing_the_gil_never_fail():
    assert _errors(pysource.parse, 3.0) == []
    # and the result is the parse's
    assert [n.name for n in pysource.parse(SOURCE).body][:2] == ["f0", "f1"]
    assert pysource.parse("x + 1", mode="eval").body.op.__class__.__name__ == "Add"
