"""The device lock that lets several judges share one GPU (judge/devlock.py), its place in the pool
(judges per GPU), and the judge taking it around its calls: timed calls alone, the rest shared."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from conftest import judge_cache_dir, read_header
from cuda_agent.judge.devlock import DeviceLock, counters_lock, gpu_lock_path, host_lock_path

FIXTURES = Path(__file__).parent / "fixtures"
CTX = multiprocessing.get_context("fork")


def _holder(path: str, exclusive: bool, got, release, log=None, name: str = "") -> None:
    with DeviceLock(path).hold(exclusive):
        if log is not None:
            log.put(name)
        got.set()
        release.wait(30)


def _start(path: Path, exclusive: bool, log=None, name: str = ""):
    got, release = CTX.Event(), CTX.Event()
    proc = CTX.Process(target=_holder, args=(str(path), exclusive, got, release, log, name), daemon=True)
    proc.start()
    return proc, got, release


def test_shared_holders_overlap_and_an_exclusive_one_waits_for_them(tmp_path):
    lock = tmp_path / "gpu.lock"
    a, a_got, a_release = _start(lock, exclusive=False)
    b, b_got, b_release = _start(lock, exclusive=False)
    assert a_got.wait(10) and b_got.wait(10), "two shared holders at once"
    w, w_got, w_release = _start(lock, exclusive=True)
    assert not w_got.wait(0.5), "an exclusive holder got the lock beside shared ones"
    a_release.set()
    assert not w_got.wait(0.3), "an exclusive holder got the lock beside a shared one"
    b_release.set()
    assert w_got.wait(10)
    c, c_got, c_release = _start(lock, exclusive=False)
    assert not c_got.wait(0.5), "a shared holder got the lock beside an exclusive one"
    w_release.set()
    assert c_got.wait(10)
    c_release.set()
    for p in (a, b, w, c):
        p.join(10)


def test_a_waiting_exclusive_holder_is_not_starved_by_new_shared_ones(tmp_path):
    lock = tmp_path / "gpu.lock"
    log = CTX.Queue()
    first, first_got, first_release = _start(lock, False, log, "first-shared")
    assert first_got.wait(10)
    writer, writer_got, writer_release = _start(lock, True, log, "exclusive")
    time.sleep(0.3)  # the writer now waits, holding the turnstile
    later, later_got, later_release = _start(lock, False, log, "later-shared")
    assert not later_got.wait(0.5), "a new shared holder passed a waiting exclusive one"
    first_release.set()
    assert writer_got.wait(10)
    assert not later_got.wait(0.3)
    writer_release.set()
    assert later_got.wait(10)
    later_release.set()
    assert [log.get(timeout=5) for _ in range(3)] == ["first-shared", "exclusive", "later-shared"]
    for p in (first, writer, later):
        p.join(10)


def test_a_holder_killed_mid_call_leaves_the_device_free(tmp_path):
    lock = tmp_path / "gpu.lock"
    p, got, _ = _start(lock, exclusive=True)
    assert got.wait(10)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    done = threading.Event()

    def take():
        with DeviceLock(lock).hold(exclusive=True):
            done.set()

    threading.Thread(target=take, daemon=True).start()
    assert done.wait(10), "the lock of a killed holder was not released"


def test_the_lock_of_a_gpu_is_named_by_the_first_visible_device():
    assert gpu_lock_path("3") == gpu_lock_path("3,4") != gpu_lock_path("4")
    assert gpu_lock_path(None) == gpu_lock_path("") == gpu_lock_path("0")
    # Nsight Compute's lock: one per GPU too, apart from the timing lock (a profile does not wait
    # for other judges' checked calls, only for another ncu)
    assert counters_lock("3").path == counters_lock("3,4").path != counters_lock("4").path
    assert counters_lock("3").path != gpu_lock_path("3")
    odd = gpu_lock_path("GPU-8f/../x")
    assert odd.parent == gpu_lock_path("0").parent and "/" not in odd.name and ".." not in odd.name


def test_placement_puts_judges_per_gpu_on_each_gpu(monkeypatch):
    from cuda_agent import host
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.pool.transport import PlacementError, local_placement

    monkeypatch.setattr(host, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(host, "usable_cpus", lambda: list(range(16)))
    monkeypatch.setattr(host, "usable_cores", lambda: 16)
    cfg = JudgeConfig(device="cuda")
    place = local_placement(cfg, None, None, judges_per_gpu=3)
    assert place.judges == 6
    assert [e["CUDA_VISIBLE_DEVICES"] for e in place.judge_env] == ["0", "1", "0", "1", "0", "1"]
    # two timing cores per judge where the machine has them, none shared between judges
    cores = [c for t in place.timing_cpus for c in (t or [])]
    assert len(cores) == len(set(cores))
    assert local_placement(cfg, 3, None, judges_per_gpu=2).judges == 3
    with pytest.raises(PlacementError, match="judges-per-gpu"):
        local_placement(cfg, 5, None, judges_per_gpu=2)
    with pytest.raises(PlacementError):
        local_placement(cfg, 3, None)  # one judge per GPU unless asked
    # one GPU, three judges on 16 cores: six timing cores, a compile worker on each of the ten left
    monkeypatch.setattr(host, "visible_gpus", lambda: ["0"])
    place = local_placement(cfg, None, None, judges_per_gpu=3)
    timed = {c for t in place.timing_cpus for c in t}
    assert len(timed) == 6 and place.spare_cpus == [c for c in range(16) if c not in timed]
    assert place.compile_workers == 10 and place.build_jobs == 1


class _CapturingJudge:
    configs: list = []

    def __init__(self, config, store):
        _CapturingJudge.configs.append(config)
        self.device_name, self.arch = "stand-in", None


def test_a_judge_worker_sharing_its_gpu_takes_that_gpus_lock(monkeypatch):
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.pool.transport import WorkerSpec
    from cuda_agent.pool.workers import make_server

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    factory = f"{__name__}:_CapturingJudge"
    _CapturingJudge.configs.clear()
    for share in (True, False):
        spec = WorkerSpec(role="judge", slot=0, config=JudgeConfig(device="cuda"), judge_factory=factory,
                          share_device=share)
        server = make_server(spec)
        assert not hasattr(server, "message"), server
    spec = WorkerSpec(role="judge", slot=0, config=JudgeConfig(device="cpu"), judge_factory=factory,
                      share_device=True)
    make_server(spec)
    shared, alone, cpu = _CapturingJudge.configs
    assert shared.device_lock == gpu_lock_path("1") and alone.device_lock is None
    assert cpu.device_lock == host_lock_path() != shared.device_lock


# ---------------------------------------------------------------- the judge takes the lock (slow)
class _RecordingLock(DeviceLock):
    """The device lock, with every hold recorded as (mode, start, end) once it was granted."""

    def __init__(self, path, record: list, guard: threading.Lock):
        super().__init__(path)
        self.record, self.guard = record, guard

    def hold(self, exclusive: bool, timeout: float | None = None):
        import contextlib

        @contextlib.contextmanager
        def held():
            with super(_RecordingLock, self).hold(exclusive, timeout):
                t0 = time.monotonic()
                try:
                    yield
                finally:
                    with self.guard:
                        self.record.append(("exclusive" if exclusive else "shared", t0, time.monotonic()))
        return held()


@pytest.mark.slow
def test_two_judges_on_one_device_never_run_a_call_beside_a_timed_one(tmp_path_factory):
    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.tasks import load_task_file

    cache = judge_cache_dir(tmp_path_factory)
    lock = tmp_path_factory.mktemp("locks") / "cpu.lock"
    fixture = FIXTURES / "cpu" / "honest" / "matmul_omp.py"
    task = load_task_file(FIXTURES / "tasks" / read_header(fixture)["task"])
    record: list = []
    guard = threading.Lock()
    judges = [Judge(JudgeConfig(device="cpu", compile_mode="none", n_check=2, n_warmup=1, n_timed=5,
                                cache_dir=cache, device_lock=lock, call_timeout_s=30.0, verdict_cache=False))
              for _ in range(2)]
    try:
        for j in judges:
            j._device_lock = _RecordingLock(lock, record, guard)
        judges[0].evaluate(task, Candidate.from_path(fixture))  # builds and baselines once, for both
        record.clear()
        verdicts: list = [None, None]

        def run(k: int) -> None:
            verdicts[k] = judges[k].evaluate(task, Candidate.from_path(fixture))

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    finally:
        for j in judges:
            j.close()
    for v in verdicts:
        assert v is not None and v.correct, (v.failure if v else None, v.notes if v else None)
        assert 0 <= v.phase_s["calls:device_wait"] <= v.phase_s["calls"], v.phase_s
    modes = [m for m, _, _ in record]
    # per evaluation: 2 checked and 1 warm-up call shared, 5 timed calls alone
    assert modes.count("exclusive") == 10 and modes.count("shared") == 6, modes
    for i, (m, a0, a1) in enumerate(record):
        for n, b0, b1 in record[i + 1:]:
            if "exclusive" in (m, n):
                assert a1 <= b0 or b1 <= a0, f"a {m} hold overlapped a {n} one"


def test_ray_places_judges_per_gpu_as_fractions_of_a_gpu(monkeypatch):
    """The Ray transport's arithmetic without a cluster: K judges per GPU of the cluster, each an
    actor asking for 1/K of a GPU (Ray then sets its CUDA_VISIBLE_DEVICES, which names the lock)."""
    from types import SimpleNamespace

    from cuda_agent.judge import JudgeConfig
    from cuda_agent.pool import ray_transport as rt
    from cuda_agent.pool.transport import PlacementError, WorkerSpec

    monkeypatch.setattr(rt, "_ray", lambda: SimpleNamespace(cluster_resources=lambda: {"GPU": 2.0, "CPU": 32.0}))
    transport = rt.RayTransport.__new__(rt.RayTransport)  # no Ray instance: only placement and start
    cuda = JudgeConfig(device="cuda")
    assert transport.placement(cuda, None, None, judges_per_gpu=3).judges == 6
    assert transport.placement(cuda, None, None).judges == 2
    with pytest.raises(PlacementError, match="judges-per-gpu"):
        transport.placement(cuda, 7, None, judges_per_gpu=3)

    asked: list[dict] = []

    class _Actor:
        hello = SimpleNamespace(remote=lambda: "hello-ref")

    class _ActorClass:
        def options(self, **kw):
            asked.append(kw)
            return SimpleNamespace(remote=lambda spec, store: _Actor())

    transport._actor_cls = _ActorClass()
    for share in (1 / 3, 1.0):
        transport.start(WorkerSpec(role="judge", slot=0, config=cuda, share_device=share < 1, gpu_share=share))
    assert [a["num_gpus"] for a in asked] == [pytest.approx(1 / 3), 1.0]


def test_a_wait_with_a_limit_names_the_processes_that_hold_the_lock(tmp_path):
    lock = tmp_path / "gpu.lock"
    proc, got, release = _start(lock, exclusive=True)
    try:
        assert got.wait(10)
        from cuda_agent.judge.devlock import LockTimeout

        t0 = time.monotonic()
        with pytest.raises(LockTimeout) as exc:
            with DeviceLock(lock).hold(exclusive=False, timeout=0.3):
                pass
        assert 0.3 <= time.monotonic() - t0 < 5 and proc.pid in exc.value.holders
    finally:
        release.set()
        proc.join(10)
    with DeviceLock(lock).hold(exclusive=True, timeout=5):   # free again: had at once
        assert DeviceLock(lock).holders() == {os.getpid()}


class _LockedOut:
    """What CallLoop._hold_device reads of its loop: the lock, the limit and the candidate's processes."""

    def __init__(self, lock: Path, candidate_pids: list[int], limit_s: float):
        from types import SimpleNamespace

        self.device_lock = DeviceLock(lock)
        self.session = SimpleNamespace(proc=SimpleNamespace(pids=lambda: candidate_pids))
        self._limit = limit_s

    def _lock_limit_s(self) -> float:
        return self._limit


@pytest.mark.parametrize("held_by_candidate", [True, False])
def test_a_call_never_waits_without_end_for_the_gpu_lock(tmp_path, held_by_candidate):
    """A judge that is not root leaves its lock file within the candidate's reach: a candidate
    process that holds it fails for tampering within about a second; a lock held by anything else
    past the limit is the judge's failure (never a call that waits forever)."""
    from cuda_agent.judge.calls import CallLoop
    from cuda_agent.judge.evaluation import Stop
    from cuda_agent.judge.verdict import FailureCategory as FC

    lock = tmp_path / "gpu.lock"
    proc, got, release = _start(lock, exclusive=True)
    try:
        assert got.wait(10)
        loop = _LockedOut(lock, [proc.pid] if held_by_candidate else [], limit_s=2.5)
        t0 = time.monotonic()
        with pytest.raises(Stop) as stop:
            with CallLoop._hold_device(loop, exclusive=True):
                pass
        waited = time.monotonic() - t0
    finally:
        release.set()
        proc.join(10)
    if held_by_candidate:
        assert stop.value.failure.category is FC.TAMPERING and waited < 2.5
    else:
        assert stop.value.failure.category is FC.JUDGE and 2.5 <= waited < 8
    assert str(proc.pid) in stop.value.failure.message


def test_the_trainers_gpu_lock_is_the_one_its_judges_take():
    """HFPolicy takes `gpu_lock_of(its device index)`; a judge takes `gpu_lock_path(CUDA_VISIBLE_DEVICES)`
    (the GPU it sees first): for the same physical GPU they are the same file."""
    from cuda_agent.judge.devlock import gpu_lock_of

    assert gpu_lock_of(0, "3,5") == gpu_lock_path("3,5") == gpu_lock_path("3")
    assert gpu_lock_of(1, "3,5") == gpu_lock_path("5")
    assert gpu_lock_of(0, "") == gpu_lock_path(None) and gpu_lock_of(2, "") == gpu_lock_path("2")


def _freeing_judge(lock: Path, timeout_s: float, freed: list):
    """What Judge._return_gpu_memory reads: a CUDA judge, its lock, its call limit; the allocator's
    release recorded with whether an exclusive holder could have had the lock meanwhile."""
    from types import SimpleNamespace

    def empty_cache():
        try:
            with DeviceLock(lock).hold(exclusive=True, timeout=0.05):
                freed.append("beside an exclusive holder")
        except Exception:
            freed.append("lock held shared")

    judge = SimpleNamespace(device="cuda", _device_lock=DeviceLock(lock),
                            config=SimpleNamespace(call_timeout_s=timeout_s))
    return judge, empty_cache


def test_a_judge_returns_its_cached_gpu_memory_holding_the_lock_shared(tmp_path, monkeypatch):
    """After each evaluation a CUDA judge gives back what PyTorch's allocator cached for its own
    reference computations (judges sharing a GPU ran each other out of memory), never beside
    another judge's timed call: the lock is held shared while it frees, and a timed call that holds
    it past the limit defers the release to the next evaluation instead of stalling this one."""
    import torch

    from cuda_agent.judge.harness import Judge

    lock, freed = tmp_path / "gpu.lock", []
    judge, empty_cache = _freeing_judge(lock, 0.3, freed)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: 4 << 30)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    Judge._return_gpu_memory(judge)
    assert freed == ["lock held shared"]
    proc, got, release = _start(lock, exclusive=True)   # another judge's timed call
    try:
        assert got.wait(10)
        t0 = time.monotonic()
        Judge._return_gpu_memory(judge)
        assert freed == ["lock held shared"] and 0.3 <= time.monotonic() - t0 < 5
    finally:
        release.set()
        proc.join(10)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: 256 << 20)   # little cached: kept
    Judge._return_gpu_memory(judge)
    assert len(freed) == 1


_LARGE_TASK = '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2.0


def get_inputs():
    return [torch.randn(128, 1024, 1024)]   # 512 MiB in, 512 MiB out, twice that in float64


def get_init_inputs():
    return []
'''


@pytest.mark.gpu
def test_a_cuda_judge_keeps_no_cached_gpu_memory_between_evaluations(tmp_path, tmp_path_factory):
    """The judge's reference outputs and their float64 checks are computed on the GPU in the
    judge's process; after an evaluation the allocator's cache is given back, so a judge sharing the
    GPU with others (the pool's judges per GPU) does not keep the largest task's footprint."""
    import torch

    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.tasks import load_task_file

    path = tmp_path / "large_tanh.py"
    path.write_text(_LARGE_TASK)
    task = load_task_file(path)
    with Judge(JudgeConfig(device="cuda", compile_mode="none", n_check=2, n_warmup=1, n_timed=3,
                           cache_dir=judge_cache_dir(tmp_path_factory), verdict_cache=False)) as judge:
        v = judge.check_reference(task)
        assert v.correct, (v.failure, v.notes)
        # what it may keep (harness._KEEP_GPU_CACHE_BYTES) is less than this task's footprint
        assert torch.cuda.memory_reserved() < 1 << 30, torch.cuda.memory_summary(abbreviated=True)


def test_a_call_outwaits_another_judges_sanitizer_run():
    """A candidate's compute-sanitizer runs (memcheck=true) hold the GPU's lock, shared, for up to
    both tools' limits; a timed call of another judge on that GPU waits longer than that before it
    calls the lock stuck, so memcheck on one judge never fails the others' candidates as the judge's
    failure (seen on an H100: a call gave up after 110 s behind two sanitizer runs)."""
    from types import SimpleNamespace

    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.calls import CallLoop
    from cuda_agent.judge.memcheck import hold_limit_s, tool_limit_s

    for cfg in (JudgeConfig(device="cpu"), JudgeConfig(device="cpu", call_timeout_s=20.0, init_timeout_s=60.0)):
        waits = CallLoop._lock_limit_s(SimpleNamespace(config=cfg))
        assert hold_limit_s(cfg) == 2 * tool_limit_s(cfg) > 4 * cfg.call_timeout_s
        assert waits > hold_limit_s(cfg)
