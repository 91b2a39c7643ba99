"""`cuda-agent sol`: the speed-of-light of every task of a task set, without a judge or a GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from cuda_agent.console import make_console, print_error
from rich.table import Table

from .peaks import GPU_PEAKS, known_models, peaks_for
from .sol import SpeedOfLight, count_work, speed_of_light

EXIT_USAGE, EXIT_TASKS = 2, 3


def task_sol(task, device_name: str) -> SpeedOfLight:
    """A task's speed-of-light counted on the meta device only (nothing of the task's is computed
    here), with the reason when its work cannot be counted that way."""
    from .sol import TaskWork

    try:
        work = count_work(task.source, device="meta", name=task.origin or task.name)
    except ValueError as exc:
        return SpeedOfLight(work=TaskWork(counted_on="none"), device_name=device_name, reason=str(exc)[:300])
    return speed_of_light(work, device_name)


def sol_cmd(
    tasks: Annotated[str, typer.Argument(help="'suite' (bundled), a KernelBench-style folder, a task .py, "
                                              "or an Ops-6K .jsonl/.parquet file")] = "suite",
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", help="GPU model as torch names it, or a table entry (e.g. 'H200', 'H100 PCIe', 'A100 40GB', "
                      "'L40S'); default: this machine's GPU")] = None,
    level: Annotated[Optional[list[int]], typer.Option("--level", help="only these levels")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="also write one JSON line per task here")] = None,
) -> None:
    """Each task's least work (FLOPs by precision, least DRAM bytes) and the least time it can take on a GPU model.

    The work is counted from the reference alone, on the meta device (shapes and dtypes, no compute):
    torch's FLOP counter for GEMMs, convolutions and attention, one FLOP per pointwise or reduced
    element, and every input, parameter and output moved through DRAM once. The bound is the larger
    of memory time and compute time at the GPU's datasheet peaks (`cuda_agent.hardware.peaks`).
    Exit 2 for an unknown GPU model, 3 for a task set that cannot be read.
    """
    import torch

    from cuda_agent.tasks import TaskError, load_tasks

    err = make_console(stderr=True)
    if gpu is None:
        if not torch.cuda.is_available():
            err.print(f"[red]error:[/red] no GPU here: name one with --gpu ({', '.join(known_models())})")
            raise typer.Exit(EXIT_USAGE)
        gpu = torch.cuda.get_device_name(0)
    peaks = next((p for p in GPU_PEAKS
                  if p.model.lower() == gpu.lower()), None) or peaks_for(gpu)
    if peaks is None:
        err.print(f"[red]error:[/red] no peak figures for {gpu!r} (known: {', '.join(known_models())})")
        raise typer.Exit(EXIT_USAGE)
    try:
        task_list = load_tasks("suite" if tasks == "suite" else tasks, level)
    except TaskError as exc:
        print_error(err, str(exc))
        raise typer.Exit(EXIT_TASKS)
    if level:
        task_list = [t for t in task_list if t.level in set(level)]
    table = Table(title=f"speed-of-light on {peaks.model} ({peaks.dram_gbs:g} GB/s)", caption=peaks.source)
    for col in ("task", "level", "GEMM GFLOP", "vector GFLOP", "DRAM MB", "FLOP/byte", "memory ms",
                "compute ms", "SOL ms", "bound"):
        table.add_column(col, justify="left" if col == "task" else "right")
    fh = out.open("w", encoding="utf-8") if out else None
    try:
        for t in task_list:
            sol = task_sol(t, peaks.model)
            if sol.reason is None:
                sol = speed_of_light(sol.work, gpu, peaks)
            w = sol.work
            table.add_row(t.name, "" if t.level is None else str(t.level),
                          " ".join(f"{f / 1e9:.3g} {p}" for p, f in sorted(w.matmul_flops.items())) or "-",
                          f"{sum(w.vector_flops.values()) / 1e9:.3g}", f"{w.dram_bytes / 1e6:.1f}",
                          "-" if w.intensity is None else f"{w.intensity:.3g}",
                          "-" if sol.memory_ms is None else f"{sol.memory_ms:.4g}",
                          "-" if sol.compute_ms is None else f"{sol.compute_ms:.4g}",
                          "-" if sol.sol_ms is None else f"{sol.sol_ms:.4g}", sol.bound or f"none: {sol.reason}")
            if fh:
                fh.write(json.dumps({"task": t.name, "task_id": t.id, "level": t.level,
                                     "speed_of_light": sol.model_dump(mode="json")}) + "\n")
    finally:
        if fh:
            fh.close()
    Console().print(table)
