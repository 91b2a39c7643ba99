"""Verdicts the judge has already reached, answered again without running anything (`-c verdict_cache=true`).

An RL rollout, a bench rerun or an agent that submits bytes it submitted before asks the same
question twice. With the cache on, `Judge.evaluate` answers a candidate it has judged before from
the stored verdict when everything the verdict depends on is the same:

- the task (its id is a hash of its source) and the candidate's bytes (its content hash);
- the judge's settings that decide outcomes (tolerances, call counts, limits, policy, compile
  mode; not where files live or which cores run what);
- the machine model and software: device name, torch and CUDA versions, the harness version and
  a digest of the judge's own code, so a changed rule or protocol judges again.

Only settled outcomes are stored: correct verdicts, and failures decided by static checks and the
compiler (load, policy, compile). A crash, a time limit, a wrong output, an out-of-memory or a
problem of the judge itself is judged again next time (it may depend on the moment, or a racy
kernel may get another chance to show its race). The answer is the first verdict with
`from_cache` set and a note saying when it was judged; its timings are the first run's.

The store is one JSON file per key under the judge's cache folder, which candidate processes
cannot reach (the same trust as the build cache and the baselines beside it).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from .verdict import FailureCategory, Verdict

# Settings that say where or how the judge runs, not what it decides.
_PLACEMENT = frozenset({"cache_dir", "spares", "sandbox_uid", "timing_cpus", "spare_cpus", "use_zygote",
                        "verdict_cache", "arch", "device_lock"})
SETTLED_FAILURES = frozenset({FailureCategory.LOAD, FailureCategory.POLICY, FailureCategory.COMPILE})


def settled(verdict: Verdict) -> bool:
    """Whether a verdict would be the same if judged again now (see the module docstring)."""
    if verdict.failure is None:
        return verdict.correct
    return verdict.failure.category in SETTLED_FAILURES


class VerdictCache:
    """Stored verdicts by key, in `folder` (the judge's `cache_dir/verdicts`)."""

    def __init__(self, folder: Path, *, settings: dict, machine: dict):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        decided = {k: v for k, v in settings.items() if k not in _PLACEMENT}
        self._context = json.dumps({"settings": decided, "machine": machine}, sort_keys=True, default=str)

    def key(self, task_id: str, candidate_hash: str) -> str:
        return hashlib.sha256(f"{self._context}|{task_id}|{candidate_hash}".encode()).hexdigest()[:32]

    def get(self, task_id: str, candidate_hash: str) -> Verdict | None:
        path = self.folder / f"{self.key(task_id, candidate_hash)}.json"
        try:
            stored = json.loads(path.read_text())
            verdict = Verdict.model_validate(stored["verdict"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):  # a torn or foreign file: judge again
            return None
        if verdict.task_id != task_id or verdict.candidate_hash != candidate_hash:
            return None
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(stored.get("judged_at", 0))))
        verdict.from_cache = True
        verdict.notes.append(f"answered from the judge's verdict cache: the same task, bytes, settings and "
                             f"machine were judged at {when} (in {stored.get('judge_s') or 0:.1f} s); "
                             f"nothing was run this time")
        return verdict

    def put(self, verdict: Verdict) -> bool:
        """Store a settled verdict (others are not stored); atomic, so a reader never sees half a file."""
        if not settled(verdict) or verdict.from_cache:
            return False
        path = self.folder / f"{self.key(verdict.task_id, verdict.candidate_hash)}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"judged_at": time.time(), "judge_s": verdict.judge_s,
                                   "verdict": verdict.model_dump(mode="json")}))
        os.replace(tmp, path)
        return True
