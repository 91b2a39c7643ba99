"""A task's workspace in the CUDA Agent layout.

    model.py              the reference (read-only; the judge uses the task's own copy)
    binding.cpp           fixed infrastructure (read-only; the judge uses the package's copy)
    binding_registry.h    fixed infrastructure (read-only)
    SKILL.md              what the agent must know (read-only)
    kernels/              the agent's kernels: <op>.cu (or .cpp on the CPU backend) + <op>_binding.cpp
    model_new.py          the agent's ModelNew, starting from a skeleton derived from the reference

Read-only files are protected twice: the file tools refuse to change them and they are written
with mode 0444. Neither matters for grading: the judge never reads them from the workspace.
"""

from __future__ import annotations

import ast
import os
from importlib.resources import files
from pathlib import Path

from cuda_agent import pysource
from cuda_agent.candidate import INFRA_FILES
from cuda_agent.tasks import Task

READ_ONLY = ("model.py", *INFRA_FILES, "SKILL.md")


def skill_text(device: str) -> str:
    """The skill document for a backend: CUDA kernels on the GPU, or C++/OpenMP on the CPU."""
    name = "SKILL.md" if device == "cuda" else "SKILL_cpu.md"
    return (files("cuda_agent.agent") / name).read_text()


def create_workspace(task: Task, root: Path, device: str) -> Path:
    """Write a fresh workspace for `task` under `root` (which must not hold one already)."""
    root = Path(root)
    if (root / "model_new.py").exists():
        raise FileExistsError(f"{root}: already holds a workspace")
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    infra = files("cuda_agent") / "infra"
    fixed = {"model.py": task.source, "SKILL.md": skill_text(device),
             **{name: (infra / name).read_text() for name in INFRA_FILES}}
    for name, text in fixed.items():
        path = root / name
        path.write_text(text)
        os.chmod(path, 0o444)
    (root / "model_new.py").write_text(starter_model_new(task.source))
    return root


_STARTER_HEAD = '''"""ModelNew: the same constructor, parameters and outputs as Model in model.py, computed by your
own kernels (kernels/*) through the `cuda_extension` module. See SKILL.md."""
import torch
import torch.nn as nn

import cuda_extension

'''


def starter_model_new(reference: str) -> str:
    """A skeleton ModelNew: the reference's constructor verbatim (so parameter names, shapes and
    initialisation match, and the judge can copy the reference weights in) and a forward with the
    reference's signature that still has to call the candidate's kernels."""
    tree = pysource.parse(reference)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    init = forward = None
    if model is not None:
        for node in model.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                init = node
            elif isinstance(node, ast.FunctionDef) and node.name == "forward":
                forward = node
    # module-level constants the constructor may read (e.g. sizes)
    consts = [n for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              and all(isinstance(t, ast.Name) for t in n.targets)]
    lines = [_STARTER_HEAD]
    lines += [ast.unparse(c) for c in consts]
    if consts:
        lines.append("")
    lines += ["", "class ModelNew(nn.Module):"]
    if init is not None:
        lines.append(_indent(ast.unparse(init)))
    else:
        lines.append("    def __init__(self, *args):\n        super().__init__()")
    args = ast.unparse(forward.args) if forward is not None else "self, *inputs"
    returns = f" -> {ast.unparse(forward.returns)}" if forward is not None and forward.returns else ""
    lines.append("")
    lines.append(f"    def forward({args}){returns}:")
    lines.append("        # Replace with calls into your kernels, e.g. return cuda_extension.my_op_forward(x, ...)")
    lines.append('        raise NotImplementedError("forward must call the kernels of cuda_extension")')
    return "\n".join(lines) + "\n"


def _indent(text: str) -> str:
    return "\n".join("    " + line if line else line for line in text.splitlines())
