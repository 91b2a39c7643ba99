"""Task files as verl's RL parquet (what `data.train_files` reads).

Columns: `data_source` (the task's group or Ops-6K `data_source`), `prompt` (the chat messages the
episode starts from, so verl's length filter sees the real prompt), `ability` ("cuda_kernel"),
`reward_model` (`style` "judge", `ground_truth` the task id: the reward comes from the judge, not
from a reference answer), `extra_info` (`index`, `name`, `mode`, `task`: the whole Task as JSON,
which `CudaAgentLoop` rebuilds), and `agent_name` ("cuda_agent", the loop that serves the row).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from cuda_agent.tasks import Task

from .episode import agentic_messages, single_turn_messages

AGENT_NAME = "cuda_agent"


def rl_rows(tasks: list[Task], *, device: str, mode: str = "agentic") -> list[dict]:
    if mode not in ("agentic", "single_turn"):
        raise ValueError(f"mode must be agentic or single_turn, not {mode!r}")
    rows = []
    for i, task in enumerate(tasks):
        messages = (agentic_messages if mode == "agentic" else single_turn_messages)(task, device)
        rows.append({
            "data_source": task.data_source or task.group or "tasks",
            "prompt": messages,
            "ability": "cuda_kernel",
            "reward_model": {"style": "judge", "ground_truth": task.id},
            "extra_info": {"index": i, "name": task.name, "mode": mode, "task": task.model_dump_json()},
            "agent_name": AGENT_NAME,
        })
    return rows


def write_rl_parquet(tasks: list[Task], out: Path, *, device: str, mode: str = "agentic", val_fraction: float = 0.0,
                     seed: int = 0) -> dict[str, Path]:
    """Write OUT/train.parquet (and OUT/val.parquet with `val_fraction` of the tasks, at least one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not tasks:
        raise ValueError("no tasks to write")
    tasks = list(tasks)
    random.Random(seed).shuffle(tasks)
    n_val = max(1, round(len(tasks) * val_fraction)) if val_fraction > 0 and len(tasks) > 1 else 0
    parts = {"train": tasks[n_val:], **({"val": tasks[:n_val]} if n_val else {})}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, part in parts.items():
        path = out / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rl_rows(part, device=device, mode=mode)), path)
        paths[name] = path
    (out / "prepare.json").write_text(json.dumps({"mode": mode, "device": device, "seed": seed,
                                                  **{k: len(v) for k, v in parts.items()}}, indent=1))
    return paths
