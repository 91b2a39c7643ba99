"""What the model is told: the system prompt, the task, the engine's notes, the warm-up prompt.

One copy for every front (solve, run, every training stage), so a model trained on these prompts
is evaluated on the same ones. The skill document comes from the agent's workspace package.
"""

from __future__ import annotations

import re

from cuda_agent.tasks import Task

SYSTEM = """You are an expert {role} engineer. You work in a workspace on disk, only through the tools.
Make ModelNew in model_new.py compute exactly what Model in model.py computes, with your own kernels in \
kernels/, and make it faster than torch.compile. Take small steps: write, compile, verify, profile, \
improve. The judge's verdict is the only measure. When the workspace is correct and as fast as you can \
make it, call submit.

Every rule of the judge is in SKILL.md, reproduced here:

{skill}"""

TASK = """Task: {name}{level}. Backend: {backend}.

The reference, model.py:
```python
{source}
```

model_new.py holds a starter with the reference's constructor. Start with profile(target="reference")."""

NO_TOOL_CALL = ("Your reply called no tool. Act only through tool calls ({tools}); call submit when the "
                "workspace passes verify.")
CUT_OFF = "Your reply was cut off at the token limit. "
REPEAT_WARNING = ("\n\n[note: you made the same calls with the same results {n} times in a row; repeating them "
                  "changes nothing, so try something different.]")

SINGLE_TURN = """Task: {name}. Backend: {backend}.

Write ModelNew: the same constructor, parameters and outputs as Model below, computed by your own \
{kind} kernel built with torch.utils.cpp_extension.load_inline. Reply with the whole module in one \
```python block.

```python
{source}
```"""

_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def _system(device: str) -> dict:
    # imported here: cuda_agent.agent imports this package, so a top-level import would be circular
    from cuda_agent.agent.workspace import skill_text

    return {"role": "system", "content": SYSTEM.format(role="CUDA" if device == "cuda" else "C++ performance",
                                                       skill=skill_text(device))}


def agentic_messages(task: Task, device: str) -> list[dict]:
    """The conversation an agentic episode starts from: the system prompt and the task."""
    backend = "CUDA on the GPU" if device == "cuda" else "CPU (C++/OpenMP kernels in kernels/*.cpp)"
    return [_system(device),
            {"role": "user", "content": TASK.format(name=task.name, level=f" (level {task.level})" if task.level else "",
                                                    backend=backend, source=task.source.rstrip())}]


def single_turn_messages(task: Task, device: str) -> list[dict]:
    """The warm-up conversation: the system prompt and a request for one whole single-file ModelNew."""
    backend = "CUDA on the GPU" if device == "cuda" else "CPU (C++/OpenMP)"
    return [_system(device),
            {"role": "user", "content": SINGLE_TURN.format(name=task.name, backend=backend,
                                                           kind="CUDA" if device == "cuda" else "C++",
                                                           source=task.source.rstrip())}]


def extract_module(text: str) -> str | None:
    """The last fenced Python block of a reply that defines ModelNew, or None."""
    blocks = [b for b in _CODE_BLOCK.findall(text) if "ModelNew" in b]
    return blocks[-1] if blocks else None
