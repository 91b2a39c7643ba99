"""Table 1 and fast_p as pure functions, checked against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from cuda_agent.metrics import FAST_P, Outcome, best_of, geomean, metrics, metrics_table


def ok(level, eager, compile_=None):
    return Outcome(level=level, correct=True, speedup_vs_eager=eager, speedup_vs_compile=compile_,
                   has_compile_baseline=compile_ is not None)


def failed(level, with_compile=True):
    return Outcome(level=level, correct=False, has_compile_baseline=with_compile)


OUTCOMES = [ok(1, 2.0, 1.5), ok(1, 0.5, 0.4), failed(1), ok(2, 4.0, 1.0)]


def test_table_per_level_and_overall():
    table = metrics_table(OUTCOMES)
    l1, l2 = table.levels
    assert (l1.label, l1.n, l1.n_correct) == ("level 1", 3, 2)
    assert l1.pass_rate == pytest.approx(2 / 3)
    assert l1.beats_eager_rate == pytest.approx(1 / 3)
    assert l1.beats_compile_rate == pytest.approx(1 / 3)
    # failures enter the geomean as 1.0: (2.0 * 0.5 * 1.0) ** (1/3) = 1.0
    assert l1.geomean_speedup_vs_eager == pytest.approx(1.0)
    assert l1.geomean_speedup_vs_compile == pytest.approx((1.5 * 0.4) ** (1 / 3))
    assert l1.geomean_speedup_vs_eager_correct == pytest.approx(1.0)
    assert l1.geomean_speedup_vs_compile_correct == pytest.approx(math.sqrt(0.6))
    # a speed-up of exactly 1.0 is not "faster"
    assert l2.beats_compile_rate == 0.0 and l2.beats_eager_rate == 1.0
    overall = table.overall
    assert overall.n == 4 and overall.pass_rate == 0.75
    assert overall.geomean_speedup_vs_eager == pytest.approx((2.0 * 0.5 * 1.0 * 4.0) ** 0.25)


def test_fast_p_follows_kernelbench():
    m = metrics(OUTCOMES)
    assert set(m.fast_p) == {f"fast_{p:g}" for p in FAST_P}
    assert m.fast_p["fast_0"] == m.pass_rate == 0.75          # correct at all
    assert m.fast_p["fast_0.5"] == 0.5                          # 2.0 and 4.0 (0.5 is not > 0.5)
    assert m.fast_p["fast_1"] == 0.5
    assert m.fast_p["fast_2"] == 0.25                           # only 4.0 (2.0 is not > 2.0)


def test_without_a_compile_baseline_the_compile_columns_are_absent():
    m = metrics([ok(1, 2.0), failed(1, with_compile=False)])
    assert m.beats_compile_rate is None and m.geomean_speedup_vs_compile is None
    assert m.geomean_speedup_vs_eager == pytest.approx(math.sqrt(2.0))


def test_missing_solutions_count_as_failures_when_asked():
    with_missing = metrics([ok(1, 2.0, 2.0), Outcome.missing(1)])
    assert with_missing.pass_rate == 0.5 and with_missing.geomean_speedup_vs_eager == pytest.approx(math.sqrt(2))


def test_tasks_without_a_level_come_last_and_empty_input_is_zero():
    table = metrics_table([ok(None, 1.5), ok(3, 1.2)])
    assert [m.label for m in table.levels] == ["level 3", "no level"]
    empty = metrics([])
    assert empty.n == 0 and empty.pass_rate == 0.0 and empty.geomean_speedup_vs_eager is None


def test_geomean_refuses_non_positive_values():
    assert geomean([4.0, 1.0]) == pytest.approx(2.0)
    assert geomean([]) is None and geomean([1.0, 0.0]) is None


def test_each_pair_counts_and_best_of_counts_each_task_once():
    """Task "a" has two candidates (one correct at 3.0x, one failed), task "b" one at 0.5x: per pair
    three outcomes, per task two, "a" by its best candidate."""
    pairs = [ok(1, 3.0, 2.0).model_copy(update={"task": "a"}), failed(1).model_copy(update={"task": "a"}),
             ok(1, 0.5, 0.5).model_copy(update={"task": "b"})]
    table = metrics_table(pairs)
    assert table.overall.n == 3 and table.overall.n_correct == 2 and table.n_tasks == 2
    best = table.best_of_overall
    assert (best.n, best.n_correct, best.pass_rate) == (2, 2, 1.0)
    assert best.geomean_speedup_vs_eager == pytest.approx(math.sqrt(3.0 * 0.5))
    assert best.geomean_speedup_vs_compile == pytest.approx(math.sqrt(2.0 * 0.5))
    assert [m.label for m in table.best_of_levels] == ["level 1"]
    # one outcome per task: the best-of table would repeat the per-pair one, so there is none
    single = metrics_table(OUTCOMES)
    assert single.best_of_overall is None and single.best_of_levels is None and single.n_tasks == 4


def test_a_pair_the_judge_could_not_judge_counts_as_not_correct_and_apart():
    outcomes = [ok(1, 4.0).model_copy(update={"task": "a"}), Outcome.unjudged(1, "b"),
                failed(1, with_compile=False).model_copy(update={"task": "c"})]
    m = metrics(outcomes)
    assert (m.n, m.n_correct, m.n_judge_errors) == (3, 1, 1)
    assert m.pass_rate == pytest.approx(1 / 3)
    assert m.geomean_speedup_vs_eager == pytest.approx(4.0 ** (1 / 3))     # enters at 1.0 like a failure
    # a task whose only pair was not judged stays a judge error in best-of; one judged elsewhere does not
    best = {o.task: o for o in best_of(
        [Outcome.unjudged(1, "b"), Outcome.unjudged(1, "d"), failed(1).model_copy(update={"task": "d"})])}
    assert best["b"].judge_error and not best["d"].judge_error and not best["d"].correct
