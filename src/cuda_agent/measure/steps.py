"""The arithmetic of the judge-step benchmarks (benchmarks/judge_step.py, throughput.py): how a
cold step makes a source new, and the step-latency summary of many agents sharing one judge."""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

PHASES = ("pool_queue", "prebuild", "build", "baseline", "start", "calls")

# First triple-quoted string assigned to a name that looks like C++/CUDA source, e.g.
# `cuda_source = """`, `cpp_sources = r'''`, `relu_kernel_src = """`. Group 1 ends right after the
# opening quotes, where the uuid comment goes.
_CXX_STRING = re.compile(
    r"""(^[ \t]*[A-Za-z_]\w*\s*(?::[^=\n]+)?=\s*[rRuUfF]{0,2}(?:\"\"\"|'''))""",
    re.MULTILINE,
)
_CXX_NAME = re.compile(r"(?i)cpp|cuda|cxx|cu_|_cu\b|kernel|source|src")


def cold_variant(candidate, tag: str, one_folder: bool = True, bindings: bool = True):
    """A copy of `candidate` whose C++/CUDA sources differ by a comment; None if that is not possible.
    `one_folder`: a workspace keeps one origin (one agent editing its workspace, so ninja rebuilds
    only what changed); otherwise each copy is its own workspace (many rollouts). `bindings=False`:
    a workspace's kernels/*_binding.cpp stay as they were (an edit of the kernels alone)."""
    from cuda_agent.candidate import Candidate

    if candidate.kind == "workspace":
        edited = [rel for rel, _ in candidate.kernels if bindings or not rel.endswith("_binding.cpp")]
        if not edited:
            return None
        kernels = {rel: f"{src}\n// cold run {tag}\n" if rel in edited else src for rel, src in candidate.kernels}
        # One origin for every cold run: like an agent editing its workspace in place, ninja's
        # persistent build folder keeps the objects of unchanged files (the fixed binding.cpp).
        return Candidate.from_files(candidate.model_new, kernels,
                                    origin=f"{candidate.origin} (cold)" if one_folder else f"{candidate.origin} ({tag})")
    if not bindings:
        return None  # one module: its sources and its binding are one file
    source = candidate.model_new
    for match in _CXX_STRING.finditer(source):
        target = match.group(1).split("=", 1)[0]
        if _CXX_NAME.search(target):
            end = match.end(1)
            new = f"{source[:end]}// cold run {tag}\n{source[end:]}"
            if not new.endswith("\n"):
                new += "\n"
            new += f"# {tag}\n"
            return Candidate.from_source(new, origin=f"{candidate.origin} (cold {tag})")
    return None


def throughput_args(argv=None, doc: str | None = None) -> argparse.Namespace:
    """The arguments of benchmarks/throughput.py (`doc`: its description), checked."""
    p = argparse.ArgumentParser(prog="benchmarks/throughput.py", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--n", type=int, default=200, help="candidates measured (default 200)")
    p.add_argument("--tasks", nargs="*", help="suite task names (default: every level-1 task with a solution)")
    p.add_argument("--workers", type=int, help="judge workers (cuda: default one per GPU; cpu: default 1)")
    p.add_argument("--judges-per-gpu", type=int, default=1,
                   help="cuda: judge workers per GPU, taking turns for the timed calls (default 1)")
    p.add_argument("--compile-workers", type=int, help="compile workers (default: the pool's default)")
    p.add_argument("--built-ahead", action="store_true",
                   help="build every candidate into the judge's cache before the clock starts (all cores), so "
                        "the figure is the judge side's alone: a GPU whose compiles run on other machines")
    p.add_argument("--agents", type=int, default=0, help="step-latency mode: this many agents share the judge")
    p.add_argument("--steps", type=int, default=5, help="step-latency mode: steps per agent (default 5)")
    p.add_argument("--warm", action="store_true", help="step-latency mode: the same source every step")
    p.add_argument("--transport", choices=("local", "ray"), default="local",
                   help="pool workers as local processes or as Ray actors (a local Ray instance)")
    p.add_argument("--judge-url", help="judge through a running `cuda-agent serve` instead of an in-process pool")
    p.add_argument("--out", type=Path, default=Path("runs/throughput.json"))
    p.add_argument("--cache-root", type=Path, help="cache folder to use (default: a fresh temporary one, removed)")
    p.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE",
                   help="JudgeConfig override, e.g. -c n_timed=20 (device and cache_dir are set here)")
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("--n must be at least 1")
    if args.agents < 0 or args.steps < 1:
        p.error("--agents must be at least 0 and --steps at least 1")
    if args.built_ahead and (args.judge_url or args.agents):
        p.error("--built-ahead needs the in-process pool (not --judge-url) and the throughput mode (not --agents)")
    if args.judge_url and args.transport != "local":
        p.error("--judge-url and --transport ray exclude each other (start the service with --ray instead)")
    return args


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between order statistics."""
    if not xs:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not in [0, 100]")
    ys = sorted(xs)
    pos = (len(ys) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


class StepRecord:
    """One agent step: its latency (submit to verdict) and the verdict's phases."""

    __slots__ = ("agent", "step", "latency_s", "phase_s", "correct")

    def __init__(self, agent: int, step: int, latency_s: float, phase_s: dict[str, float], correct: bool):
        self.agent, self.step, self.latency_s, self.phase_s, self.correct = agent, step, latency_s, phase_s, correct


def step_summary(records: list[StepRecord]) -> dict:
    """p50/p95/max step latency, and per step the mean seconds waiting in the queue, in the judge's
    phases and unaccounted for (transport: HTTP, scheduling, the verdict's way back)."""
    lat = [r.latency_s for r in records]
    phases = {k: mean([r.phase_s.get(k, 0.0) for r in records]) for k in PHASES}
    judged = sum(phases[k] for k in PHASES if k not in ("pool_queue", "prebuild"))
    return {"steps": len(records), "correct": sum(r.correct for r in records),
            "p50_s": percentile(lat, 50), "p95_s": percentile(lat, 95), "max_s": max(lat),
            "mean_s": mean(lat), "mean_phase_s": phases,
            # part of `calls`: waiting for a GPU other judges share (--judges-per-gpu), i.e. for
            # the timed calls of the steps ahead
            "mean_device_wait_s": mean([r.phase_s.get("calls:device_wait", 0.0) for r in records]),
            "queue_share": phases["pool_queue"] / mean(lat) if mean(lat) > 0 else 0.0,
            "mean_unaccounted_s": max(0.0, mean(lat) - phases["pool_queue"] - judged)}


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0
