"""The bundled task suite: original KernelBench-format references and hand-written solutions.

Layout (all data, no Python packages below this folder):

* ``cuda/level1`` .. ``cuda/level3``: references sized for a data-centre GPU (eager runtime of a few
  milliseconds on an H200; each file states its estimate);
* ``cpu``: small-shape variants of some of those tasks, same file names, for the CPU backend; the
  level is read from a ``# level: N`` comment at the top of each file;
* ``solutions/cuda`` and ``solutions/cpu``: one solution per task name, either a single
  ``<name>.py`` (a ``ModelNew`` module that builds its extension with ``load_inline``) or a
  ``<name>/`` workspace (``model_new.py`` + ``kernels/``).

The task name is the file stem, so a solution pairs with its task by name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the loaders import pydantic; keep `suite_dir` usable without it
    from cuda_agent.tasks import Task

DEVICES = ("cuda", "cpu")
_LEVEL_COMMENT = re.compile(r"^#\s*level:\s*(\d+)\s*$", re.MULTILINE)


def suite_dir() -> Path:
    """The folder holding the suite's tasks and solutions."""
    return Path(__file__).resolve().parent


def _check_device(device: str) -> str:
    if device not in DEVICES:
        raise ValueError(f"unknown suite device {device!r}; expected one of {', '.join(DEVICES)}")
    return device


def _sort_key(name: str) -> tuple[int, str]:
    head = name.split("_", 1)[0]
    return (int(head), name) if head.isdigit() else (1 << 30, name)


def _cpu_level(source: str) -> int | None:
    head = "\n".join(source.splitlines()[:5])
    match = _LEVEL_COMMENT.search(head)
    return int(match.group(1)) if match else None


def suite_tasks(device: str = "cuda") -> list["Task"]:
    """The suite's tasks for `device`, sorted by (level, number, name).

    ``cuda``: every ``cuda/level*/*.py``, group ``suite``, level from the folder.
    ``cpu``: every ``cpu/*.py``, group ``suite-cpu``, level from the file's ``# level: N`` comment.
    """
    from cuda_agent.tasks import TaskError, load_kernelbench_dir, load_task_file

    root = suite_dir()
    if _check_device(device) == "cuda":
        tasks = [t.model_copy(update={"group": "suite"}) for t in load_kernelbench_dir(root / "cuda")]
    else:
        tasks = []
        for path in sorted((root / "cpu").glob("*.py")):
            if path.name.startswith("_"):
                continue
            task = load_task_file(path, group="suite-cpu")
            level = _cpu_level(task.source)
            if level is None:
                raise TaskError(f"{path}: a CPU suite task needs a '# level: N' comment at the top")
            tasks.append(task.model_copy(update={"level": level}))
    tasks.sort(key=lambda t: (t.level or 0, _sort_key(t.name)))
    return tasks


def suite_solutions(device: str = "cuda") -> dict[str, Path]:
    """Task name -> solution path (a ``.py`` file or a workspace folder with ``model_new.py``)."""
    folder = suite_dir() / "solutions" / _check_device(device)
    found: dict[str, Path] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        if path.name.startswith(("_", ".")):
            continue
        if path.is_file() and path.suffix == ".py":
            found[path.stem] = path
        elif path.is_dir() and (path / "model_new.py").is_file():
            found[path.name] = path
    return found


__all__ = ["DEVICES", "suite_dir", "suite_solutions", "suite_tasks"]
