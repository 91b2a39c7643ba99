"""Scripted stand-ins for the judge, for testing the pool's scheduling and failure handling in
seconds. A candidate's source says what its judging does, one directive per line:

    # sleep: 0.5          take this long
    # hang                never return (a wedged worker)
    # die                 kill the worker process
    # die-once: PATH      kill the worker the first time (PATH marks that it happened)
    # judge-error         raise JudgeError (the judge cannot work on the task)
    # oom-once: PATH      the first time, a `judge` verdict of a CUDA out-of-memory error (PATH marks it)
    # baseline            read the task's eager baseline from the judge's store, else store one
                          (the verdict's notes say which: "baseline: stored" or "baseline: found")

Everything else is judged correct, with a runtime the source names (`# runtime: 2.0`), so the
verdicts carry real numbers through the pool. Each verdict records when judging started and ended
and in which process, for tests about ordering and concurrency.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from cuda_agent.judge import JudgeError
from cuda_agent.judge.verdict import Failure, FailureCategory, Timing, Verdict


def _directives(source: str) -> dict[str, str]:
    out = {}
    for line in source.splitlines():
        line = line.strip()
        if line.startswith("# "):
            key, _, value = line[2:].partition(":")
            out[key.strip()] = value.strip()
    return out


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, p10_ms=ms, p90_ms=ms, std_ms=0.0, n=5)


class ScriptedJudge:
    def __init__(self, config, baseline_store=None):
        self.config = config
        self.device_name = "scripted"   # one machine model (tests tell workers apart by pid)
        self.arch = None
        self.baseline_store = baseline_store

    def evaluate(self, task, candidate) -> Verdict:
        d = _directives(candidate.model_new)
        started = time.time()
        if "die-once" in d:
            marker = Path(d["die-once"])
            if not marker.exists():
                marker.write_text("died")
                os.kill(os.getpid(), signal.SIGKILL)
        if "die" in d:
            os.kill(os.getpid(), signal.SIGKILL)
        if "hang" in d:
            while True:
                time.sleep(1)
        if "judge-error" in d:
            raise JudgeError(f"task {task.name}: the reference does not import")
        if "oom-once" in d and not Path(d["oom-once"]).exists():
            Path(d["oom-once"]).write_text("out of memory")
            v = Verdict(task_id=task.id, task_name=task.name, candidate_hash=candidate.hash, device="cuda",
                        device_name=self.device_name,
                        failure=Failure(category=FailureCategory.JUDGE, message=(
                            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has "
                            "a total capacity of 79.18 GiB of which 204.62 MiB is free.")))
            v.phase_s.update({"started_at": started, "ended_at": time.time(), "pid": float(os.getpid())})
            return v
        time.sleep(float(d.get("sleep", "0")))
        notes = []
        if "baseline" in d:
            notes.append(self._baseline(task))
        runtime = float(d.get("runtime", "1.0"))
        v = Verdict(task_id=task.id, task_name=task.name, candidate_hash=candidate.hash, device="cpu",
                    device_name=self.device_name, compiled=True, correct=True, runtime=_timing(runtime),
                    eager=_timing(2.0), notes=notes)
        v.phase_s.update({"started_at": started, "ended_at": time.time(), "pid": float(os.getpid())})
        return v

    def _baseline(self, task) -> str:
        from cuda_agent.judge.baselines import Baseline, BaselineKey

        key = BaselineKey(harness_version=0, task_id=task.id, device_name=self.device_name, torch_version="scripted",
                          mode="eager", flush_l2=False, n_timed=1, n_warmup=0)
        if self.baseline_store.get(key) is not None:
            return "baseline: found"
        self.baseline_store.put(key, Baseline(timing=_timing(2.0), overhead_ms=0.0))
        return "baseline: stored"

    def close(self) -> None:
        pass


class TwoModelJudge(ScriptedJudge):
    """Scripted judges on two GPU models: even sandbox uids (pool slots) are one, odd the other."""

    def __init__(self, config, baseline_store=None):
        super().__init__(config, baseline_store)
        self.device_name = f"model {(config.sandbox_uid or 0) % 2}"


class BrokenJudge:
    """A judge that cannot start (as on a machine without the device asked for)."""

    def __init__(self, config, baseline_store=None):
        raise JudgeError("device 'cuda' requested but CUDA is not available")
