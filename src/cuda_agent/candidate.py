"""Candidates: what a solver hands to the judge, in one of two forms.

* ``file``: one KernelBench-style Python module defining ``ModelNew`` that builds its own
  extension with ``torch.utils.cpp_extension.load_inline`` (how most published kernels are shared).
* ``workspace``: a CUDA Agent workspace: ``model_new.py`` importing ``cuda_extension``, plus
  ``kernels/<name>.cu`` (or ``.cpp`` for the CPU backend) and ``kernels/<name>_binding.cpp``.
  The fixed ``binding.cpp`` and ``binding_registry.h`` always come from this package; copies in
  the workspace are ignored so a candidate cannot change them.

A candidate is frozen data; its ``hash`` covers every byte the judge will use.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

KERNEL_SUFFIXES = (".cu", ".cuh", ".cpp", ".h", ".hpp")
MAX_SOURCE_BYTES = 2_000_000
INFRA_FILES = ("binding.cpp", "binding_registry.h")


class CandidateError(ValueError):
    """A candidate that cannot be read at all (missing file, wrong layout)."""


class Candidate(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["file", "workspace"]
    model_new: str                                 # source of the module defining ModelNew
    kernels: tuple[tuple[str, str], ...] = ()      # (relative path under kernels/, source)
    origin: str = ""

    @property
    def hash(self) -> str:
        h = hashlib.sha256(self.kind.encode())
        h.update(b"\0" + self.model_new.encode())
        for rel, src in self.kernels:
            h.update(b"\0" + rel.encode() + b"\0" + src.encode())
        return h.hexdigest()[:16]

    @classmethod
    def from_source(cls, source: str, origin: str = "<memory>") -> "Candidate":
        return cls(kind="file", model_new=source, origin=origin)

    @classmethod
    def from_path(cls, path: str | Path) -> "Candidate":
        path = Path(path)
        if path.is_dir():
            return cls._from_workspace(path)
        if not path.is_file():
            raise CandidateError(f"{path}: no such file or directory")
        return cls(kind="file", model_new=_read(path), origin=str(path))

    @classmethod
    def _from_workspace(cls, root: Path) -> "Candidate":
        model_new = root / "model_new.py"
        if not model_new.is_file():
            raise CandidateError(f"{root}: a workspace needs model_new.py (and kernels/*.cu + *_binding.cpp)")
        kernels = []
        kdir = root / "kernels"
        if kdir.is_dir():
            for p in sorted(kdir.rglob("*")):
                if p.is_file() and p.suffix in KERNEL_SUFFIXES:
                    kernels.append((p.relative_to(kdir).as_posix(), _read(p)))
        return cls(kind="workspace", model_new=_read(model_new), kernels=tuple(kernels), origin=str(root))

    @classmethod
    def from_files(cls, model_new: str, kernels: dict[str, str], origin: str = "<memory>") -> "Candidate":
        return cls(kind="workspace", model_new=model_new, kernels=tuple(sorted(kernels.items())), origin=origin)

    def write_workspace(self, root: Path) -> None:
        """Materialise a workspace candidate (with the fixed infrastructure) under `root`."""
        from importlib.resources import files

        root.mkdir(parents=True, exist_ok=True)
        (root / "model_new.py").write_text(self.model_new)
        for rel, src in self.kernels:
            dest = root / "kernels" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(src)
        infra = files("cuda_agent") / "infra"
        for name in INFRA_FILES:
            (root / name).write_text((infra / name).read_text())


def _read(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_SOURCE_BYTES:
        raise CandidateError(f"{path}: {size} bytes; sources over {MAX_SOURCE_BYTES} bytes are refused")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise CandidateError(f"{path}: not UTF-8 text") from None
