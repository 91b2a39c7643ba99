"""The timing decisions: which clock a verdict's runtime comes from, on a busy host too."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cuda_agent.judge.timing import reconcile

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "timing_check.py"


def test_protocol_cost_measured_next_to_each_call_keeps_an_honest_fast_claim():
    # A 0.012 ms kernel on a loaded host: every request takes ~0.3 ms longer than when the null model
    # was measured (0.8 ms), the call's own round trip included. Without the neighbouring round trip
    # the judge's clock would replace the claim; with it the claim stands.
    inside = [0.012] * 20
    outside = [0.82 + 0.3 + 0.012] * 20
    stale = reconcile(inside, outside, overhead_ms=0.82, rel_slack=0.25, abs_slack_ms=0.2)
    assert not stale.believed
    fresh = reconcile(inside, outside, overhead_ms=0.82, rel_slack=0.25, abs_slack_ms=0.2,
                      protocol_ms=[0.45] * 20, baseline_protocol_ms=0.15, source="gated")
    assert fresh.believed and fresh.timing.median_ms == 0.012 and fresh.timing.source == "gated"


def test_a_slowed_round_trip_buys_at_most_the_cap():
    # A candidate that stretches the untimed request by 50 ms to excuse 50 ms of unclaimed work.
    inside = [0.01] * 10
    outside = [0.8 + 50.0] * 10
    r = reconcile(inside, outside, overhead_ms=0.8, rel_slack=0.25, abs_slack_ms=0.2,
                  protocol_ms=[50.2] * 10, baseline_protocol_ms=0.2)
    assert not r.believed and r.gross_lie


def test_bursts_of_load_do_not_replace_an_honest_claim():
    # Three quarters of the calls run undisturbed; a burst stretches the rest by milliseconds.
    inside = [1.0] * 20
    outside = [1.3] * 15 + [9.0] * 5
    r = reconcile(inside, outside, overhead_ms=0.25, rel_slack=0.25, abs_slack_ms=0.2)
    assert r.believed and r.timing.median_ms == 1.0


def test_a_claim_below_every_call_of_the_judges_clock_is_still_refused():
    r = reconcile([0.1] * 20, [2.3] * 20, overhead_ms=0.3, rel_slack=0.25, abs_slack_ms=0.2,
                  protocol_ms=[0.2] * 20, baseline_protocol_ms=0.2)
    assert not r.believed and r.gross_lie and r.timing.source == "outside"


def test_ncu_csv_is_summed_per_forward():
    spec = importlib.util.spec_from_file_location("timing_check", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = "\n".join([
        "==PROF== Connected to process 1234",
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
        '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1234","python","127.0.0.1","sgemm_tiled","1","7","(32, 32, 1)","(64, 64, 1)","0","9.0",'
        '"Command line profiler metrics","gpu__time_duration.sum","usecond","1,860.51"',
        '"1","1234","python","127.0.0.1","sgemm_tiled","1","7","(32, 32, 1)","(64, 64, 1)","0","9.0",'
        '"Command line profiler metrics","gpu__time_duration.sum","msecond","1.86"',
        '"2","1234","python","127.0.0.1","scale_shift","1","7","(256, 1, 1)","(2112, 1, 1)","0","9.0",'
        '"Command line profiler metrics","gpu__time_duration.sum","nsecond","9600"',
    ])
    assert abs(mod.ncu_ms_per_forward(text, calls=2) - (1.86051 + 1.86 + 0.0096) / 2) < 1e-9
    assert mod.ncu_ms_per_forward("==ERROR== no kernels were profiled", calls=5) is None


def test_a_single_threaded_claim_cannot_fall_below_its_own_threads_cpu_time():
    # On 2 cores a single-threaded call of 3.3 ms uses 3.3 ms of CPU; the process's CPU time over the
    # cores bounds it at 1.65 ms, so a clock slowed to 0.42x (1.4 ms claimed) passed. Its busiest
    # thread's 3.3 ms does not divide by the cores.
    inside = [1.4] * 20
    outside = [0.5 + 3.3] * 20
    loose = reconcile(inside, outside, overhead_ms=0.5, rel_slack=0.25, abs_slack_ms=0.3, cores=2, source="cpu")
    assert loose.believed
    tight = reconcile(inside, outside, overhead_ms=0.5, rel_slack=0.25, abs_slack_ms=0.3, cores=2, source="cpu",
                      busiest_ms=[0.5 + 3.3] * 20)
    assert not tight.believed and tight.timing.median_ms == pytest.approx(3.3)
    # an honest parallel call: 2 threads of 3.3 ms CPU each in 3.4 ms of wall time
    honest = reconcile([3.4] * 20, [0.5 + 6.6] * 20, overhead_ms=0.5, rel_slack=0.25, abs_slack_ms=0.3, cores=2,
                       source="cpu", busiest_ms=[0.5 + 3.3] * 20)
    assert honest.believed and honest.timing.median_ms == 3.4
