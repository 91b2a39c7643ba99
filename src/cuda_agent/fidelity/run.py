"""One fidelity run, as `cuda-agent fidelity` starts it: the options, the judge's and the pool's
settings, and the steps (pair, sample, judge, profile, report) in order."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .corpus import RUN_FILE, VERDICTS_FILE, Corpus, Record, UsageError, check_run_settings, forget_results, \
    load_corpus, read_results, stratified_sample
from .judging import judge_records, settings_of
from .ncu import prebuild_ncu, run_ncu
from .report import build_report, compare_runs, markdown, print_report
from .rules import NEAR_FACTOR, load_explain, prescreen, prescreen_markdown

EXIT_USAGE, EXIT_JUDGE = 2, 3


@dataclass
class FidelityOptions:
    """What `cuda-agent fidelity` was asked (its options, one field each)."""

    corpus: Path
    out: Path
    sample: int | None = None
    seed: int = 0
    device: str = "cuda"
    policy: str = "lenient"
    compile_mode: str = "none"
    sets: list[str] = field(default_factory=list)
    workers: int | None = None
    compile_workers: int | None = None
    time_limit: float | None = None
    explain: Path | None = None
    near_factor: float = NEAR_FACTOR
    time_budget: float | None = None          # minutes
    report_only: bool = False
    compare: Path | None = None
    rejudge: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    prescreen: bool = False
    ncu_sample: int = 0
    ncu_forwards: int = 3
    ncu_timeout: float = 900.0
    ncu_build_parallel: int = field(default_factory=lambda: max(1, min(8, (os.cpu_count() or 2) // 2)))

    def check(self) -> None:
        """Values no run can use: a UsageError naming the option."""
        for name in ("sample", "workers", "ncu_forwards", "ncu_build_parallel"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
        if self.compile_workers is not None and self.compile_workers < 0:
            raise UsageError("--compile-workers must be 0 or more")
        if self.time_budget is not None and self.time_budget <= 0:
            raise UsageError("--time-budget must be positive (minutes)")
        if self.ncu_sample < 0:
            raise UsageError("--ncu-sample must be 0 or more")
        if self.near_factor < 1:
            raise UsageError("--near-factor must be at least 1")
        if self.device not in ("cuda", "cpu"):
            raise UsageError(f"--device {self.device}: choose cuda or cpu")
        if self.policy not in ("strict", "lenient"):
            raise UsageError(f"--policy {self.policy}: choose strict or lenient")


def judge_config(opts: FidelityOptions):
    from pydantic import ValidationError

    from cuda_agent.judge import JudgeConfig
    from cuda_agent.settings import SettingsError, apply_overrides

    try:
        values = apply_overrides({}, opts.sets, JudgeConfig)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    values.update(device=opts.device, policy=opts.policy, compile_mode=opts.compile_mode)
    try:
        return JudgeConfig(**values)
    except ValidationError as exc:
        raise UsageError(f"invalid judge settings: {exc}") from None


def pool_config(opts: FidelityOptions):
    from pydantic import ValidationError

    from cuda_agent.pool import PoolConfig

    try:
        return PoolConfig(judge_workers=opts.workers, compile_workers=opts.compile_workers,
                          time_limit_s=opts.time_limit)
    except ValidationError as exc:
        raise UsageError(f"invalid pool settings: {exc}") from None


def pick_ncu(records: list[Record], results: dict[str, dict], k: int, seed: int) -> list[Record]:
    correct = [r for r in records if (results.get(r.key) or {}).get("verdict")
               and results[r.key]["verdict"].get("correct")]
    return stratified_sample(correct, k, seed)


@dataclass
class _Plan:
    corpus: Corpus
    records: list[Record]
    explain: dict[str, dict]
    config: object
    settings: dict


def _plan(opts: FidelityOptions) -> _Plan:
    """Everything checked before anything is judged or written (a UsageError otherwise)."""
    opts.check()
    corpus = load_corpus(opts.corpus)
    if not corpus.records:
        raise UsageError(f"{corpus.root}: no record could be paired with a reference")
    explain = load_explain(opts.explain)
    config = judge_config(opts)
    settings = settings_of(config)
    records = stratified_sample(corpus.records, opts.sample, opts.seed)
    if opts.only:
        records = [r for r in records if any(fnmatch.fnmatchcase(r.key, g) for g in opts.only)]
        if not records:
            raise UsageError(f"--only {' '.join(opts.only)}: no record of the sample matches")
    if opts.compare is not None and not (opts.compare / VERDICTS_FILE).is_file():
        raise UsageError(f"--compare {opts.compare}: no {VERDICTS_FILE} there")
    if opts.report_only and not opts.prescreen:
        if not (opts.out / VERDICTS_FILE).is_file():
            raise UsageError(f"{opts.out / VERDICTS_FILE}: nothing judged yet")
        try:  # the report names the settings the verdicts were judged with, not this command's
            settings = json.loads((opts.out / RUN_FILE).read_text())
        except (OSError, ValueError):
            pass
    elif not opts.prescreen:
        check_run_settings(opts.out, settings)
    unknown = sorted(set(explain) - {r.key for r in corpus.records})
    if unknown:
        print(f"--explain names {len(unknown)} keys not in the corpus: {', '.join(unknown[:5])}", file=sys.stderr)
    return _Plan(corpus, records, explain, config, settings)


def _profile(opts: FidelityOptions, records: list[Record], results: dict[str, dict]):
    """The --ncu-sample: the profiled records' rows and the note the report prints about them."""
    if opts.device != "cuda":
        return None, "ncu sample skipped: Nsight Compute profiles CUDA kernels (--device cuda)"
    if not shutil.which("ncu"):
        return None, "ncu sample skipped: ncu is not on PATH"
    by_key = {r.key: r for r in records}
    picked = pick_ncu(list(by_key.values()), results, opts.ncu_sample, opts.seed)
    t0 = time.monotonic()
    failed = prebuild_ncu(picked, opts.out, opts.ncu_build_parallel, opts.ncu_timeout)
    print(f"ncu sample: {len(picked)} solutions built ahead in {time.monotonic() - t0:.0f} s "
          f"({len(failed)} failed), {opts.ncu_build_parallel} at once", file=sys.stderr)
    ncu = [run_ncu(r, results[r.key], opts.out, opts.ncu_forwards, opts.ncu_timeout) for r in picked]
    return ncu, (f"{len(ncu)} correct solutions profiled (clock control off, L2 flushed before each "
                 f"forward, {opts.ncu_forwards} forwards each)")


def run(opts: FidelityOptions) -> int:
    """Judge (what OUT lacks), profile, report; the exit code: 0 the report was written, 2 usage
    error, 3 the judge could not run."""
    try:
        plan = _plan(opts)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for line in plan.corpus.conflicts:
        print(f"mapping conflict: {line}", file=sys.stderr)
    if opts.prescreen:
        pre = prescreen(plan.records, opts.policy, opts.near_factor)
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "prescreen.json").write_text(json.dumps(pre, indent=1))
        (opts.out / "prescreen.md").write_text(prescreen_markdown(pre))
        print(prescreen_markdown(pre))
        return 0
    if opts.rejudge and not opts.report_only:
        dropped = forget_results(opts.out, opts.rejudge)
        print(f"--rejudge: {len(dropped)} verdicts taken out ({', '.join(dropped[:8])}"
              f"{', ...' if len(dropped) > 8 else ''})")
    results = read_results(opts.out)
    if not opts.report_only:
        from cuda_agent.judge import JudgeError
        from cuda_agent.pool import PoolError

        try:
            budget = None if opts.time_budget is None else 60.0 * opts.time_budget
            judge_records(plan.records, opts.out, plan.config, pool_config(opts), results, budget)
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except (JudgeError, PoolError) as exc:
            print(f"error: the judge could not run: {exc}", file=sys.stderr)
            return EXIT_JUDGE
    ncu, ncu_note = _profile(opts, plan.records, results) if opts.ncu_sample else (None, None)
    report = build_report(plan.corpus, plan.records, results, plan.explain, plan.settings, opts.near_factor,
                          ncu, ncu_note)
    if opts.compare is not None:
        keys = {r.key for r in plan.records}
        report["compare"] = {"folder": str(opts.compare), **compare_runs(
            {k: e for k, e in results.items() if k in keys},
            {k: e for k, e in read_results(opts.compare).items() if k in keys})}
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "fidelity.json").write_text(json.dumps(report, indent=1))
    (opts.out / "fidelity.md").write_text(markdown(report))
    print_report(report)
    print(f"wrote {opts.out / 'fidelity.json'} and {opts.out / 'fidelity.md'}", file=sys.stderr)
    return 0
