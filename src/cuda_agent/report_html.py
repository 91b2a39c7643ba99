"""One self-contained HTML file per run (or per pair of runs), from the results database.

Contents: the run's settings, CUDA Agent's Table 1 per level with KernelBench's fast_p and the share
of speed-of-light, plots of the speed-up distribution, of fast_p over p and a roofline (SVG made by
matplotlib, embedded as data URIs), a row per (task, candidate) pair (verdict, times, speed-ups,
share of speed-of-light, reward, and the solution's source inline,
collapsible; a pair the judge could not judge is a row with its category and message),
and, for two runs, the metrics side by side, a per-task comparison and a scatter of speed-ups.
Nothing is fetched when the file is opened: no scripts, fonts or images from elsewhere. The small
inline script only sorts and filters tables.
"""

from __future__ import annotations

import base64
import io
import json
import math
import time
from pathlib import Path

from pydantic import BaseModel

from cuda_agent.db import ResultsDB, RunInfo, StoredFailure, StoredVerdict
from cuda_agent.metrics import (COUNTING_NOTE, FAST_P, GEOMEAN_NOTE, MetricsTable, Outcome, fast_p_key,
                               metrics_table)
from cuda_agent.report import fmt_ms, fmt_pct, fmt_x, solution_label
from cuda_agent.reward import RewardConfig, reward_of

TEMPLATE = "report.html.j2"


class TaskRow(BaseModel):
    task_id: str
    name: str
    level: int | None
    status: str                  # "correct", the failure category, or "not judged: <category>"
    correct: bool
    judged: bool = True          # False: the judge could not judge this pair (no verdict)
    solution: str = ""           # the solution's name (file or folder)
    runtime_ms: float | None
    eager_ms: float | None
    compile_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    reward: float | None
    reward_reason: str
    build_s: float | None
    judge_s: float | None
    message: str
    notes: list[str]
    candidate_hash: str
    origin: str
    sources: list[tuple[str, str]]   # (file name, text) of the solution
    # speed-of-light on the judging GPU (None without a bound): its time, what bounds it, the task's
    # least work, and the runtimes as shares of it
    sol_ms: float | None = None
    sol_bound: str | None = None
    sol_gpu: str | None = None
    sol_note: str | None = None
    flops: float | None = None
    dram_bytes: float | None = None
    sol_share: float | None = None
    eager_sol_share: float | None = None
    compile_sol_share: float | None = None


class RunView(BaseModel):
    info: RunInfo
    device_names: list[str]
    rows: list[TaskRow]
    table: MetricsTable
    n_missing: int
    n_tasks: int                 # distinct tasks among the rows
    failures: dict[str, int]     # candidate failures: category -> pairs
    judge_failures: dict[str, int]   # pairs the judge could not judge: category -> pairs


class CompareRow(BaseModel):
    name: str
    solution: str
    level: int | None
    a: TaskRow | None
    b: TaskRow | None
    ratio: float | None          # B's speed-up vs eager / A's, when both are correct


def load_run(db: ResultsDB, name: str, *, count_missing: bool = False) -> RunView:
    info = db.run(name)
    if info is None:
        known = ", ".join(r.name for r, _ in db.runs()) or "none"
        raise KeyError(f"no run named {name!r} in {db.path} (runs: {known})")
    stored = db.records(name)
    stored.sort(key=lambda v: (v.level is None, v.level or 0, _natural(v.task_name), v.solution))
    reward = info.reward()
    rows = [_row(db, v, reward) for v in stored]
    missing = info.info.get("missing") or []
    outcomes = [Outcome.of(v.verdict, v.level, v.task_id) if isinstance(v, StoredVerdict)
                else Outcome.unjudged(v.level, v.task_id) for v in stored]
    if count_missing:
        outcomes += [Outcome.missing(m.get("level"), m.get("id")) for m in missing]
    failures: dict[str, int] = {}
    judge_failures: dict[str, int] = {}
    for v in stored:
        if isinstance(v, StoredFailure):
            judge_failures[v.category] = judge_failures.get(v.category, 0) + 1
        elif not v.verdict.correct:
            key = v.verdict.failure.category.value if v.verdict.failure else "incorrect"
            failures[key] = failures.get(key, 0) + 1
    return RunView(info=info, device_names=sorted({v.verdict.device_name for v in stored
                                                   if isinstance(v, StoredVerdict) and v.verdict.device_name}),
                   rows=rows, table=metrics_table(outcomes), n_missing=len(missing),
                   n_tasks=len({v.task_id for v in stored}), failures=failures, judge_failures=judge_failures)


def _natural(name: str) -> tuple:
    head = name.split("_", 1)[0]
    return (int(head), name) if head.isdigit() else (1 << 30, name)


def _row(db: ResultsDB, sv: StoredVerdict | StoredFailure, reward: RewardConfig) -> TaskRow:
    """One pair of a run; a verdict is scored under the run's reward settings (`reward`)."""
    cand = db.candidate(sv.candidate_hash)
    sources: list[tuple[str, str]] = []
    origin = sv.solution
    if cand is not None:
        origin = origin or cand.origin
        sources.append(("model_new.py" if cand.kind == "workspace" else Path(origin).name or "solution.py",
                        cand.model_new))
        sources += [(f"kernels/{rel}", src) for rel, src in cand.kernels]
    if isinstance(sv, StoredFailure):
        return TaskRow(task_id=sv.task_id, name=sv.task_name, level=sv.level, status=f"not judged: {sv.category}",
                       correct=False, judged=False, solution=solution_label(origin), runtime_ms=None, eager_ms=None,
                       compile_ms=None, speedup_vs_eager=None, speedup_vs_compile=None, reward=None,
                       reward_reason=f"the judge could not judge this pair ({sv.category})", build_s=None,
                       judge_s=None, message=sv.message, notes=[], candidate_hash=sv.candidate_hash, origin=origin,
                       sources=sources)
    v = sv.verdict
    sol = v.speed_of_light
    sol_fields = {} if sol is None else dict(
        sol_ms=sol.sol_ms, sol_bound=sol.bound, sol_gpu=sol.gpu_model, sol_note=sol.reason,
        flops=float(sol.work.flops), dram_bytes=float(sol.work.dram_bytes), sol_share=v.sol_share,
        eager_sol_share=v.eager_sol_share, compile_sol_share=v.compile_sol_share)
    r = reward_of(v, reward)
    return TaskRow(**sol_fields, task_id=sv.task_id, name=sv.task_name, level=sv.level,
                   status="correct" if v.correct else (v.failure.category.value if v.failure else "incorrect"),
                   correct=v.correct, solution=solution_label(origin), runtime_ms=v.runtime_ms, eager_ms=v.eager_ms,
                   compile_ms=v.compile_ms, speedup_vs_eager=v.speedup_vs_eager,
                   speedup_vs_compile=v.speedup_vs_compile, reward=r.value,
                   reward_reason=r.reason, build_s=v.build_s, judge_s=v.judge_s,
                   message=v.failure.message if v.failure else "", notes=v.task_warnings + v.notes,
                   candidate_hash=sv.candidate_hash, origin=origin, sources=sources)


# ------------------------------------------------------------------------------------------ plots
def _svg_uri(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode()


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "cuda-agent"  # identical input, identical file
    import matplotlib.pyplot as plt

    return plt


def speedup_histogram(views: list[RunView]) -> str:
    """Distribution of speed-ups of correct tasks (log scale), vs eager and vs torch.compile."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, attr, title in ((axes[0], "speedup_vs_eager", "vs eager"), (axes[1], "speedup_vs_compile", "vs torch.compile")):
        series = [(view.info.name, [getattr(r, attr) for r in view.rows if getattr(r, attr)]) for view in views]
        values = [x for _, xs in series for x in xs]
        if values:
            # Edges a little beyond the extremes: rounding must not drop the largest value.
            lo, hi = min(min(values), 0.5) / 1.05, max(max(values), 2.0) * 1.05
            bins = [2 ** (math.log2(lo) + i * (math.log2(hi) - math.log2(lo)) / 20) for i in range(21)]
            ax.hist([xs for _, xs in series], bins=bins, label=[n for n, _ in series], alpha=0.85)
            ax.set_xscale("log", base=2)
        else:
            ax.text(0.5, 0.5, "no correct task with this baseline", ha="center", va="center", transform=ax.transAxes)
        ax.axvline(1.0, color="black", lw=1, ls="--")
        ax.set_title(f"speed-up {title} (correct tasks)")
        ax.set_xlabel("speed-up (x, log scale)")
    axes[0].set_ylabel("tasks")
    from matplotlib.ticker import MaxNLocator

    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of tasks: no 0.5 ticks
    if len(views) > 1:
        axes[0].legend(fontsize=8)
    return _svg_uri(fig)


def fast_p_curve(views: list[RunView]) -> str:
    """fast_p as a function of p: the fraction of tasks correct and more than p times faster than eager."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ps = [i / 20 for i in range(0, 81)]
    for view in views:
        n = view.table.overall.n or 1
        speeds = [r.speedup_vs_eager or 0 for r in view.rows if r.correct]
        ax.plot(ps, [sum(s > p for s in speeds) / n for p in ps], label=view.info.name)
    for p in FAST_P:
        ax.axvline(p, color="grey", lw=0.5, ls=":")
    ax.set_xlabel("p (speed-up vs eager)")
    ax.set_ylabel("fast_p")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    return _svg_uri(fig)


def compare_scatter(a: RunView, b: RunView) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    rows_b = {(r.name, r.solution): r for r in b.rows}
    pairs = [(r.speedup_vs_eager, rows_b[(r.name, r.solution)].speedup_vs_eager) for r in a.rows
             if (r.name, r.solution) in rows_b and r.speedup_vs_eager and rows_b[(r.name, r.solution)].speedup_vs_eager]
    if pairs:
        xs, ys = zip(*pairs)
        ax.scatter(xs, ys, s=18)
        lo, hi = min(xs + ys + (1.0,)) / 1.2, max(xs + ys + (1.0,)) * 1.2
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
    else:
        ax.text(0.5, 0.5, "no task correct in both runs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(f"{a.info.name}: speed-up vs eager")
    ax.set_ylabel(f"{b.info.name}: speed-up vs eager")
    return _svg_uri(fig)


def roofline(views: list[RunView]) -> str | None:
    """Arithmetic intensity (the task's least FLOPs per least DRAM byte) against the throughput a
    run achieved on that least work, one point per task for the candidate (correct ones) and for
    eager, under the judging GPU's roofs. None when no row has a bound (the CPU backend)."""
    from cuda_agent.hardware.peaks import GPU_PEAKS
    from cuda_agent.hardware.sol import matmul_rate, vector_rate

    rows = [(view, r) for view in views for r in view.rows if r.sol_ms and r.flops and r.dram_bytes]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    intensities = [r.flops / r.dram_bytes for _, r in rows]
    lo, hi = min(intensities + [0.1]) / 2, max(intensities + [100.0]) * 2
    for model in sorted({r.sol_gpu for _, r in rows if r.sol_gpu}):
        peaks = next(p for p in GPU_PEAKS if p.model == model)
        bw = peaks.dram_gbs * 1e9
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        for rate, label, style in ((matmul_rate(peaks, "fp32"), "fp32 GEMM roof", "-"),
                                   (vector_rate(peaks, "fp32"), "fp32 CUDA-core roof", ":")):
            ax.plot(xs, [min(bw * x, rate) / 1e12 for x in xs], color="black", lw=1, ls=style,
                    label=f"{model}: {label}")
    markers = ["o", "s", "^", "D"]
    for i, view in enumerate(views):
        mine = [r for v, r in rows if v is view]
        tag = f"{view.info.name}: " if len(views) > 1 else ""
        for attr, label, color in (("runtime_ms", "candidate", f"C{2 * i}"), ("eager_ms", "eager", f"C{2 * i + 1}")):
            pts = [(r.flops / r.dram_bytes, r.flops / (getattr(r, attr) * 1e-3) / 1e12) for r in mine
                   if getattr(r, attr) and (r.correct or attr == "eager_ms")]
            if pts:
                xs, ys = zip(*pts)
                ax.scatter(xs, ys, s=22, marker=markers[i % len(markers)], color=color, label=tag + label,
                           alpha=0.85, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (least FLOPs / least DRAM bytes)")
    ax.set_ylabel("achieved TFLOP/s on the least work")
    ax.set_title("roofline (one point per task)")
    ax.legend(fontsize=7)
    return _svg_uri(fig)


# ----------------------------------------------------------------------------------------- render
def compare_rows(a: RunView, b: RunView) -> list[CompareRow]:
    """One row per (task name, solution name) found in either run."""
    rows_a = {(r.name, r.solution): r for r in a.rows}
    rows_b = {(r.name, r.solution): r for r in b.rows}
    keys = list(rows_a) + [k for k in rows_b if k not in rows_a]
    out = []
    for k in keys:
        ra, rb = rows_a.get(k), rows_b.get(k)
        ratio = None
        if ra and rb and ra.speedup_vs_eager and rb.speedup_vs_eager:
            ratio = rb.speedup_vs_eager / ra.speedup_vs_eager
        out.append(CompareRow(name=k[0], solution=k[1], level=(ra or rb).level, a=ra, b=rb, ratio=ratio))
    out.sort(key=lambda r: (r.level is None, r.level or 0, _natural(r.name), r.solution))
    return out


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def render_report(db: ResultsDB, runs: list[str], *, count_missing: bool = False) -> str:
    import jinja2

    if not 1 <= len(runs) <= 2:
        raise ValueError("a report covers one run, or two to compare")
    views = [load_run(db, r, count_missing=count_missing) for r in runs]
    env = jinja2.Environment(loader=jinja2.PackageLoader("cuda_agent", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)
    env.filters.update(ms=fmt_ms, x=fmt_x, pct=fmt_pct, s=_fmt_s, g4=lambda x: "-" if x is None else f"{x:.4g}",
                       date=lambda t: time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)))
    counted = ("tasks without a solution count as failures" if count_missing
               else "tasks without a solution are not counted")
    return env.get_template(TEMPLATE).render(
        views=views, compare=compare_rows(views[0], views[1]) if len(views) == 2 else None,
        plots={"hist": speedup_histogram(views), "fastp": fast_p_curve(views),
               "scatter": compare_scatter(views[0], views[1]) if len(views) == 2 else None,
               "roofline": roofline(views)},
        fast_p=[fast_p_key(p) for p in FAST_P], footnote=f"{COUNTING_NOTE} Rates are over the pairs counted; {counted}. "
        f"{GEOMEAN_NOTE}; 'correct only' is the geomean over correct tasks alone. fast_p: correct and "
        "speed-up vs eager > p (KernelBench). of SOL: runtime as a share of the task's speed-of-light on the "
        "judging GPU (its least DRAM traffic and FLOPs at the GPU's peaks), geomean over the correct pairs with "
        "a bound; eager on the same pairs in brackets.",
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"), db=str(db.path),
        settings={v.info.name: json.dumps({"judge": v.info.info.get("config", {}),
                                           "reward": v.info.reward().model_dump(mode="json")}, indent=1)
                  for v in views})


def write_report(db_path: Path, runs: list[str], out: Path, *, count_missing: bool = False) -> Path:
    with ResultsDB(db_path) as db:
        text = render_report(db, runs, count_missing=count_missing)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out
