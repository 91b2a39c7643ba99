"""The timing decisions: which clock a verdict's runtime comes from, on a busy host too."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from cuda_agent.judge import clocks, timing
from cuda_agent.judge.timing import reconcile


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
    from cuda_agent.measure import gpu as mod

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


def test_gpu_clocks_are_sampled_from_nvidia_smi_while_a_block_runs(tmp_path, monkeypatch):
    from cuda_agent.measure import gpu as mod

    fake = tmp_path / "nvidia-smi"  # what `--format=csv,noheader,nounits -lms 50` prints, then waits
    fake.write_text("#!/bin/sh\necho '1980, 2619, 450.50, 60, 5000'\necho '[N/A], 2619, [N/A], 61, 5000'\n"
                    "echo '1755, 2619, 690.10, 71, 5010'\nsleep 1\necho '1800, 2619, 700.00, 72, 9100'\n"
                    "exec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with mod.GpuClocks() as clocks:
        time.sleep(2.0)
    assert clocks.summary() == {"samples": 3, "sm_mhz_median": 1800.0, "sm_mhz_min": 1755.0,
                                "mem_mhz_median": 2619.0, "power_w_max": 700.0, "temp_c_max": 72.0,
                                "used_mib_min": 5000.0, "used_mib_max": 9100.0}
    # the whole block: the first sample, then the 4 GB allocated about 1 s later (a 10 MiB step is
    # below the threshold); the block's last 1.5 s: only the sample in that window
    whole = clocks.memory_changes(10.0)
    assert [mib for _, mib in whole] == [5000.0, 9100.0]
    assert whole[0][0] > whole[1][0] >= 0.0  # seconds before the block's end
    assert [mib for _, mib in clocks.memory_changes(1.5)] == [9100.0]
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    with mod.GpuClocks() as nothing:
        pass
    assert nothing.summary() is None and nothing.memory_changes(1.0) == []


def test_timing_check_counts_calls_timed_past_their_end_marker():
    from cuda_agent.judge.verdict import CallRecord

    from cuda_agent.measure import gpu as mod

    calls = [CallRecord(index=i, role="timed", inside_ms=0.66 if i % 2 else 0.54, outside_ms=1.0, stream_ms=0.54,
                        run_delay_ms=0.03 if i == 1 else 0.0, lag_ms=0.12 if i % 2 else 0.01 * (i + 1))
             for i in range(4)]
    calls += [CallRecord(index=4 + k, role="check", inside_ms=2.0, outside_ms=2.5, stream_ms=0.5, kernel_ms=ms)
              for k, ms in enumerate((0.52, 0.51, 0.6))]
    assert mod.markers(calls) == {"stream_ms": 0.54, "past_end": "2/4", "kernel_ms": 0.52, "waited": "1/4",
                                  "lag_ms": 0.075}
    cpu = [CallRecord(index=0, role="timed", inside_ms=1.0, outside_ms=1.2)]  # no markers on the CPU backend
    assert mod.markers(cpu) == {"stream_ms": None, "past_end": None, "kernel_ms": None, "waited": None,
                                "lag_ms": None}


def test_a_cpu_call_timer_reports_no_marker_time():
    timer = timing.CallTimer("cpu")
    timer.start()
    assert timer.stop() >= 0.0 and timer.last_stream_ms is None and timer.method == "cpu"


def test_an_idle_marker_late_by_a_wait_for_a_core_is_not_side_stream_work():
    # A 17 us gated call on a loaded host (seen on the H200 beside 14 builds): the timing thread,
    # spinning in the synchronize, was preempted for 25 us, so the idle marker came 25 us past its
    # usual 10 us reaction, while the second marker right after found the thread running (10 us).
    # Read as side-stream work, the call's time doubled; the wait for a core explains the lag.
    late = dict(stream_ms=0.017, idle_ms=0.017 + 0.010 + 0.025, reaction_ms=0.010, now_ms=0.010)
    assert timing.device_busy_ms(**late, waited_ms=0.0) == pytest.approx(0.042)
    assert timing.device_busy_ms(**late, waited_ms=0.025) == 0.017
    # Work on another stream that outlives the end marker still counts, however long the thread says
    # it waited: the reaction taken off is capped (4 x 10 us + 50 us), as the second marker's is.
    side = dict(stream_ms=0.017, idle_ms=0.017 + 0.200 + 0.010, reaction_ms=0.010, now_ms=0.010)
    assert timing.device_busy_ms(**side, waited_ms=5.0) == pytest.approx(0.017 + 0.200 + 0.010 - 0.090)
    assert timing.device_busy_ms(**side, waited_ms=0.0) == pytest.approx(0.217)
    # No lag past the reaction: the end marker's time.
    assert timing.device_busy_ms(0.5, 0.51, 0.010, 0.012, 0.0) == 0.5


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="the kernel keeps no schedstat")
def test_the_timing_threads_wait_for_a_core_is_read_from_the_kernel():
    import subprocess
    import sys

    timer = timing.CallTimer("cpu")
    first = timer._run_delay_ms()
    # two spinning processes per core for 0.4 s: this thread, spinning too, waits for a core now and then
    cores = len(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 0.4\nwhile time.time() < end: pass"])
            for _ in range(2 * cores)]
    try:
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            sum(range(1000))
    finally:
        for h in hogs:
            h.wait()
    assert timer._run_delay_ms() > first >= 0.0 and timer._schedstat not in (None, -1)


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


# ---- the CPU backend's wall-clock bound: wall time less the waits for a core ------------------------------
# A serial chain of T = 20 ms relayed between 2 threads on 2 cores, its clock slowed to 1/5 (4 ms claimed):
# the process spends 20 ms of CPU time (20 / 2 cores = 10 ms), no thread more than 10 ms, the call 20 ms of
# wall time. Protocol: 1.0 ms of CPU, 1.8 ms of wall time (the null model's).
RELAY = dict(inside=[4.0] * 10, outside=[1.0 + 20.0] * 10, busiest=[1.0 + 10.0] * 10)
CPU_KW = dict(overhead_ms=1.0, rel_slack=0.25, abs_slack_ms=0.3, cores=2, source="cpu")


def test_serial_work_relayed_between_threads_is_caught_by_the_wall_clock_bound():
    cpu_only = reconcile(RELAY["inside"], RELAY["outside"], busiest_ms=RELAY["busiest"], **CPU_KW)
    assert not cpu_only.believed and not cpu_only.gross_lie   # the CPU-time bounds read half of it: 10 ms
    assert cpu_only.timing.median_ms == pytest.approx(10.0)
    walled = reconcile(RELAY["inside"], RELAY["outside"], busiest_ms=RELAY["busiest"], **CPU_KW,
                       wall_ms=[1.8 + 20.0] * 10, waited_ms=[0.3] * 10, wall_overhead_ms=1.8,
                       wall_steady=[True] * 10)
    assert not walled.believed and walled.gross_lie and walled.timing.source == "outside"
    assert walled.timing.median_ms == pytest.approx(19.7)


def test_the_wall_clock_bound_only_ever_raises_the_estimate():
    # no bound where the waits could not be read, and a wall time all waiting lowers nothing
    kw = dict(busiest_ms=RELAY["busiest"], **CPU_KW)
    base = reconcile(RELAY["inside"], RELAY["outside"], **kw)
    for waited in ([None] * 10, [21.8] * 10):
        r = reconcile(RELAY["inside"], RELAY["outside"], **kw, wall_ms=[0.5] * 10, waited_ms=waited,
                      wall_overhead_ms=1.8)
        assert r.timing.median_ms == base.timing.median_ms and r.gross_lie == base.gross_lie
    # a null model measured before the bound existed gives none
    old = reconcile(RELAY["inside"], RELAY["outside"], **kw, wall_ms=[21.8] * 10, waited_ms=[0.0] * 10,
                    wall_overhead_ms=None)
    assert old.timing.median_ms == base.timing.median_ms


def test_an_honest_parallel_kernel_on_a_loaded_host_is_believed():
    # Two threads of 8 ms each share 2 cores with another process: the call takes 15 ms in the process
    # (its claim, waits included), the protocol 1.8 ms plus 1.5 ms of waiting, and the kernel charged
    # the threads 14 ms of waits (on and off the critical path). The CPU clock reads 1.0 + 16 ms.
    honest = reconcile([15.0] * 10, [1.0 + 16.0] * 10, busiest_ms=[1.0 + 8.0] * 10, **CPU_KW,
                       wall_ms=[15.0 + 1.8 + 1.5] * 10, waited_ms=[14.0] * 10, wall_overhead_ms=1.8)
    assert honest.believed and honest.timing.median_ms == 15.0
    # a small single-threaded kernel: 1.4 ms claimed, its protocol stretched by 1.5 ms of waiting
    small = reconcile([1.4] * 10, [1.0 + 1.4] * 10, busiest_ms=[1.0 + 1.4] * 10, **CPU_KW,
                      wall_ms=[1.4 + 1.8 + 1.5] * 10, waited_ms=[1.6] * 10, wall_overhead_ms=1.8)
    assert small.believed and small.timing.median_ms == 1.4
    # unloaded: no waits, the wall time is the claim plus the protocol
    quiet = reconcile([1.4] * 10, [1.0 + 1.4] * 10, busiest_ms=[1.0 + 1.4] * 10, **CPU_KW,
                      wall_ms=[1.4 + 1.8] * 10, waited_ms=[0.0] * 10, wall_overhead_ms=1.8)
    assert quiet.believed


def test_waits_taken_off_are_capped_so_a_herd_of_woken_threads_buys_little():
    # The relay plus bursts of 64 threads woken together: ~1 ms more wall time, 60 ms of summed waits.
    args = (RELAY["inside"], RELAY["outside"])
    kw = dict(busiest_ms=RELAY["busiest"], **CPU_KW, wall_ms=[1.8 + 21.0] * 10, waited_ms=[60.0] * 10,
              wall_overhead_ms=1.8)
    r = reconcile(*args, **kw)
    assert not r.believed and r.gross_lie and r.timing.median_ms == pytest.approx(21.0 - 1.8)
    # the cap is the null model's protocol cost, and at least a millisecond
    tiny = reconcile(*args, **{**kw, "wall_ms": [0.2 + 21.0] * 10, "wall_overhead_ms": 0.2})
    assert tiny.timing.median_ms == pytest.approx(21.0 - timing.WAIT_ALLOWANCE_FLOOR_MS)


def test_a_call_that_lost_a_thread_replaces_the_claim_but_does_not_make_it_a_lie():
    args = (RELAY["inside"], RELAY["outside"])
    kw = dict(busiest_ms=RELAY["busiest"], **CPU_KW, wall_ms=[1.8 + 20.0] * 10, wall_overhead_ms=1.8)
    lost = reconcile(*args, **kw, waited_ms=[0.3] * 10, wall_steady=[False] * 10)
    assert not lost.believed and not lost.gross_lie and lost.timing.median_ms == pytest.approx(19.7)
    # where the waits still read reach the cap, the lost ones would have changed nothing
    capped = reconcile(*args, **kw, waited_ms=[5.0] * 10, wall_steady=[False] * 10)
    assert capped.gross_lie


def test_waits_during_a_call_sum_the_threads_and_see_a_thread_that_ended():
    before = {10: (5_000_000, 1_000_000), 11: (2_000_000, 0)}
    after = {10: (9_000_000, 1_500_000), 11: (6_000_000, 2_000_000), 12: (1_000_000, 300_000)}  # 12 started
    waited, steady = clocks.waits_during(9.0, before, after, own_wait_ns=200_000)
    assert waited == pytest.approx(0.5 + 2.0 + 0.3 + 0.2) and steady
    # a thread gone, or CPU time the live threads did not gain (a thread started and ended in the call)
    assert clocks.waits_during(9.0, before, {10: after[10], 12: after[12]}, 0)[1] is False
    assert clocks.waits_during(12.0, before, after, 0)[1] is False
    # schedstat counting nothing (accounting off), or nothing to read: no bound
    zeros = {10: (0, 0), 11: (0, 0)}
    assert clocks.waits_during(9.0, zeros, zeros, 0) == (None, False)
    assert clocks.waits_during(9.0, {}, after, 0) == (None, False)


def test_schedstat_of_a_live_process_gives_cpu_time_and_waits():
    stats = clocks.thread_schedstat(os.getpid())
    assert threading.get_native_id() in stats
    assert all(cpu >= 0 and delay >= 0 for cpu, delay in stats.values())
    assert clocks.own_run_delay_ns() >= 0


def test_the_second_flush_is_for_inputs_over_the_l2_in_auto_and_always_or_never_otherwise():
    l2 = 50 << 20
    small = [torch.empty(4 << 20), torch.empty(1 << 20)]   # 20 MiB of float32
    large = [torch.empty(8 << 20), torch.empty(8 << 20)]   # 64 MiB
    assert not timing.flushes_after_inputs("auto", small, l2)
    assert timing.flushes_after_inputs("auto", large, l2)
    assert timing.flushes_after_inputs("auto", [torch.empty(l2 // 4 + 1)], l2)
    assert not timing.flushes_after_inputs("auto", [torch.empty(l2 // 4)], l2)  # exactly the L2: kept
    assert timing.flushes_after_inputs("on", small, l2) and not timing.flushes_after_inputs("off", large, l2)
    assert not timing.flushes_after_inputs("auto", [3, "x", None], l2)  # non-tensor inputs weigh nothing


def test_the_flush_switch_keeps_its_old_true_and_false():
    from cuda_agent.judge.config import JudgeConfig

    assert JudgeConfig().flush_after_inputs == "auto"
    assert JudgeConfig(flush_after_inputs=True).flush_after_inputs == "on"
    assert JudgeConfig(flush_after_inputs=False).flush_after_inputs == "off"
    with pytest.raises(ValueError):
        JudgeConfig(flush_after_inputs="sometimes")
