"""Nsight Compute's per-kernel counters, read from `ncu --csv` and summarised for a model to act on.

`NCU_METRICS` is what the agent's `profile` tool asks ncu for: the kernel's duration, DRAM and SM
throughput as shares of their peaks, achieved and theoretical occupancy, launch shape, and the
warp stall reasons (cycles a warp spends stalled per issued instruction, by reason). `parse_ncu`
reads ncu's CSV (one row per kernel launch and metric) into `KernelCounters`; `summarize` groups
launches by kernel name and gives each a one-line diagnosis; `render` writes it in a few lines per
kernel. `ncu_problem` recognises the ways ncu fails (no counter permission, nothing profiled).

The diagnosis follows the usual reading of Nsight Compute's Speed-of-Light section: a kernel whose
memory or SM throughput is near its peak is bound by it; one far from both is latency-bound (the
stall reasons say on what); a kernel of a few microseconds is dominated by its launch.
"""

from __future__ import annotations

import csv
import io
import math
import re

from pydantic import BaseModel, Field

DURATION = "gpu__time_duration.sum"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_BYTES = "dram__bytes.sum"
MEM_PCT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"
GRID = "launch__grid_size"
BLOCK = "launch__block_size"
REGISTERS = "launch__registers_per_thread"
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"

# The stall reasons of the Warp State section, with what each usually means for a kernel author.
STALL_ADVICE = {
    "long_scoreboard": "waiting on global/local memory loads: more loads in flight (vector loads, unrolling), "
                       "higher occupancy, or staging through shared memory",
    "short_scoreboard": "waiting on shared memory or special functions (exp, rsqrt, division): bank conflicts "
                        "or MUFU pressure",
    "barrier": "waiting at __syncthreads: uneven work between warps, or fewer barriers (warp shuffles)",
    "membar": "waiting on memory fences",
    "mio_throttle": "shared-memory/special-function instruction queue full: fewer, wider shared accesses",
    "lg_throttle": "global memory instruction queue full: wider (128-bit) loads, fewer memory instructions",
    "math_pipe_throttle": "a math pipe is saturated: the kernel is busy computing (use a faster pipe: tensor cores, "
                          "FMA instead of division)",
    "wait": "fixed-latency dependencies between instructions: more independent work per thread (ILP)",
    "not_selected": "warps ready but not picked (healthy: the scheduler has work)",
    "selected": "issuing (healthy)",
    "no_instruction": "instruction fetch misses or divergent branches",
    "dispatch_stall": "the dispatcher stalled (pipeline conflicts)",
    "drain": "stores draining at the end of the kernel",
    "imc_miss": "constant cache misses",
    "branch_resolving": "branch target computation, divergence",
    "sleeping": "warps sleeping (nanosleep, cooperative waits)",
    "tex_throttle": "texture/L1 queue full",
    "misc": "miscellaneous stalls",
    "gmma": "waiting on warpgroup MMA (wgmma) results",
}
NCU_METRICS: tuple[str, ...] = (DURATION, DRAM_PCT, DRAM_BYTES, MEM_PCT, SM_PCT, OCCUPANCY, THEORETICAL_OCCUPANCY,
                                GRID, BLOCK, REGISTERS) + tuple(f"{STALL_PREFIX}{r}{STALL_SUFFIX}" for r in STALL_ADVICE)

# Thresholds of the diagnosis, in percent of peak and in microseconds.
BUSY_PCT = 60.0      # memory or SM throughput at or above this: bound by that unit
LAUNCH_US = 5.0      # a kernel shorter than this is dominated by launch and ramp-up

_SCALE = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9,
          "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def _value(text: str) -> float | None:
    text = text.strip().strip('"')
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):  # thousands separators (ncu's default print)
        text = text.replace(",", "")
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


class KernelCounters(BaseModel):
    """One kernel launch: its id in the report, name, and metrics in base units (ns, bytes, %)."""

    id: str
    kernel: str
    metrics: dict[str, float] = Field(default_factory=dict)


def parse_ncu(text: str) -> list[KernelCounters]:
    """Every kernel launch of an `ncu --csv` report (raw page: one row per launch and metric), in
    report order. Lines that are not the CSV report (ncu's ==PROF== lines, the program's output) are
    skipped; the report starts at the header naming "Metric Name" and "Metric Value". Values are
    scaled to nanoseconds and bytes when ncu printed other units."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith('"') and '"Metric Name"' in line and '"Metric Value"' in line), None)
    if start is None:
        return []
    body = [line for line in lines[start:] if line.startswith('"')]
    launches: dict[str, KernelCounters] = {}
    for row in csv.DictReader(io.StringIO("\n".join(body))):
        name, raw = row.get("Metric Name"), row.get("Metric Value")
        value = _value(raw or "")
        if not name or value is None:
            continue
        unit = (row.get("Metric Unit") or "").strip()
        value *= _SCALE.get(unit, 1.0)
        key = row.get("ID") or str(len(launches))
        k = launches.setdefault(key, KernelCounters(id=key, kernel=row.get("Kernel Name") or ""))
        k.metrics[name] = value
    return list(launches.values())


def parse_ncu_csv(text: str, metric: str = DURATION) -> list[dict]:
    """Kernels and their `metric` in base units (nanoseconds for durations) from `ncu --csv` output:
    one dict per launch, {"id", "kernel", "ns"}; launches without that metric are left out."""
    return [{"id": k.id, "kernel": k.kernel, "ns": k.metrics[metric]} for k in parse_ncu(text) if metric in k.metrics]


def ncu_problem(text: str) -> str | None:
    """Why an ncu run gave no counters, from its output, or None when it did."""
    if "ERR_NVGPUCTRPERM" in text:
        return ("no permission to read the GPU's performance counters (ERR_NVGPUCTRPERM): run as root, or load the "
                "driver with NVreg_RestrictProfilingToAdminUsers=0")
    if parse_ncu(text):
        return None
    errors = [ln.strip() for ln in text.splitlines() if ln.startswith("==ERROR==")]
    if errors:
        return "; ".join(errors[:3])[:600]
    if "No kernels were profiled" in text:
        return "ncu saw no kernel launches in the profiled call"
    return "ncu wrote no report"


class KernelSummary(BaseModel):
    """The launches of one kernel (by name) in the profiled call, their counters averaged by duration."""

    kernel: str
    launches: int
    duration_us: float                   # all launches together
    dram_pct: float | None = None
    dram_gbs: float | None = None        # achieved DRAM bandwidth
    mem_pct: float | None = None
    sm_pct: float | None = None
    occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    grid: int | None = None
    block: int | None = None
    registers: int | None = None
    stalls: list[tuple[str, float]] = Field(default_factory=list)   # top reasons, cycles per issued instruction
    diagnosis: str = ""


def _short_name(name: str, width: int = 60) -> str:
    """The kernel's name without its argument list (templates kept), cut to `width`."""
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    short = name[:cut].strip() or name
    return short if len(short) <= width else short[: width - 3] + "..."


def diagnose(k: KernelSummary) -> str:
    """One line: what bounds the kernel and what to try."""
    per_launch_us = k.duration_us / max(k.launches, 1)
    dram = k.dram_pct if k.dram_pct is not None else k.mem_pct
    mem = max(x for x in (k.dram_pct, k.mem_pct, 0.0) if x is not None)
    sm = k.sm_pct or 0.0
    top = next((r for r, _ in k.stalls if r not in ("not_selected", "selected")), None)
    stall = f"; top stall {top}: {STALL_ADVICE[top]}" if top else ""
    if per_launch_us < LAUNCH_US:
        return (f"launch-bound: {per_launch_us:.1f} us per launch is mostly launch and ramp-up; fuse it into a "
                "neighbouring kernel or give each launch more work")
    if mem >= BUSY_PCT and mem >= sm:
        return (f"memory-bound: memory at {mem:.0f}% of peak (DRAM {dram or 0:.0f}%); it is near its roof, so only "
                "moving fewer bytes helps (fuse, keep data on chip, narrower types)")
    # Busy SM pipes with warps waiting mostly on global memory (a transpose through shared memory,
    # say) are not what bounds the kernel: it falls to the latency line with that stall's advice.
    if sm >= BUSY_PCT and top != "long_scoreboard":
        return (f"compute-bound: SM throughput {sm:.0f}% of peak; do fewer or cheaper instructions (tensor cores, "
                f"fewer conversions and divisions){stall}")
    occ = ""
    if k.occupancy_pct is not None:
        occ = f", occupancy {k.occupancy_pct:.0f}%"
        if k.theoretical_occupancy_pct is not None:
            occ += f" of {k.theoretical_occupancy_pct:.0f}% possible"
    return f"latency-bound: memory {mem:.0f}% and SM {sm:.0f}% of peak{occ}{stall}"


def summarize(kernels: list[KernelCounters], top_stalls: int = 3) -> list[KernelSummary]:
    """Launches grouped by kernel name, longest total time first; counters are duration-weighted means."""
    groups: dict[str, list[KernelCounters]] = {}
    for k in kernels:
        groups.setdefault(k.kernel, []).append(k)
    out = []
    for name, ks in groups.items():
        weights = [k.metrics.get(DURATION, 0.0) for k in ks]
        total_ns = sum(weights)

        def mean(metric: str) -> float | None:
            pairs = [(k.metrics[metric], w) for k, w in zip(ks, weights) if metric in k.metrics]
            if not pairs:
                return None
            wsum = sum(w for _, w in pairs)
            return sum(v * w for v, w in pairs) / wsum if wsum else sum(v for v, _ in pairs) / len(pairs)

        def first(metric: str) -> int | None:
            v = next((k.metrics[metric] for k in ks if metric in k.metrics), None)
            return None if v is None else int(v)

        dram_bytes = sum(k.metrics.get(DRAM_BYTES, 0.0) for k in ks)
        stalls = [(r, mean(f"{STALL_PREFIX}{r}{STALL_SUFFIX}")) for r in STALL_ADVICE]
        stalls = sorted(((r, v) for r, v in stalls if v and r != "selected"), key=lambda rv: -rv[1])[:top_stalls]
        s = KernelSummary(kernel=name, launches=len(ks), duration_us=total_ns / 1e3, dram_pct=mean(DRAM_PCT),
                          dram_gbs=(dram_bytes / total_ns) if total_ns and any(DRAM_BYTES in k.metrics for k in ks)
                          else None,
                          mem_pct=mean(MEM_PCT), sm_pct=mean(SM_PCT), occupancy_pct=mean(OCCUPANCY),
                          theoretical_occupancy_pct=mean(THEORETICAL_OCCUPANCY), grid=first(GRID), block=first(BLOCK),
                          registers=first(REGISTERS), stalls=stalls)
        out.append(s.model_copy(update={"diagnosis": diagnose(s)}))
    out.sort(key=lambda s: -s.duration_us)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}%"


def render(summaries: list[KernelSummary], *, max_kernels: int = 6, peak_dram_gbs: float | None = None) -> str:
    """A few lines per kernel (the longest `max_kernels`), for the model."""
    if not summaries:
        return "no kernels"
    total = sum(s.duration_us for s in summaries)
    lines = [f"{len(summaries)} kernel{'s' if len(summaries) != 1 else ''}, "
             f"{sum(s.launches for s in summaries)} launches, {total:.1f} us of GPU time in one call:"]
    for s in summaries[:max_kernels]:
        shape = ""
        if s.grid is not None and s.block is not None:
            shape = f", grid {s.grid} x block {s.block}" + (f", {s.registers} regs" if s.registers else "")
        bw = ""
        if s.dram_gbs is not None:
            bw = f" = {s.dram_gbs:.0f} GB/s" + (f" of {peak_dram_gbs:.0f}" if peak_dram_gbs else "")
        occ = _pct(s.occupancy_pct) + (f" (theoretical {_pct(s.theoretical_occupancy_pct)})"
                                       if s.theoretical_occupancy_pct is not None else "")
        stalls = ", ".join(f"{r} {v:.1f}" for r, v in s.stalls) or "-"
        lines.append(f"- {_short_name(s.kernel)}: {s.duration_us:.1f} us"
                     + (f" in {s.launches} launches" if s.launches > 1 else "") + f" ({100 * s.duration_us / total:.0f}%)"
                     + shape)
        lines.append(f"  DRAM {_pct(s.dram_pct)}{bw}, memory {_pct(s.mem_pct)}, SM {_pct(s.sm_pct)} of peak; "
                     f"occupancy {occ}; stalls (cycles/instr) {stalls}")
        lines.append(f"  -> {s.diagnosis}")
    if len(summaries) > max_kernels:
        rest = summaries[max_kernels:]
        lines.append(f"- {len(rest)} more kernels, {sum(s.duration_us for s in rest):.1f} us together")
    return "\n".join(lines)
