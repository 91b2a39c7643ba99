"""The `cuda-agent fidelity` command (registered by cuda_agent.cli)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from .rules import NEAR_FACTOR

_GLOB = "GLOB"


def fidelity_cmd(
    corpus: Annotated[Path, typer.Option("--corpus", help="the KernelBench leaderboard's docs/assets folder "
                                                          "(or a checkout of anneouyang/KernelBenchLeaderboard)")],
    out: Annotated[Path, typer.Option("--out", help="output folder: verdicts.jsonl, fidelity.json, fidelity.md "
                                                    "(rerun with the same one to go on)")],
    sample: Annotated[Optional[int], typer.Option("--sample", min=1, help="judge N records, stratified by "
                                                                          "level (default: all)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of the sample")] = 0,
    device: Annotated[str, typer.Option("--device", help="cuda or cpu")] = "cuda",
    policy: Annotated[str, typer.Option("--policy", help="strict or lenient (published solutions use torch "
                                                         "glue)")] = "lenient",
    compile_mode: Annotated[str, typer.Option("--compile-mode", help="torch.compile baseline: default, "
                                              "reduce-overhead, max-autotune, max-autotune-no-cudagraphs, or "
                                              "none")] = "none",
    set_: Annotated[Optional[list[str]], typer.Option("-c", "--set", help="override one JudgeConfig field, "
                                                      "e.g. -c n_timed=50")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="judge workers (cuda: one per "
                                                   "visible GPU; cpu: default 1)")] = None,
    compile_workers: Annotated[Optional[int], typer.Option("--compile-workers", min=0, help="compile workers "
                                                           "(default: the pool's)")] = None,
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", help="seconds one record may hold a "
                                                        "judge worker")] = None,
    explain: Annotated[Optional[Path], typer.Option("--explain", help="JSON: record key -> {class, reason} for "
                                                    "records a person reviewed (benchmarks/fidelity_reviewed.json)"
                                                    )] = None,
    near_factor: Annotated[float, typer.Option("--near-factor", min=1.0, help="a mismatch within this factor of "
                                               "the bound is a tolerance question")] = NEAR_FACTOR,
    time_budget: Annotated[Optional[float], typer.Option("--time-budget", help="minutes: submit nothing new "
                                                         "after this, withdraw what waits; a rerun goes on from "
                                                         "there")] = None,
    report_only: Annotated[bool, typer.Option("--report-only", metavar="", help="judge nothing: report what OUT "
                                                                                "holds")] = False,
    compare: Annotated[Optional[Path], typer.Option("--compare", metavar="DIR", help="another output folder (the "
                                                    "same records judged again elsewhere): which verdicts differ "
                                                    "and how the runtimes agree")] = None,
    rejudge: Annotated[Optional[list[str]], typer.Option("--rejudge", metavar=_GLOB, help="judge again the "
                                                         "records whose key matches (e.g. 'l3_p15_*'; "
                                                         "repeatable)")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", metavar=_GLOB, help="of the sample, judge and "
                                                      "report only the records whose key matches "
                                                      "(repeatable)")] = None,
    prescreen: Annotated[bool, typer.Option("--prescreen", metavar="", help="no device: the judge's static "
                                            "checks over the records, to OUT/prescreen.json and prescreen.md"
                                            )] = False,
    ncu_sample: Annotated[int, typer.Option("--ncu-sample", min=0, help="profile K correct solutions under ncu "
                                                                        "(cuda)")] = 0,
    ncu_forwards: Annotated[int, typer.Option("--ncu-forwards", min=1, help="profiled forwards per "
                                                                            "solution")] = 3,
    ncu_timeout: Annotated[float, typer.Option("--ncu-timeout", help="limit on one ncu run, and on one build "
                                                                     "ahead of it (s)")] = 900.0,
    ncu_build_parallel: Annotated[Optional[int], typer.Option("--ncu-build-parallel", min=1, help="sampled "
                                                              "solutions built at once before the profiled "
                                                              "runs (default: half the cores, at most 8)"
                                                              )] = None,
) -> None:
    """Judge the KernelBench leaderboard's published kernels and say how far the judge agrees with it.

    Every record (or a sample stratified by level) is judged through the pool with its reference,
    resumably (OUT/verdicts.jsonl); every rejection is classified (solution_error, hack,
    policy_difference, judge_problem) by explicit rules, or by a person's review (--explain); the
    judge's speed-ups are ranked against the leaderboard's; --ncu-sample sets Nsight Compute's
    kernel time beside the judge's runtime. Writes OUT/fidelity.json and OUT/fidelity.md. Exit 2
    on a usage error (no corpus, an output folder judged with other settings), 3 when the judge
    could not run.
    """
    from .run import FidelityOptions, run

    opts = FidelityOptions(
        corpus=corpus, out=out, sample=sample, seed=seed, device=device, policy=policy, compile_mode=compile_mode,
        sets=list(set_ or []), workers=workers, compile_workers=compile_workers, time_limit=time_limit,
        explain=explain, near_factor=near_factor, time_budget=time_budget, report_only=report_only,
        compare=compare, rejudge=list(rejudge or []), only=list(only or []), prescreen=prescreen,
        ncu_sample=ncu_sample, ncu_forwards=ncu_forwards, ncu_timeout=ncu_timeout,
        ncu_build_parallel=ncu_build_parallel or max(1, min(8, (os.cpu_count() or 2) // 2)))
    raise typer.Exit(run(opts))
