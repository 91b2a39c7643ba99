"""Export accepted tasks as Parquet and JSONL with the CUDA-Agent-Ops-6K columns plus our metadata.

Ops-6K columns: `ops` (JSON list string of operator names), `data_source` (`torch#N`; here N is
the number of fused seed operators), `code` (the KernelBench-format module). Ours: `name`
(`<index>_<ops>`, unique), `task_id` (the content hash `Task` uses), `seed`, `composer`,
`eager_ms`, `compile_ms` (null when compile was not checked), `input_shapes`, `output_shapes`
and `filter_report` (JSON strings), `nearest_benchmark` and `benchmark_similarity` (empty and
null without a benchmark directory), `work` (JSON: the task's least work per call, FLOPs by
precision and least DRAM bytes, `cuda_agent.hardware.sol.TaskWork`, counted on the meta device;
null when meta tensors cannot run it) and `sol_ms_h200` (that work's speed-of-light on an H200, a
reference point that needs no GPU; `cuda-agent sol` gives it on other models). Every file is written to a temporary name and renamed, so a
reader never sees half a file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cuda_agent.tasks import Task

SCHEMA = pa.schema([
    ("ops", pa.string()), ("data_source", pa.string()), ("code", pa.string()), ("name", pa.string()),
    ("task_id", pa.string()), ("seed", pa.int64()), ("composer", pa.string()), ("eager_ms", pa.float64()),
    ("compile_ms", pa.float64()), ("input_shapes", pa.string()), ("output_shapes", pa.string()),
    ("filter_report", pa.string()), ("nearest_benchmark", pa.string()), ("benchmark_similarity", pa.float64()),
    ("work", pa.string()), ("sol_ms_h200", pa.float64()),
])


def _work(source: str) -> tuple[str | None, float | None]:
    """The task's least work (JSON) and its speed-of-light on an H200. Meta device only: the export
    process computes nothing of a task (the sandboxed filter workers ran it)."""
    from cuda_agent.hardware.sol import count_work, speed_of_light

    try:
        work = count_work(source, device="meta")
    except ValueError:
        return None, None
    return work.model_dump_json(), speed_of_light(work, "NVIDIA H200").sol_ms


def row_of(rec) -> dict:
    """One export row from a `pipeline.CandidateRecord` of an accepted candidate."""
    check = rec.check
    near = rec.nearest
    work, sol_ms = _work(rec.source)
    return {
        "ops": json.dumps(list(rec.ops)),
        "data_source": f"torch#{len(rec.ops)}",
        "code": rec.source,
        "name": f"{rec.index}_{rec.name}",
        "task_id": Task.source_hash(rec.source),
        "seed": rec.seed,
        "composer": rec.composer,
        "eager_ms": check.eager_ms if check else None,
        "compile_ms": check.compile_ms if check else None,
        "input_shapes": json.dumps(check.input_shapes if check else []),
        "output_shapes": json.dumps(check.output_shapes if check else []),
        "filter_report": json.dumps({"passed": check.passed if check else [], "batches": check.batches if check else [],
                                     "n_params": check.n_params if check else None,
                                     "check_s": round(check.check_s, 3) if check else None,
                                     "ast_hash": rec.ast_hash}),
        "nearest_benchmark": near.name if near else "",
        "benchmark_similarity": near.score if near else None,
        "work": work,
        "sol_ms_h200": sol_ms,
    }


def export(records: list, out: str | Path, stem: str = "tasks") -> int:
    """Write `stem.parquet` and `stem.jsonl` under `out`; returns the number of rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [row_of(r) for r in records]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    tmp = out / f".{stem}.parquet.tmp"
    pq.write_table(table, tmp)
    tmp.replace(out / f"{stem}.parquet")
    tmp = out / f".{stem}.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    tmp.replace(out / f"{stem}.jsonl")
    return len(rows)
