"""The run of `cuda-agent synth decontam`: the edit battery (`edits.py`) over a benchmark folder,
each edited task asked of the synth pipeline's decontamination; the catch rate per edit kind and
the false positives on distinct tasks."""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from cuda_agent.tasks import TaskError, validate_reference_source

from .decontam import BenchmarkIndex, DecontamConfig, contamination
from .edits import DISTINCT, EDITS, planted


def benchmark_files(bench: Path, levels: list[int] | None, limit: int | None) -> list[Path]:
    """The folder's task files of those levels (file names lN_*, or folders levelN; none: all)."""
    files = sorted(p for p in bench.rglob("*.py")
                   if not levels or any(re.match(fr"(l{lv}_|level{lv}\b)", part)
                                        for lv in levels for part in p.relative_to(bench).parts))
    return files[:limit] if limit else files


def edited_cases(bench: Path, files: list[Path], edits: list[str], distinct: Path | None):
    """(kind, original, edited source) for every edit that applies, the planted near-copies and the
    distinct tasks; and how many tasks each edit did not apply to."""
    cases: list[tuple[str, str, str]] = []
    na: dict[str, int] = defaultdict(int)
    for p in files:
        src = p.read_text()
        try:
            validate_reference_source(src, p.name)
        except TaskError:
            continue
        for kind in edits:
            try:
                edited = EDITS[kind](src)
            except (SyntaxError, ValueError, TypeError, AttributeError):
                edited = None
            if edited is None:
                na[kind] += 1
                continue
            cases.append((kind, p.name, edited))
    for _name, (orig, src) in planted(bench if not files else files[0].parent).items():
        cases.append(("planted", orig, src))
    for name, src in DISTINCT.items():
        cases.append(("distinct", name, src))
    if distinct:
        for line in distinct.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                cases.append(("distinct", row.get("name", "?"), row["code"]))
    return cases, na


def measure(bench: Path, levels: list[int] | None = None, edits: list[str] | None = None, limit: int | None = None,
            trace: bool = True, distinct: Path | None = None, log=sys.stderr) -> dict:
    """Build the index over the chosen files, edit, ask decontamination of each case: the figures."""
    from .trace import trace_many

    edits = list(edits or EDITS)
    cfg = DecontamConfig(trace=trace)
    t0 = time.monotonic()
    files = benchmark_files(bench, levels, limit)
    with tempfile.TemporaryDirectory() as tmp:   # the index over the chosen files only
        for p in files:
            dst = Path(tmp) / p.relative_to(bench)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(p.read_text())
        index = BenchmarkIndex.from_dir(tmp, trace=trace)
    print(f"index: {len(index)} tasks ({index.skipped} skipped) in {time.monotonic() - t0:.1f} s", file=log)
    cases, na = edited_cases(bench, files, edits, distinct)
    t1 = time.monotonic()
    traces = trace_many([c[2] for c in cases], timeout_s=3600) if trace else [None] * len(cases)
    print(f"traced {len(cases)} sources in {time.monotonic() - t1:.1f} s "
          f"({sum(t is None for t in traces)} untraceable)", file=log)
    caught: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    own: dict[str, int] = defaultdict(int)
    missed: dict[str, list[str]] = defaultdict(list)
    flagged: list[str] = []
    for (kind, orig, src), tr in zip(cases, traces):
        near = index.nearest(src, cfg, trace=tr)
        why = contamination(near, cfg)
        total[kind] += 1
        if kind == "distinct":
            if why is not None:
                flagged.append(f"{orig} ~ {near.name} ({why})")
            continue
        caught[kind] += why is not None
        own[kind] += why is not None and Path(near.name).name == orig
        if why is None and len(missed[kind]) < 5:
            missed[kind].append(orig)
    rows = [{"edit": kind, "caught": caught[kind], "total": total[kind], "rate": caught[kind] / total[kind],
             "caught_as_own": own[kind], "not_applicable": na.get(kind, 0), "missed": missed[kind]}
            for kind in [*edits, "planted"] if total[kind]]
    return {"rows": rows, "distinct": total["distinct"], "false_positives": flagged, "trace": trace,
            "index": len(index), "wall_s": round(time.monotonic() - t0, 1)}


def render(result: dict) -> str:
    """The figures as the command prints them: one line per edit kind, then the distinct tasks flagged."""
    lines = [f"{'edit':<12} {'caught':>8} {'of':>5} {'rate':>7} {'as own':>7} {'n/a':>5}  missed (first 5)"]
    for r in result["rows"]:
        lines.append(f"{r['edit']:<12} {r['caught']:>8} {r['total']:>5} {r['rate']:>7.1%} {r['caught_as_own']:>7} "
                     f"{r['not_applicable']:>5}  {', '.join(r['missed'])}")
    lines.append(f"\ndistinct tasks flagged: {len(result['false_positives'])} of {result['distinct']}")
    lines += [f"  {f}" for f in result["false_positives"]]
    return "\n".join(lines)
