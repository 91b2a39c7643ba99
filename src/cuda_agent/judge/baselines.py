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
    # CPU backend, null model: median wall time of a call as the judge measures it (the protocol's
    # cost on the wall-clock bound, timing.reconcile). None elsewhere and in caches from before it.
    wall_overhead_ms: float | None = None
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


class BaselineCache:
    """The baselines one judge knows: those it measured or read this session, in memory, over a
    `BaselineStore` that outlives it (read and written only when `persist`)."""

    def __init__(self, store: BaselineStore, persist: bool = True):
        self.store = store
        self.persist = persist
        self._known: dict[str, Baseline] = {}

    def get(self, key: BaselineKey) -> Baseline | None:
        digest = key.digest()
        got = self._known.get(digest)
        if got is None and self.persist:
            got = self.store.get(key)
            if got is not None:
                self._known[digest] = got
        return got

    def put(self, key: BaselineKey, baseline: Baseline) -> None:
        self._known[key.digest()] = baseline
        if self.persist:
            self.store.put(key, baseline)


def baseline_source(mode: str, outputs: list) -> str:
    """A trusted ModelNew for baseline runs: the reference itself (`eager`), torch.compile of it (a
    compile mode), or a null model (`null`) that returns correctly shaped, uncomputed outputs.
    `outputs`: (shape, dtype name) per output of the reference, None for non-tensor outputs."""
    head = "import torch\nfrom model import Model\n\n"
    if mode == "eager":
        return head + "class ModelNew(Model):\n    pass\n"
    if mode == "null":
        shapes = [o for o in outputs if o is not None]
        lines = ", ".join(f"torch.empty({shape!r}, dtype=torch.{dtype}, device=self.dev.device)"
                          for shape, dtype in shapes)
        ret = f"({lines},)" if len(shapes) != 1 else lines
        return head + ("class ModelNew(torch.nn.Module):\n"
                       "    def __init__(self, *args, **kwargs):\n"
                       "        super().__init__()\n"
                       "        self.dev = torch.nn.Parameter(torch.empty(0), requires_grad=False)\n"
                       "    def forward(self, *inputs):\n"
                       f"        return {ret}\n")
    return head + ("class ModelNew(Model):\n"
                   "    def __init__(self, *args, **kwargs):\n"
                   "        super().__init__(*args, **kwargs)\n"
                   f"        self.compiled = torch.compile(super().forward, mode={mode!r})\n"
                   "    def forward(self, *inputs):\n"
                   "        return self.compiled(*inputs)\n")
