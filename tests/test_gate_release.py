"""The judge's own release of the timing gate (`JudgeConfig.gate_release="judge"`, CUDA, GPU region).

The candidate's process enqueues a call's work behind the gate and says so; only then does the
judge write the call's inputs and open the gate, so the judge's clock of the call starts where the
GPU's work can start. A launch-bound forward (more host time enqueueing than GPU time running) is
then timed as the GPU's work on both clocks, while every timing hack still fails.

CPU part: the control word's place in the data plane. GPU tier: the judge with each setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import judge_cache_dir, read_header
from cuda_agent.candidate import Candidate
from cuda_agent.judge import Judge, JudgeConfig
from cuda_agent.judge.protocol import CONTROL_BYTES, CallReply, DataPlane
from cuda_agent.reward import reward_of
from cuda_agent.tasks import load_task_file

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "tasks"
LAUNCH_BOUND = FIXTURES / "cuda" / "timing" / "launch_bound_silu.py"
# The CUDA hacks that lie about time or move work out of the timed window, and honest fixtures.
TIMING_HACKS = ["tamper_event_elapsed_time.py", "tamper_synchronize_side_stream.py", "timer_peek_next_inputs.py",
                "timer_starve_baseline.py"]
HONEST = ["matmul_tiled.py", "softmax_rows.py", "linear_relu_ws"]


def test_the_control_word_is_its_own_page_after_the_outputs():
    plane = DataPlane.create(10_000, 5_000)
    try:
        assert plane.control_offset == plane.size - CONTROL_BYTES and plane.control_offset % 4096 == 0
        assert plane.out_offset + plane.out_size == plane.control_offset
        assert plane.out_size >= 5_000 and plane.in_size >= 10_000
        plane.release(7)
        assert int.from_bytes(plane.view[plane.control_offset: plane.control_offset + 4], "little") == 7
        # what the process sees: the same page of the same memfd, mapped again
        twin = DataPlane(fd=plane.fd, size=plane.size, in_size=plane.in_size)
        twin.map()
        assert int.from_bytes(twin.view[twin.control_offset: twin.control_offset + 4], "little") == 7
        plane.release(8)
        assert int.from_bytes(twin.view[twin.control_offset: twin.control_offset + 4], "little") == 8
        twin.view.release()
        twin.mm.close()
    finally:
        plane.close()


def test_the_inputs_layout_is_known_before_they_are_written():
    # the judge sends the layout with the call and writes the bytes at its release: one layout
    import torch

    from cuda_agent.judge.tensorio import pack

    values = [torch.randn(3, 4), [1, (torch.ones(5, dtype=torch.float16), None)], {"k": torch.arange(7)}]
    region = memoryview(bytearray(1 << 16))
    assert pack(values, None, 0, 1 << 16) == pack(values, region, 0, 1 << 16)
    assert bytes(memoryview(bytearray(1 << 16))) != bytes(region)  # and only the second call wrote


class _LiveProcess:
    """Stands in for the worker process of a Session: alive, small, no disk."""

    def alive(self) -> bool:
        return True

    def rss_mb(self) -> float:
        return 0.0

    def disk_used_mb(self) -> float:
        return 0.0


def _session_with_script(script):
    """A Session over a socket pair whose other end is `script(chan, plane)` in a thread."""
    import socket
    import threading

    from cuda_agent.judge.protocol import Channel
    from cuda_agent.judge.session import Session

    a, b = socket.socketpair()
    plane = DataPlane.create(1 << 16, 1 << 16)
    session = Session(_LiveProcess(), Channel(a), plane, memory_limit_mb=1 << 20, disk_limit_mb=1 << 20)
    worker = threading.Thread(target=script, args=(Channel(b), plane), daemon=True)
    worker.start()
    return session, plane, worker


def _word(plane) -> int:
    return int.from_bytes(plane.view[plane.control_offset: plane.control_offset + 4], "little")


def test_the_judge_writes_the_inputs_then_the_token_once_forward_has_enqueued():
    import time

    import torch

    from cuda_agent.judge.calls import release_call
    from cuda_agent.judge.tensorio import pack, unpack

    x = torch.randn(64)
    seen = {}

    def process(chan, plane):
        meta = pack([x], None, 0, plane.in_size)
        seen["before"] = (unpack(meta, plane.view, 0, plane.in_size)[0].clone(), _word(plane))
        time.sleep(0.05)  # enqueueing
        chan.send({"ok": True, "op": "enqueued", "early": False})
        while _word(plane) != 5:
            time.sleep(0.001)
        seen["after"] = unpack(meta, plane.view, 0, plane.in_size)[0].clone()
        chan.send({"ok": True, "inside_ms": 0.1})

    session, plane, worker = _session_with_script(process)
    try:
        t0 = time.perf_counter()
        t_release, answered = release_call(session, [x], 5, time.monotonic() + 10, "call 0")
        assert answered is None and t_release - t0 >= 0.04  # released after the process said so
        assert session.recv(time.monotonic() + 10, "call 0", CallReply.parse).inside_ms == 0.1
        worker.join(5)
        assert seen["before"][1] == 0 and not torch.equal(seen["before"][0], x)  # no inputs before it
        assert torch.equal(seen["after"], x)
    finally:
        plane.close()


def test_a_forward_that_never_says_enqueued_is_released_after_the_wait_and_an_error_is_the_answer():
    import time

    import torch

    from cuda_agent.judge.calls import release_call
    from cuda_agent.judge.timing import RELEASE_WAIT_S

    def stuck(chan, plane):  # forward waits on the host behind the gate: only the release frees it
        while _word(plane) != 1:
            time.sleep(0.001)
        chan.send({"ok": True, "op": "enqueued", "early": True})

    session, plane, worker = _session_with_script(stuck)
    try:
        t0 = time.perf_counter()
        _, answered = release_call(session, [torch.ones(3)], 1, time.monotonic() + 10, "call 0")
        assert answered is None and time.perf_counter() - t0 >= RELEASE_WAIT_S * 0.9
    finally:
        plane.close()

    def failing(chan, plane):
        chan.send({"ok": False, "category": "runtime", "message": "forward failed"})

    session, plane, worker = _session_with_script(failing)
    try:
        _, answered = release_call(session, [torch.ones(3)], 1, time.monotonic() + 10, "call 0")
        assert answered is not None and answered.ok is False and _word(plane) == 1
    finally:
        plane.close()


@pytest.fixture(scope="module")
def judges(tmp_path_factory):
    cache_dir = judge_cache_dir(tmp_path_factory)
    created: dict[str, Judge] = {}

    def get(release: str, writes: str = "device", **more) -> Judge:
        key = (release, writes, *sorted(more.items()))
        if key not in created:
            created[key] = Judge(JudgeConfig(device="cuda", compile_mode="none", n_timed=10, cache_dir=cache_dir,
                                             call_timeout_s=20.0, gate_release=release, release_writes=writes,
                                             **more))
        return created[key]

    yield get
    for j in created.values():
        j.close()


def _judge(judge: Judge, path: Path):
    return judge.evaluate(load_task_file(TASKS / read_header(path)["task"]), Candidate.from_path(path))


@pytest.mark.gpu
@pytest.mark.slow
def test_a_launch_bound_kernel_keeps_its_gpu_time_when_the_judge_opens_the_gate(judges):
    v = _judge(judges("judge"), LAUNCH_BOUND)
    assert v.correct and v.failure is None, (v.failure, v.notes)
    assert v.runtime is not None and v.runtime.source != "outside", (v.runtime, v.notes)
    assert not any("judge's clock" in n for n in v.notes), v.notes
    # the judge's clock of each timed call agrees with the claim once the protocol's cost is off
    timed = [c for c in v.calls if c.role == "timed"]
    assert timed and all(c.outside_ms is not None for c in timed)
    print(f"launch-bound: runtime {v.runtime.median_ms:.3f} ms ({v.runtime.source}); outside "
          f"{sorted(c.outside_ms for c in timed)[len(timed) // 2]:.3f} ms; notes {v.notes}")


@pytest.mark.gpu
@pytest.mark.slow
def test_the_same_kernel_when_the_process_opens_the_gate(judges):
    # The process's own release (the default) leaves the enqueueing on the judge's clock; where
    # that reads as a lie, the second round has the judge open the gates (harness
    # _restart_with_judge_release), so the honest launch-bound kernel is never failed for it.
    v = _judge(judges("process"), LAUNCH_BOUND)
    print(f"process release: correct={v.correct} failure={v.failure} runtime="
          f"{v.runtime.median_ms if v.runtime else None} ({v.runtime.source if v.runtime else None}) notes={v.notes}")
    assert v.correct and v.failure is None and reward_of(v).value >= 1, (v.failure, v.notes)
    # the checked calls' kernel time from CUDA's activity records (a diagnostic beside the gated
    # time) is there, and inside the call's own time
    checked = [c for c in v.calls if c.role == "check"]
    assert checked and all(c.kernel_ms is not None and 0 < c.kernel_ms <= c.inside_ms * 1.05 + 0.05
                           for c in checked), [(c.kernel_ms, c.inside_ms) for c in checked]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name", TIMING_HACKS)
def test_timing_hacks_still_fail_when_the_judge_opens_the_gate(judges, name):
    path = FIXTURES / "cuda" / "hacks" / name
    header = read_header(path)
    v = _judge(judges("judge"), path)
    assert reward_of(v).value == -1 and not v.correct, (v.failure, v.notes)
    allowed = {s.strip() for s in header.get("failure", "").split(",") if s.strip()}
    got = v.failure.category.value if v.failure is not None else "policy"
    assert not allowed or got in allowed, (got, allowed, v.failure)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name", HONEST)
def test_honest_fixtures_pass_when_the_judge_opens_the_gate(judges, name):
    v = _judge(judges("judge"), FIXTURES / "cuda" / "honest" / name)
    assert v.correct and v.failure is None and reward_of(v).value >= 1, (v.failure, v.notes)
    assert v.runtime.source != "outside", (v.runtime, v.notes)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax_rows.py", "matmul_tiled.py"])
def test_inputs_written_from_host_memory_at_the_release(judges, name):
    # release_writes=host: the judge's write at the release is an H2D copy of inputs staged in
    # page-locked memory (no kernel of the judge's context beside the gate); honest kernels pass
    v = _judge(judges("judge", "host"), FIXTURES / "cuda" / "honest" / name)
    print(f"{name}: runtime {v.runtime.median_ms if v.runtime else None} ms ({v.runtime.source if v.runtime else None})")
    assert v.correct and v.failure is None and reward_of(v).value >= 1, (v.failure, v.notes)
    assert v.runtime.source != "outside", (v.runtime, v.notes)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("setting", ["flush_after_inputs", "touch_pages"])
@pytest.mark.parametrize("path", [FIXTURES / "cuda" / "honest" / "softmax_rows.py",
                                  FIXTURES / "cuda" / "honest" / "matmul_tiled.py",
                                  FIXTURES / "cuda" / "hacks" / "timer_peek_next_inputs.py"], ids=lambda p: p.name)
def test_work_between_the_inputs_and_the_clock(judges, path, setting):
    # flush_after_inputs: the process flushes the L2 again after the judge wrote the call's inputs;
    # touch_pages: it reads a byte of every 2 MiB of the inputs and of the outputs' block. Both before
    # its clock starts: honest kernels keep passing on the gate's time, hacks keep failing
    v = _judge(judges("process", **{setting: True}), path)
    print(f"{path.name}: correct={v.correct} runtime={v.runtime.median_ms if v.runtime else None} ms notes={v.notes}")
    if read_header(path).get("expect") == "fail":
        assert reward_of(v).value == -1 and not v.correct, (v.failure, v.notes)
    else:
        assert v.correct and v.failure is None and reward_of(v).value >= 1, (v.failure, v.notes)
        assert v.runtime.source != "outside", (v.runtime, v.notes)
        # gated calls report their markers' time; what they claim is never less than it
        gated = [c for c in v.calls if c.role == "timed" and c.stream_ms is not None]
        assert gated and all(c.inside_ms >= c.stream_ms for c in gated), [(c.inside_ms, c.stream_ms) for c in gated]


@pytest.mark.gpu
@pytest.mark.slow
def test_a_kept_gpu_region_is_lent_zeroed_to_each_process_and_grown_when_a_task_needs_more(judges):
    # keep_gpu_plane: no free on the GPU before a process's calls (a live process's free slows a
    # memory-bound kernel elsewhere); verdicts as without it, hacks still failing
    judge = judges("process", keep_gpu_plane=True)
    honest, hacks = FIXTURES / "cuda" / "honest", FIXTURES / "cuda" / "hacks"
    order = [honest / "softmax_rows.py", honest / "matmul_tiled.py", hacks / "timer_peek_next_inputs.py",
             honest / "softmax_rows.py"]
    sizes = []
    for path in order:
        v = _judge(judge, path)
        if read_header(path).get("expect") == "fail":
            assert reward_of(v).value == -1 and not v.correct, (v.failure, v.notes)
        else:
            assert v.correct and v.failure is None and reward_of(v).value >= 1, (v.failure, v.notes)
            gated = [c for c in v.calls if c.role == "timed" and c.stream_ms is not None]
            assert gated and all(c.lag_ms is not None and c.run_delay_ms is not None and c.run_delay_ms >= 0
                                 for c in gated), [(c.lag_ms, c.run_delay_ms) for c in gated]
        kept = judge.starter.kept_region
        assert kept is not None and kept.ptr is not None and judge.starter.region_loan.ptr is None  # the loan is back
        sizes.append((kept.ptr, kept.nbytes))
    # the same memory from one process to the next unless a task needed more
    assert all(a[0] == b[0] for a, b in zip(sizes, sizes[1:]) if a[1] == b[1]) and sizes[-1] == sizes[-2]
    assert bool(judge.starter.kept_region.tensor.any())  # the last process's calls left their data
    loan = judge.starter.kept_region.lend()
    try:
        assert loan.ptr == judge.starter.kept_region.ptr and not bool(loan.tensor.any())
    finally:
        loan.close()
    assert judge.starter.kept_region.ptr is not None  # returning a loan frees nothing
