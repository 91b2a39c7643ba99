"""Where the judge keeps baseline timings: one small protocol, a file store as the default.

A baseline is the eager, torch.compile or null-model timing of a task under the judge's call
protocol. Measuring one costs seconds (eager) to minutes (torch.compile), so it is measured once
per (task, GPU model, torch version, mode, protocol settings) and stored. The judge asks the store
before measuring and tells it afterwards; what backs the store is the caller's choice: the file
cache below by default, the results database (`cuda_agent.db`) for benchmark runs and the pool.

A store holds only numbers the trusted judge measured; candidate code never reaches it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from cuda_agent.hardware.sol import SpeedOfLight

from .verdict import Timing


class BaselineKey(BaseModel):
    """Everything a baseline timing depends on. `digest` is the storage key."""

    model_config = ConfigDict(frozen=True)
    harness_version: int
    task_id: str
    device_name: str        # the GPU model (or "cpu xN"): timings move between machines of one model
    torch_version: str
    mode: str               # "eager", "null", or a torch.compile mode
    flush_l2: bool
    n_timed: int
    n_warmup: int

    def digest(self) -> str:
        # The same list, in the same order, as the judge's original file names: existing caches stay valid.
        return hashlib.sha256(json.dumps([self.harness_version, self.task_id, self.device_name, self.torch_version,
                                          self.mode, self.flush_l2, self.n_timed, self.n_warmup]).encode()
                              ).hexdigest()[:24]


class Baseline(BaseModel):
    """One measured baseline."""

    timing: Timing
    overhead_ms: float   # median outside-clock cost of a call beyond the work (null) or its claim
    protocol_ms: float | None = None  # median round trip of the untimed request before each call
    # On the eager baseline (keyed by task and GPU model, as speed-of-light is): the task's least
    # work and least time on this GPU model. None on other modes and in caches from before it.
    speed_of_light: SpeedOfLight | None = None


@runtime_checkable
class BaselineStore(Protocol):
    """Get and put baselines by key. Implementations must tolerate concurrent writers of the same
    key (two judges measuring one task at once): the last complete write wins."""

    def get(self, key: BaselineKey) -> Baseline | None: ...

    def put(self, key: BaselineKey, baseline: Baseline) -> None: ...


class FileBaselineStore:
    """One JSON file per key in a folder (the judge's default, under `cache_dir/baselines`)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def get(self, key: BaselineKey) -> Baseline | None:
        path = self.folder / f"{key.digest()}.json"
        try:
            return Baseline.model_validate_json(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:  # a torn or foreign file: measure again
            path.unlink(missing_ok=True)
            return None

    def put(self, key: BaselineKey, baseline: Baseline) -> None:
        path = self.folder / f"{key.digest()}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(baseline.model_dump_json())
        os.replace(tmp, path)
