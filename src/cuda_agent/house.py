"""`cuda-agent suite` and `cuda-agent cache`: where the bundled tasks are, and what the judge keeps.

The judge keeps five things in its cache folder (`$CUDA_AGENT_CACHE`), each safe to delete (it is
rebuilt on demand, at the cost of the time it saved):

    ext/             built candidate libraries, keyed by their sources, flags and toolchain
    baselines/       eager and torch.compile times of tasks, keyed by task, settings and machine
    verdicts/        finished verdicts, keyed by task, candidate and judge settings
    results.sqlite   the results database of `bench` runs (`cuda-agent runs`, `report`)
    pch/             precompiled headers of the fixed binding and the load_inline prelude (read,
                     not written, by the sandboxed builds)

`results.sqlite` is the record of past runs, not a cache: `--clear all` leaves it, and only
`--clear results` removes it. Earlier versions kept the precompiled headers in the judge's working
folder (`$CUDA_AGENT_WORK/pch`); where that folder is still there it is listed as `old-pch`, which
nothing reads any more, so that it can be cleared too.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CachePart:
    name: str
    path: Path
    what: str

    def size_bytes(self) -> int:
        if self.path.is_file():
            return self.path.stat().st_size
        if not self.path.is_dir():
            return 0
        total = 0
        for p in self.path.rglob("*"):
            try:
                if p.is_file() and not p.is_symlink():
                    total += p.stat().st_size
            except OSError:  # removed meanwhile by a judge that evicts old entries
                pass
        return total

    def clear(self) -> None:
        if self.path.is_dir():
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            self.path.unlink(missing_ok=True)


CLEARED_BY_ALL = ("ext", "baselines", "verdicts", "pch", "old-pch")


def cache_parts(cache_dir: Path | None = None, work_root: Path | None = None) -> list[CachePart]:
    """The judge's cache parts (default folders: `$CUDA_AGENT_CACHE`, and `$CUDA_AGENT_WORK` for
    headers an earlier version left there)."""
    from cuda_agent.db import default_db_path
    from cuda_agent.judge.config import default_cache_dir, default_work_root

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    parts = [CachePart("ext", cache / "ext", "built candidate libraries"),
             CachePart("baselines", cache / "baselines", "eager and torch.compile times of tasks"),
             CachePart("verdicts", cache / "verdicts", "finished verdicts"),
             CachePart("pch", cache / "pch", "precompiled headers"),
             CachePart("results", default_db_path(cache), "the results database of bench runs")]
    old = Path(work_root if work_root is not None else default_work_root()) / "pch"
    if old.is_dir():
        parts.append(CachePart("old-pch", old, "precompiled headers of an earlier version, no longer read"))
    return parts


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def suite_rows(device: str) -> list[tuple[str, int | None, Path, Path | None]]:
    """(task name, level, task file, solution path or None) for every bundled task of `device`."""
    from cuda_agent.suite import suite_solutions, suite_tasks

    solutions = suite_solutions(device)
    return [(t.name, t.level, Path(t.origin), solutions.get(t.name)) for t in suite_tasks(device)]
