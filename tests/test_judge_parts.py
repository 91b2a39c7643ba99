"""The parts the judge is split into, each on its own: an evaluation's state and how it reads a
worker's error reply, the worker supply's uid rotation and zygote rule, the baseline cache, the
typed protocol messages. No worker process is started here (the end-to-end judging that uses
them is in the slow tier)."""

from __future__ import annotations

import pytest

from cuda_agent import host
from cuda_agent.judge import JudgeConfig
from cuda_agent.judge.baselines import Baseline, BaselineCache, BaselineKey, baseline_source
from cuda_agent.judge.evaluation import Evaluation, Stop
from cuda_agent.judge.protocol import CallReply, InitRequest, Reply
from cuda_agent.judge.supply import WorkerSupply, ZygoteHolder
from cuda_agent.judge.verdict import Failure, FailureCategory as FC, Timing, Verdict


def verdict() -> Verdict:
    return Verdict(task_id="t", task_name="t", candidate_hash="c", device="cpu")


def stop_of(ev: Evaluation, reply: dict, setup: bool = False) -> Stop:
    with pytest.raises(Stop) as caught:
        ev.reported_error(Reply.parse(reply), setup=setup)
    return caught.value


def test_the_kind_of_run_decides_what_is_checked_and_who_is_blamed():
    cand, ref, base = (Evaluation(kind=k, verdict=verdict()) for k in ("candidate", "reference", "baseline"))
    assert (cand.judged, cand.trusted) == (True, False)
    assert (ref.judged, ref.trusted) == (True, True)
    assert (base.judged, base.trusted) == (False, True)
    reply = {"ok": False, "category": "runtime", "message": "boom"}
    assert stop_of(cand, reply).failure == Failure(category=FC.RUNTIME, message="boom")
    assert stop_of(base, reply).failure.category is FC.JUDGE           # a baseline's call: the judge's
    judge_reply = {"ok": False, "category": "judge", "message": "worker set-up failed"}
    assert stop_of(cand, judge_reply, setup=True).failure.category is FC.JUDGE
    assert stop_of(cand, judge_reply).failure.category is FC.RUNTIME   # after set-up, not believed
    assert stop_of(cand, {"ok": False, "category": "made-up"}).failure.category is FC.RUNTIME


def test_a_failed_build_and_a_sandbox_refusal_come_before_the_reported_category():
    ev = Evaluation(kind="candidate", verdict=verdict())
    ev.build_failure = Failure(category=FC.COMPILE, message="nvcc: error")
    stop = stop_of(ev, {"ok": False, "category": "load", "message": "no module"})
    assert stop.failure.category is FC.COMPILE and ev.verdict.compiled is False
    ev = Evaluation(kind="candidate", verdict=verdict())
    stop = stop_of(ev, {"ok": False, "category": "runtime", "blocked": ["open /etc/shadow"] * 9})
    assert stop.failure.category is FC.POLICY
    assert ev.verdict.policy_violations == ["the sandbox refused: open /etc/shadow"]   # once, not nine times


def test_a_baselines_host_memory_fallback_reaches_the_candidates_verdict():
    ev = Evaluation(kind="candidate", verdict=verdict(), vendor=frozenset({"gemm"}))
    run = ev.child("baseline", verdict())
    assert run.vendor == ev.vendor and run.kind == "baseline"
    run.note_gpu_plane_problem("cudaIpcOpenMemHandle failed")
    assert ev.gpu_plane_problem == "cudaIpcOpenMemHandle failed"


def test_worker_supply_uids_and_the_zygote_rule(tmp_path):
    cfg = JudgeConfig(device="cpu", spares=2, cache_dir=tmp_path)
    supply = WorkerSupply(cfg, uid=None, work_root=tmp_path)
    assert supply.sandbox_uids() == set() and supply.standby_pids() == set()
    base = host.JUDGE_UIDS.start + 7
    rooted = WorkerSupply(cfg, uid=base, work_root=tmp_path)
    assert rooted.sandbox_uids() == {host.spare_uid(base, k) for k in range(3)} and len(rooted.sandbox_uids()) == 3
    assert ZygoteHolder(cfg).wanted and not ZygoteHolder(JudgeConfig(device="cpu", use_zygote=False)).wanted
    assert not ZygoteHolder(cfg.model_copy(update={"device": "cuda"})).wanted   # a CUDA context cannot be forked
    assert ZygoteHolder(cfg.model_copy(update={"device": "cuda", "use_zygote": True})).wanted
    off = ZygoteHolder(JudgeConfig(device="cpu", use_zygote=False))
    assert off() is None and off.pid is None
    # build jobs never initialise CUDA: forked on both backends by default, `build_zygote` where set,
    # off where zygotes are switched off
    cuda = cfg.model_copy(update={"device": "cuda"})
    assert ZygoteHolder(cuda, builds=True).wanted and ZygoteHolder(cfg, builds=True).wanted
    assert not ZygoteHolder(cuda.model_copy(update={"use_zygote": False}), builds=True).wanted
    assert not ZygoteHolder(cuda.model_copy(update={"build_zygote": False}), builds=True).wanted
    assert ZygoteHolder(cuda.model_copy(update={"build_zygote": True}), builds=True).wanted
    assert not ZygoteHolder(cuda.model_copy(update={"build_zygote": True})).wanted   # workers: use_zygote's
    assert not ZygoteHolder(cfg.model_copy(update={"build_zygote": False}), builds=True).wanted


class _Store:
    def __init__(self):
        self.data, self.gets = {}, 0

    def get(self, key):
        self.gets += 1
        return self.data.get(key.digest())

    def put(self, key, baseline):
        self.data[key.digest()] = baseline


def test_the_baseline_cache_reads_the_store_once_and_writes_only_when_it_persists():
    key = BaselineKey(harness_version=7, task_id="t", device_name="cpu x2", torch_version="2", mode="eager",
                      flush_l2=True, n_timed=20, n_warmup=3)
    base = Baseline(timing=Timing(median_ms=1, mean_ms=1, min_ms=1, max_ms=1, p10_ms=1, p90_ms=1, std_ms=0, n=3),
                    overhead_ms=0.1)
    store = _Store()
    cache = BaselineCache(store)
    assert cache.get(key) is None
    cache.put(key, base)
    assert store.data == {key.digest(): base}
    assert BaselineCache(store).get(key) == base
    fresh = _Store()
    memory_only = BaselineCache(fresh, persist=False)
    memory_only.put(key, base)
    assert memory_only.get(key) == base and fresh.data == {} and fresh.gets == 0


def test_trusted_baseline_sources_compile():
    outputs = [([2, 3], "float32"), None, ([4], "float16")]
    for mode in ("eager", "null", "max-autotune"):
        source = baseline_source(mode, outputs)
        compile(source, mode, "exec")
        assert "class ModelNew" in source
    assert "torch.empty([2, 3], dtype=torch.float32" in baseline_source("null", outputs)


def test_protocol_messages_are_typed():
    # what the judge sends and reads is declared once, for both sides
    assert {"device", "candidate_path", "trusted", "policy", "require"} <= set(InitRequest.__annotations__)
    assert {"inside_ms", "outputs", "ops", "tampered", "flags_changed", "kernels"} <= set(CallReply.__annotations__)
