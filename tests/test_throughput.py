"""benchmarks/throughput.py's step-latency arithmetic (cuda_agent.measure.steps) (the judge itself is
exercised by the benchmark on the device, and by the pool's and the service's tests here)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def throughput():
    from cuda_agent.measure import steps

    return steps


def test_percentile_interpolates_between_order_statistics(throughput):
    xs = [4.0, 1.0, 3.0, 2.0, 5.0]
    assert throughput.percentile(xs, 50) == 3.0
    assert throughput.percentile(xs, 0) == 1.0 and throughput.percentile(xs, 100) == 5.0
    assert throughput.percentile(xs, 95) == pytest.approx(4.8)
    assert throughput.percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        throughput.percentile([], 50)
    with pytest.raises(ValueError):
        throughput.percentile(xs, 101)


def test_step_summary_splits_a_step_into_queue_judge_and_transport(throughput):
    S = throughput.StepRecord
    records = [S(0, i, 2.0, {"pool_queue": 1.0, "build": 0.2, "start": 0.3, "calls": 0.4}, True) for i in range(3)]
    records.append(S(1, 0, 6.0, {"pool_queue": 5.0, "build": 0.2, "start": 0.3, "calls": 0.4,
                                 "calls:device_wait": 0.2}, False))
    s = throughput.step_summary(records)
    assert s["steps"] == 4 and s["correct"] == 3
    assert s["p50_s"] == 2.0 and s["max_s"] == 6.0 and s["p95_s"] == pytest.approx(5.4)
    assert s["mean_s"] == 3.0 and s["mean_phase_s"]["pool_queue"] == 2.0
    assert s["queue_share"] == pytest.approx(2.0 / 3.0)
    assert s["mean_unaccounted_s"] == pytest.approx(3.0 - 2.0 - 0.9)
    assert s["mean_device_wait_s"] == pytest.approx(0.05)  # inside calls: not counted twice


def test_arguments_are_checked(throughput):
    with pytest.raises(SystemExit):
        throughput.throughput_args(["--agents", "-1"])
    with pytest.raises(SystemExit):
        throughput.throughput_args(["--judge-url", "http://127.0.0.1:1", "--transport", "ray"])
    args = throughput.throughput_args(["--agents", "8", "--steps", "10", "--warm"])
    assert (args.agents, args.steps, args.warm, args.transport) == (8, 10, True, "local")
