"""Tasks: frozen, content-hashed records of a PyTorch reference in KernelBench format.

A task is data: the reference source (a module defining `Model`, `get_inputs` and
`get_init_inputs`) plus metadata. Its identity is a hash of that source, so two loaders
that read the same code agree on the id. Behaviour (running it) lives in the judge.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent import pysource


class TaskError(ValueError):
    """A task that cannot be used; the message names the file (or row) and the reason."""


class Task(BaseModel):
    """One reference problem. Frozen; `id` is the SHA-256 prefix of the source."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    source: str
    group: str = ""          # e.g. "level1", "ops6k", "suite"
    level: int | None = None
    ops: tuple[str, ...] = ()
    data_source: str = ""
    origin: str = ""         # file path or "file.parquet#row"
    metadata: dict[str, str] = Field(default_factory=dict)

    @staticmethod
    def source_hash(source: str) -> str:
        return hashlib.sha256(source.encode()).hexdigest()[:16]

    @classmethod
    def from_source(cls, source: str, *, name: str, origin: str = "", **fields) -> "Task":
        validate_reference_source(source, origin or name)
        return cls(id=cls.source_hash(source), name=name, source=source, origin=origin, **fields)


REQUIRED = ("Model", "get_inputs", "get_init_inputs")


def validate_reference_source(source: str, where: str) -> None:
    """Check statically that `source` is a KernelBench-format reference; raise TaskError."""
    try:
        tree = pysource.parse(source, filename=where)
    except SyntaxError as exc:
        raise TaskError(f"{where}: syntax error at line {exc.lineno}: {exc.msg}") from None
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    missing = [name for name in REQUIRED if name not in defined]
    if missing:
        raise TaskError(f"{where}: not a KernelBench-format task: missing {', '.join(missing)} "
                        "(a task defines class Model, get_inputs() and get_init_inputs())")


def _level_of(path: Path) -> int | None:
    for part in reversed(path.parts[:-1]):
        if part.startswith("level") and part[5:].isdigit():
            return int(part[5:])
    return None


_UNSET = object()


def load_task_file(path: str | Path, *, group: str = "", name: str | None = None,
                   level: int | None = _UNSET) -> Task:  # type: ignore[assignment]
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TaskError(f"{path}: cannot read: not UTF-8 text") from None
    if level is _UNSET:
        level = _level_of(path)
    return Task.from_source(
        source,
        name=name or path.stem,
        origin=str(path),
        group=group or (f"level{level}" if level is not None else path.parent.name),
        level=level,
    )


def load_kernelbench_dir(root: str | Path, levels: Iterable[int] | None = None) -> list[Task]:
    """Every `*.py` under `root`; `levelN/` folders set the level. Sorted by (level, name).

    KernelBench names files `<number>_<Name>.py`; the task name is the file stem.
    """
    root = Path(root)
    if not root.is_dir():
        raise TaskError(f"{root}: not a directory")
    wanted = set(levels) if levels is not None else None
    tasks = []
    for path in sorted(root.rglob("*.py")):
        if path.name.startswith("_"):
            continue
        level = _level_of(path.relative_to(root.parent))
        if wanted is not None and level not in wanted:
            continue
        tasks.append(load_task_file(path, level=level))
    tasks.sort(key=lambda t: (t.level or 0, _natural_key(t.name)))
    return tasks


def _natural_key(name: str) -> tuple:
    head = name.split("_", 1)[0]
    return (int(head), name) if head.isdigit() else (1 << 30, name)


def _row_to_task(row: dict, where: str, index: int, group: str) -> Task:
    code = row.get("code")
    if not isinstance(code, str) or not code.strip():
        raise TaskError(f"{where}: row {index}: no 'code' column (Ops-6K rows have ops, data_source, code)")
    ops = row.get("ops") or []
    if isinstance(ops, str):
        try:
            ops = json.loads(ops)
        except json.JSONDecodeError:
            ops = [o.strip() for o in ops.strip("[]").split(",") if o.strip()]
    if not isinstance(ops, (list, tuple)):
        ops = [ops]
    data_source = str(row.get("data_source") or "")
    name = str(row.get("name") or (data_source.replace("#", "_") if data_source else f"row{index}"))
    return Task.from_source(
        code, name=name, origin=f"{where}#{index}", group=group, ops=tuple(str(o) for o in ops),
        data_source=data_source,
        metadata={k: str(v) for k, v in row.items() if k not in {"code", "ops", "data_source", "name"}},
    )


def iter_jsonl_tasks(path: str | Path, group: str = "ops6k") -> Iterator[Task]:
    path = Path(path)
    with path.open("rb") as fh:
        for index, raw in enumerate(fh):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise TaskError(f"{path}: line {index + 1}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskError(f"{path}: line {index + 1}: invalid JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise TaskError(f"{path}: line {index + 1}: expected a JSON object, "
                                f"got {type(row).__name__}")
            yield _row_to_task(row, str(path), index, group)


def iter_parquet_tasks(path: str | Path, group: str = "ops6k") -> Iterator[Task]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise TaskError(f"{path}: cannot read Parquet: {exc}") from None
    for index, row in enumerate(table.to_pylist()):
        yield _row_to_task(row, str(path), index, group)


def load_tasks(spec: str | Path, levels: Iterable[int] | None = None) -> list[Task]:
    """Load from a `.py` file, a KernelBench-style directory, a `.jsonl` or a `.parquet` file,
    or `suite` / `suite:cpu` for the bundled suite."""
    text = str(spec)
    if text in ("suite", "suite:cuda", "suite:cpu"):
        from cuda_agent.suite import suite_tasks

        return suite_tasks("cpu" if text.endswith("cpu") else "cuda")
    path = Path(spec)
    if path.is_dir():
        return load_kernelbench_dir(path, levels)
    if not path.exists():
        raise TaskError(f"{path}: no such file or directory")
    if path.suffix == ".py":
        return [load_task_file(path)]
    if path.suffix == ".jsonl":
        return list(iter_jsonl_tasks(path))
    if path.suffix == ".parquet":
        return list(iter_parquet_tasks(path))
    raise TaskError(f"{path}: unknown task format (expected .py, a directory, .jsonl or .parquet)")
