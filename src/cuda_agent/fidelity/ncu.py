"""Nsight Compute beside the judge: building the sampled solutions ahead, profiling them, reading the sum."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# The CSV reader is the package's, shared with the agent's profile tool.
from cuda_agent.hardware.ncu import parse_ncu_csv

from .corpus import Record

RUNNER = "cuda_agent.fidelity.ncu_runner"


def _runner(record: Record, folder: Path) -> list[str]:
    """The command line of the trusted runner (`python -m cuda_agent.fidelity.ncu_runner`) on the
    record's solution in `folder`."""
    return [sys.executable, "-m", RUNNER, str(record.problem), str(folder / "solution.py")]


def _ncu_folder(record: Record, out: Path) -> tuple[Path, dict]:
    """The record's folder under OUT/ncu (its solution.py written there) and the environment its
    runs use: a torch extensions folder of its own, so that a build made ahead (`prebuild_ncu`) is
    the one the profiled run loads, and two solutions naming their extension alike never share one."""
    folder = out / "ncu" / record.key
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "solution.py").write_text(record.code)
    return folder, dict(os.environ, TORCH_EXTENSIONS_DIR=str(folder / "torch_extensions"))


def prebuild_ncu(records: list[Record], out: Path, parallel: int, timeout_s: float,
                 device: str = "cuda") -> dict[str, str]:
    """Build the sampled solutions' extensions, `parallel` at once, before any is profiled: the
    profiled runs take the GPU's counters one at a time, and a published load_inline solution takes
    40-90 s to compile, so building inside each profiled run would serialise the builds too.
    Returns why a build failed, by record key (the profiled run then reports its own error)."""
    from concurrent.futures import ThreadPoolExecutor

    def build(record: Record) -> tuple[str, str | None]:
        folder, env = _ncu_folder(record, out)
        cmd = _runner(record, folder) + ["--build-only", "--device", device]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return record.key, f"build did not finish within {timeout_s:.0f} s"
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
            return record.key, f"build exit {proc.returncode}: " + " | ".join(tail)
        return record.key, None

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return {key: why for key, why in pool.map(build, records) if why is not None}


# Where a judge runtime and the summed kernel time of a forward are not the same quantity: a forward
# with this many launches or more, idle gaps between them above LAUNCH_GAP_MS each on average, or
# one shorter than SHORT_FORWARD_MS (the gate's start and end markers take ~1 us of it).
MANY_LAUNCHES = 20
LAUNCH_GAP_MS = 0.003
SHORT_FORWARD_MS = 0.01


def ncu_reading(judge_ms: float | None, source: str | None, ncu_ms: float | None,
                kernels_per_forward: float | None) -> str:
    """Why a judge/ncu ratio is not expected to be 1, or "" where it is (an honest kernel-bound
    forward timed behind the gate): the judge times a forward, Nsight Compute sums its kernels."""
    if not judge_ms or not ncu_ms:
        return ""
    if source == "events":
        return "timed by events: the forward waits on the host inside the call"
    if source == "outside":
        return "the judge's own clock (the claims disagreed with it)"
    launches = kernels_per_forward or 0
    if launches >= MANY_LAUNCHES and (judge_ms - ncu_ms) / launches > LAUNCH_GAP_MS:
        return f"{launches:g} launches a forward: the GPU idles between them"
    if ncu_ms < SHORT_FORWARD_MS:
        return "under 10 us of kernels: the gate's markers (~1 us) weigh"
    return ""


def run_ncu(record: Record, entry: dict, out: Path, forwards: int, timeout_s: float) -> dict:
    ncu = shutil.which("ncu")
    folder, env = _ncu_folder(record, out)
    log = folder / "ncu.csv"
    log.unlink(missing_ok=True)
    cmd = [ncu, "--csv", "--print-units", "base", "--metrics", "gpu__time_duration.sum",
           "--profile-from-start", "off", "--clock-control", "none", "--target-processes", "all",
           "--log-file", str(log), *_runner(record, folder), "--forwards", str(forwards)]
    v = entry.get("verdict") or {}
    judge_ms = (v.get("runtime") or {}).get("median_ms")
    result = {"key": record.key, "level": record.level, "judge_ms": judge_ms,
              "source": (v.get("runtime") or {}).get("source"), "forwards": forwards,
              "ncu_ms": None, "kernels_per_forward": None, "ratio": None, "reading": "", "error": None}
    from cuda_agent.judge.devlock import counters_lock

    try:
        with counters_lock().hold(exclusive=True):  # one ncu per GPU
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        result["error"] = f"ncu did not finish within {timeout_s:.0f} s"
        return result
    text = (log.read_text() if log.is_file() else "") + "\n" + proc.stdout
    kernels = parse_ncu_csv(text)
    if proc.returncode != 0 or not kernels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        result["error"] = f"ncu exit {proc.returncode}, {len(kernels)} kernels: " + " | ".join(tail)
        if not kernels:
            return result
    total_ms = sum(k["ns"] for k in kernels) / 1e6
    result["ncu_ms"] = total_ms / forwards
    result["kernels_per_forward"] = len(kernels) / forwards
    if judge_ms and result["ncu_ms"]:
        result["ratio"] = judge_ms / result["ncu_ms"]
    result["reading"] = ncu_reading(judge_ms, result["source"], result["ncu_ms"], result["kernels_per_forward"])
    return result


def _ncu_row_note(x: dict) -> str:
    """A profiled record's error, else why its ratio is not expected to be 1 (`ncu_reading`)."""
    return x.get("error") or x.get("reading") or ""
