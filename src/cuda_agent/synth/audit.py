"""`cuda-agent synth audit`: audit an exported synth sample at the judge's tolerance, on input sets the filters never saw.

Every task of `OUT/tasks.jsonl` is rebuilt and probed with the shortcut checks of the synth worker
(`shortcuts.shortcut_checks`: zero and constant outputs, dropped or replaced parameters and their
triangles, replaced inputs, 1e-6 input jitter, float64 evaluation, batch mixing, parameters constant
at initialisation) on `--sets` fresh input sets drawn under other seeds than the filter's. A task
that passes the filters and fails here is a defect the filters missed (with more sets, a
near-degenerate output shows up more often). Tasks run in this process: audit only exports you
made. `--batch N` probes each task at `BATCH = N` instead of its exported size (a sample sized for a
GPU audited on a CPU; the filters' shortcut checks also run at the composed size, before the runtime
window rescales it).

`--checks criterion` (or `both`, the default) also holds every task to the export criterion
(`synth.criterion.check_task`: on `--sets` input sets drawn by the judge's own `fresh_inputs`
under other seeds than the filter's, with weights drawn as the judge draws them, finite outputs,
a 1e-6 relative input perturbation within the judge's comparison, float64 within it), at the
exported size unless `--batch` says otherwise; its seconds per task are reported.

    cuda-agent synth audit OUT/tasks.jsonl [--sets 30] [--device cpu] [--batch N]
                           [--checks shortcuts|criterion|both] [--time-limit S] [--json audit.json]
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from cuda_agent.host import true_fp32

from .compose import set_batch
from .criterion import check_task
from .filters import FilterConfig
from .shortcuts import shortcut_checks
from .worker import Reject, Runner


def audit(path: Path, sets: int, device: str, seed: int, batch: int | None = None,
          time_limit: float | None = None, checks: str = "both") -> dict:
    """Every task of the export (`path`, a tasks.jsonl) through the checks; one line each on stderr,
    the figures returned."""
    cfg = FilterConfig(device=device, n_input_sets=sets, shortcut_seed=seed).payload()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if time_limit is not None:
        # a cut audit covers a random part of the export, not its first tasks (the export is in
        # candidate order, which follows the composer's stream)
        random.Random(seed).shuffle(rows)
    if device == "cuda":
        import torch

        true_fp32(torch)   # as the synth worker and the judge: references in true fp32, no TF32
    found: list[dict] = []
    t0 = time.monotonic()
    for n, row in enumerate(rows, 1):
        if time_limit is not None and time.monotonic() - t0 > time_limit:
            print(f"time limit: {len(found)} of {len(rows)} tasks audited", file=sys.stderr)
            break
        t = time.monotonic()
        code = (set_batch(row["code"], batch) or row["code"]) if batch else row["code"]
        verdict = {"name": row["name"], "defect": None}
        try:
            if checks in ("criterion", "both"):
                res = check_task(code, device=device, sets=sets, seed=seed, name=row["name"])
                verdict["criterion_s"] = round(res.seconds, 2)
                if not res.ok:
                    raise Reject(res.filter, res.message)
            if checks in ("shortcuts", "both"):
                shortcut_checks(Runner(code, device), cfg, code)
        except Reject as rej:
            verdict.update(defect=rej.filter, message=rej.message[:300])
        except Exception as exc:  # noqa: BLE001 - out of memory at the exported size, say: not a defect, reported
            verdict["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        verdict["audit_s"] = round(time.monotonic() - t, 2)
        found.append(verdict)
        print(f"[{n}/{len(rows)}] {row['name']}: {verdict['defect'] or ('error' if 'error' in verdict else 'ok')} "
              f"({verdict['audit_s']} s)" + (f": {verdict.get('message') or verdict.get('error')}"
                                              if verdict["defect"] or "error" in verdict else ""),
              file=sys.stderr, flush=True)
    counts = Counter(v["defect"] for v in found if v["defect"])
    crit = sorted(v["criterion_s"] for v in found if "criterion_s" in v)
    return {"tasks": len(found), "of": len(rows), "defective": sum(counts.values()), "by_defect": dict(counts),
            "errors": sum("error" in v for v in found), "sets": sets, "checks": checks,
            "criterion_s_median": crit[len(crit) // 2] if crit else None,
            "criterion_s_max": crit[-1] if crit else None,
            "wall_s": round(time.monotonic() - t0, 1), "tasks_audited": found}


def summary(result: dict) -> str:
    return (f"{result['defective']} of {result['tasks']} tasks (of {result['of']}) defective on {result['sets']} "
            f"fresh input sets: {result['by_defect']}, {result['errors']} could not be audited ({result['wall_s']} s)")
