"""Benchmark metrics as pure functions of per-pair outcomes: CUDA Agent's Table 1 and KernelBench's fast_p.

What is counted: one outcome per (task, candidate) pair of a run. A task with two candidates (two
solutions of the same reference source) counts twice in the per-pair rows. A pair the judge could
not judge (its baseline or reference failed, or the pool broke under it) counts as not correct and
enters the geomeans at 1.0, like a failed candidate, and is also counted apart (`n_judge_errors`):
it is a failure of the task or of the judge, not of the candidate. With `count_missing`, a task
without a solution is one more failed outcome.

When some task has more than one outcome, a second table counts each task once by its best
candidate (`best_of`): correct when any candidate is, with the largest speed-up vs eager among its
correct candidates (and that candidate's speed-up vs torch.compile). When every task has one
outcome the two tables are the same and `best_of` is None.

Per level and overall, over the outcomes counted:

* pass rate: correct / counted;
* beats-eager rate and beats-compile rate (the tables' "faster than" columns): correct and
  speed-up > 1 / counted (`beats`). Not the reward's "rewarded faster", which needs a margin
  (`cuda_agent.reward.rewarded_faster`);
* geometric-mean speed-up vs eager and vs torch.compile over *all* counted tasks, a task that
  failed (or has no solution) entering with speed-up 1.0: the reference implementation is what a
  user would run in its place. This keeps a model that is often wrong from scoring a high geomean
  on its few successes; the geomean over correct tasks alone is reported as well, named so;
* fast_p (KernelBench): correct and speed-up vs eager > p, over counted tasks, for
  p in {0, 0.5, 0.8, 1.0, 1.5, 2.0}; fast_0 equals the pass rate.

A speed-up is baseline time / candidate time (median of the timed calls). When there is no
torch.compile baseline (compile mode "none") the compile columns are None, not 0.

Share of speed-of-light (`cuda_agent.hardware.sol`): sol_ms / runtime_ms, 1.0 at the hardware's
limit. Per level, the geometric mean over the correct pairs whose task has a bound on the judging
GPU (none on the CPU backend), for the candidates and for eager on the same tasks: failures do not
enter, since a failed kernel has no runtime to place against the hardware.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

FAST_P = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
FAILURE_SPEEDUP = 1.0  # how a failed task enters the geomeans (see the module docstring)
GEOMEAN_NOTE = ("geomean speed-ups count every task; a failed task (or one without a solution, "
                "when counted) enters with speed-up 1.0, as if the reference ran in its place")
COUNTING_NOTE = ("Each (task, candidate) pair is one row and counts once; a pair the judge could not judge "
                 "(baseline, reference, judge or pool failure) counts as not correct and is listed apart. "
                 "'best of' rows count each task once, by its best candidate.")


class Outcome(BaseModel):
    """What the metrics need from one (task, candidate) pair."""

    model_config = ConfigDict(frozen=True)
    level: int | None
    correct: bool
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    has_compile_baseline: bool = False  # a torch.compile time existed for this task
    task: str | None = None             # the task (its id) the pair belongs to, for best-of; None: its own
    judge_error: bool = False           # the judge could not judge the pair (no verdict)
    sol_share: float | None = None      # sol_ms / runtime_ms of a correct candidate, where there is a bound
    eager_sol_share: float | None = None
    floor_share: float | None = None    # floor_ms / runtime_ms (hardware/sol.py's physical floor), any verdict

    @classmethod
    def of(cls, verdict, level: int | None, task: str | None = None) -> "Outcome":
        """From a `Verdict` (duck-typed: keeps this module free of judge imports)."""
        return cls(level=level, correct=bool(verdict.correct), speedup_vs_eager=verdict.speedup_vs_eager,
                   speedup_vs_compile=verdict.speedup_vs_compile,
                   has_compile_baseline=verdict.compile_ms is not None, task=task,
                   sol_share=getattr(verdict, "sol_share", None), eager_sol_share=getattr(verdict, "eager_sol_share", None),
                   floor_share=getattr(verdict, "floor_share", None))

    @classmethod
    def missing(cls, level: int | None, task: str | None = None) -> "Outcome":
        """A task with no solution, counted as a failure."""
        return cls(level=level, correct=False, task=task)

    @classmethod
    def unjudged(cls, level: int | None, task: str | None = None) -> "Outcome":
        """A pair the judge could not judge (a failed baseline, a broken reference, a broken pool)."""
        return cls(level=level, correct=False, task=task, judge_error=True)


class Metrics(BaseModel):
    """One row of Table 1 plus fast_p. Rates are fractions in [0, 1]."""

    model_config = ConfigDict(frozen=True)
    label: str
    n: int
    n_correct: int
    n_judge_errors: int = 0                           # counted in n as not correct; no verdict
    pass_rate: float
    beats_eager_rate: float
    beats_compile_rate: float | None
    geomean_speedup_vs_eager: float | None
    geomean_speedup_vs_compile: float | None
    geomean_speedup_vs_eager_correct: float | None    # over correct tasks only
    geomean_speedup_vs_compile_correct: float | None
    fast_p: dict[str, float]                          # "fast_0", "fast_0.5", ... -> fraction
    # geomean share of speed-of-light over correct pairs with a bound (n_sol of them), candidate and eager
    n_sol: int = 0
    geomean_sol_share: float | None = None
    geomean_eager_sol_share: float | None = None
    # the closest any pair came to the physical floor (largest floor_ms / runtime_ms; over the judge's
    # floor_margin the verdict failed): how much room honest kernels leave the check
    max_floor_share: float | None = None


class MetricsTable(BaseModel):
    model_config = ConfigDict(frozen=True)
    levels: list[Metrics]   # one per level, in level order ("level N", or "no level"); one outcome per pair
    overall: Metrics
    n_tasks: int = 0        # distinct tasks among the outcomes
    best_of_levels: list[Metrics] | None = None   # one outcome per task, its best candidate; None when
    best_of_overall: Metrics | None = None        # every task has one outcome (the same numbers)


def beats(speedup: float | None) -> bool:
    """The benchmark's threshold: any speed-up above 1.0 (the reward's is `1 + margin`)."""
    return speedup is not None and speedup > 1.0


def geomean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    if not xs or any(x <= 0 or not math.isfinite(x) for x in xs):
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def fast_p_key(p: float) -> str:
    return f"fast_{p:g}"


def metrics(outcomes: Sequence[Outcome], label: str = "overall") -> Metrics:
    n = len(outcomes)
    correct = [o for o in outcomes if o.correct]
    with_compile = any(o.has_compile_baseline for o in outcomes)

    def rate(count: int) -> float:
        return count / n if n else 0.0

    def speed(o: Outcome, attr: str) -> float:
        s = getattr(o, attr)
        return s if (o.correct and s is not None and s > 0) else FAILURE_SPEEDUP

    eager_ok = [o.speedup_vs_eager for o in correct if o.speedup_vs_eager]
    with_sol = [o for o in correct if o.sol_share and o.eager_sol_share]
    compile_ok = [o.speedup_vs_compile for o in correct if o.speedup_vs_compile]
    return Metrics(
        label=label, n=n, n_correct=len(correct), n_judge_errors=sum(o.judge_error for o in outcomes),
        pass_rate=rate(len(correct)),
        beats_eager_rate=rate(sum(beats(o.speedup_vs_eager) for o in correct)),
        beats_compile_rate=rate(sum(beats(o.speedup_vs_compile) for o in correct)) if with_compile else None,
        geomean_speedup_vs_eager=geomean(speed(o, "speedup_vs_eager") for o in outcomes) if n else None,
        geomean_speedup_vs_compile=(geomean(speed(o, "speedup_vs_compile") for o in outcomes)
                                    if n and with_compile else None),
        geomean_speedup_vs_eager_correct=geomean(eager_ok),
        geomean_speedup_vs_compile_correct=geomean(compile_ok) if with_compile else None,
        fast_p={fast_p_key(p): rate(sum(o.correct and (o.speedup_vs_eager or 0) > p for o in outcomes))
                for p in FAST_P},
        n_sol=len(with_sol), geomean_sol_share=geomean(o.sol_share for o in with_sol),
        geomean_eager_sol_share=geomean(o.eager_sol_share for o in with_sol),
        max_floor_share=max((o.floor_share for o in outcomes if o.floor_share is not None), default=None),
    )


def level_label(level: int | None) -> str:
    return f"level {level}" if level is not None else "no level"


def _by_level(outcomes: Sequence[Outcome]) -> tuple[list[Metrics], Metrics]:
    levels = sorted({o.level for o in outcomes}, key=lambda lv: (lv is None, lv or 0))
    return ([metrics([o for o in outcomes if o.level == lv], level_label(lv)) for lv in levels],
            metrics(outcomes, "overall"))


def best_of(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """One outcome per task (outcomes with `task` None stay apart): its correct candidate with the
    largest speed-up vs eager; with none correct, a failure (a judge error only when no candidate of
    the task was judged at all)."""
    groups: dict[object, list[Outcome]] = {}
    for i, o in enumerate(outcomes):
        groups.setdefault(o.task if o.task is not None else ("own", i), []).append(o)
    out = []
    for group in groups.values():
        correct = [o for o in group if o.correct]
        if correct:
            best = max(correct, key=lambda o: o.speedup_vs_eager or 0.0)
        else:
            best = Outcome(level=group[0].level, correct=False, task=group[0].task,
                           judge_error=all(o.judge_error for o in group))
        out.append(best.model_copy(update={"has_compile_baseline": any(o.has_compile_baseline for o in group)}))
    return out


def metrics_table(outcomes: Sequence[Outcome]) -> MetricsTable:
    """Table 1 per pair: one row per level (in order; tasks without a level last) and the overall
    row; and the same per task, best candidate, when some task has several outcomes."""
    levels, overall = _by_level(outcomes)
    best = best_of(outcomes)
    best_levels, best_overall = _by_level(best) if len(best) < len(outcomes) else (None, None)
    return MetricsTable(levels=levels, overall=overall, n_tasks=len(best), best_of_levels=best_levels,
                        best_of_overall=best_overall)
