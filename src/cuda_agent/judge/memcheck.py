"""Memory safety on request (`JudgeConfig.memcheck`): one checked call of the candidate under NVIDIA
compute-sanitizer, in a process of its own, sandboxed as the candidate's calls are.

Why a separate process: the sanitizer instruments every kernel and intercepts the driver, which makes a
call 10-100x slower and changes what the process can do (its injection library, its own use of the
driver's callbacks). So the judge's verdict stays with the ordinary calls, and once they pass, this
step asks one more question: does one call, on the task's own shapes, touch memory it must not?

What runs (`memcheck_run.py`, under `compute-sanitizer --tool T ... python -I -m ...memcheck_run`):
the reference builds Model and the inputs from seeds the judge gives; the process then confines itself
(the worker's seccomp filter and audit hook) before any candidate code loads; the candidate's libraries
are those the judge built for its checked run (copied, judge-owned; nothing is built here); ModelNew
gets Model's weights and runs one forward; a marker line says when candidate code starts. The process is
a `Sandboxed` one: the candidate's own uid (its worker is gone by then), namespaces, rlimits, pids
cgroup and parent-death kill, as for the worker. PyTorch's caching allocator is off in it
(PYTORCH_NO_CUDA_MEMORY_CACHING=1), so each tensor is an allocation of its own size and an access past
its end is outside every allocation (with --padding, also where the next allocation would start).

The tools: memcheck always; racecheck where the candidate's sources declare shared memory
(`__shared__`, a textual heuristic: racecheck checks only shared-memory hazards, so a kernel without it
has nothing for it to find). API errors are not reported (--report-api-errors no): PyTorch itself
probes the runtime with calls that fail by design, and a failed call of the candidate's raises in the
ordinary calls already.

The decision: the sanitizer's exit status (--error-exitcode), which the candidate's process cannot set
(seccomp: no signals to other processes, no ptrace); its printed report is the message only. Errors
found: runtime failure with the first report. The call raised or the process died after the marker:
runtime (or crash) failure, under the sanitizer. No marker: the judge's own set-up failed (category
judge). Over its time limit: timeout (a memory-safety question asked and not answered is no pass).

Not covered: a candidate can tell it is under the sanitizer (its injection library, the slowness) and
behave; this finds honest bugs (a latent out-of-bounds read that does not fault), not adversaries,
whom the ordinary calls' checks are for. Accesses within one allocation (an index past a row, inside
the tensor) are not out of bounds to the sanitizer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from .verdict import Failure, FailureCategory as FC, SanitizerRun

ERROR_EXIT = 86               # the sanitizer's exit status when it found errors (--error-exitcode)
START_MARK = "memcheck_run: candidate code starts"
DONE_MARK = "memcheck_run: call done"
PADDING_BYTES = 256           # a padding buffer after every allocation: an overrun lands there, not in a neighbour
TOOLKIT_ROOTS = ("/usr/local/cuda",)  # where the toolkit is looked for after PATH, CUDA_HOME and CUDA_PATH
_SHARED = re.compile(r"\b__shared__\b")
_REPORT_MAX = 2000


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else in the CUDA toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda)."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *TOOLKIT_ROOTS):
        if root:
            path = Path(root) / "bin" / "compute-sanitizer"
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


def sanitizer_problem() -> str | None:
    """Why `memcheck=true` cannot be honoured on this host, or None."""
    if find_sanitizer() is None:
        return ("memcheck=true needs NVIDIA compute-sanitizer (part of the CUDA toolkit), found neither on PATH "
                "nor under $CUDA_HOME/bin, $CUDA_PATH/bin or /usr/local/cuda/bin; install it or set memcheck=false")
    return None


TOOLS = ("memcheck", "racecheck")


def tools_for(sources: list[str]) -> list[str]:
    """memcheck, and racecheck where any of the candidate's sources declares shared memory."""
    return list(TOOLS) if any(_SHARED.search(s) for s in sources) else ["memcheck"]


def sanitizer_argv(exe: str, tool: str, inner: list[str]) -> list[str]:
    argv = [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "20",
            "--report-api-errors", "no"]
    if tool == "memcheck":
        argv += ["--padding", str(PADDING_BYTES)]
    return argv + inner


def parse_report(text: str) -> tuple[int | None, str | None]:
    """(errors the summary counts, the first error report) from compute-sanitizer's output: report lines
    start with '========= ' (the sanitizer's prefix); a report runs from its first line to the next bare
    prefix line; host backtrace frames are left out of the message."""
    errors = None
    for pattern in (r"ERROR SUMMARY:\s*(\d+)\s+errors?", r"RACECHECK SUMMARY:.*?\((\d+)\s+errors?"):
        found = re.findall(pattern, text)
        if found:
            errors = max(errors or 0, max(int(x) for x in found))
    lines: list[str] = []
    for line in text.splitlines():
        if not line.startswith("========="):
            continue  # the program's own output, interleaved
        body = line[len("========="):]
        content = body.strip()
        if not lines:
            if content and not content.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY",
                                                   "LEAK SUMMARY", "Warning")) and not body.startswith("    "):
                lines.append(content)
            continue
        if not content or not body.startswith("    "):
            break  # the bare prefix line (or the next report) ends the first one
        if "Host Frame" not in content and "Saved host backtrace" not in content:
            lines.append(content)
    first = "\n".join(lines)[:_REPORT_MAX] if lines else None
    return errors, first


class Stash:
    """Copies of the libraries the candidate's checked run loaded (the workspace's cuda_extension.so and
    every load_inline build, lib_<name>.so, from its worker's folder), taken before that folder goes.
    `cleanup()` removes them: the harness lists it with the evaluation's processes, which are all
    cleaned up when the evaluation ends, however it ends."""

    def __init__(self, workdir: Path, dest: Path):
        self.folder = dest
        dest.mkdir(parents=True, exist_ok=True)
        self.libraries: list[Path] = []
        for path in sorted(workdir.glob("lib_*.so")) + [workdir / "cuda_extension.so"]:
            if path.is_file():
                shutil.copy2(path, dest / path.name)
                self.libraries.append(dest / path.name)

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def failure_of(run: SanitizerRun, log_tail: str) -> Failure | None:
    """The verdict's failure for one sanitizer run (module docstring), or None when it passed."""
    if run.exit_code == ERROR_EXIT:
        report = run.first_report or "(no report printed; the sanitizer's exit status says it found errors)"
        count = f"{run.errors} error{'s' if run.errors != 1 else ''}" if run.errors is not None else "errors"
        return Failure(category=FC.RUNTIME, message=f"compute-sanitizer {run.tool} found {count} in one checked "
                                                    f"call; the first:\n{report}")
    started = START_MARK in log_tail
    if run.exit_code is None:
        if not started:
            return Failure(category=FC.JUDGE, message=f"compute-sanitizer {run.tool} did not start the candidate "
                                                      f"within {run.seconds:.0f} s:\n{log_tail[-1500:]}")
        return Failure(category=FC.TIMEOUT, message=f"one checked call under compute-sanitizer {run.tool} did not "
                                                    f"finish within {run.seconds:.0f} s: memory safety not established")
    if run.exit_code == 0 and DONE_MARK in log_tail:
        return None
    if not started:
        return Failure(category=FC.JUDGE, message=f"compute-sanitizer {run.tool} could not run the candidate "
                                                  f"(exit {run.exit_code}) before any of its code loaded:\n"
                                                  f"{log_tail[-1500:]}")
    category = FC.CRASH if run.exit_code < 0 or run.exit_code > 128 else FC.RUNTIME
    return Failure(category=category, message=f"under compute-sanitizer {run.tool}, the candidate's checked call "
                                              f"failed (exit {run.exit_code}):\n{log_tail[-1500:]}")


def _log_head(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode(errors="replace")
    except OSError:
        return ""


def run_tool(tool: str, spawn, limit_s: float) -> tuple[SanitizerRun, str]:
    """Run one tool: `spawn(argv_prefix)` starts the sandboxed process (the caller's `Sandboxed`, whose
    log holds the sanitizer's and the program's output) and returns it. Waits at most `limit_s`; the
    process and everything of its uid is cleaned up whatever happens."""
    exe = find_sanitizer()
    if exe is None:
        raise RuntimeError(sanitizer_problem())
    t0 = time.monotonic()
    proc = spawn(lambda inner: sanitizer_argv(exe, tool, inner))
    try:
        try:
            code = proc.proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
        log = proc.log_tail(200_000)
        # the start marker comes before any candidate output: read from the log's head, so that a
        # candidate printing more than the tail holds cannot pass its own failure off as the judge's
        head = _log_head(proc.log_path, 65_536)
        if START_MARK in head and START_MARK not in log:
            log = f"{START_MARK}\n...\n{log}"
    finally:
        proc.cleanup()
    errors, first = parse_report(log)
    return SanitizerRun(tool=tool, exit_code=code, errors=errors, first_report=first,
                        seconds=round(time.monotonic() - t0, 3)), log


def tool_limit_s(config) -> float:
    """How long one tool's run may take: the candidate's start and one call 10-100x slower than usual."""
    return config.init_timeout_s + 20 * config.call_timeout_s


def hold_limit_s(config) -> float:
    """The longest a candidate's sanitizer runs hold the GPU's judge lock (shared, harness._memcheck):
    every tool at its limit. Another judge's call waits at least this long before it calls the
    lock stuck (calls.CallLoop._lock_limit_s)."""
    return len(TOOLS) * tool_limit_s(config)


def check_candidate(*, task_source: str, model_new: str, libraries: list[Path], sources: list[str],
                    init_seed: int, input_seed: int, config, work_root: Path, uid: int | None,
                    live: list, device: str = "cuda") -> tuple[list[SanitizerRun], Failure | None]:
    """Each tool (`tools_for(sources)`) on one checked call of the candidate, in a fresh sandboxed
    process under `uid` (the candidate worker's, free again once that worker is gone); stops at the
    first tool that fails. `live`: the evaluation's processes, where each is listed while it runs."""
    from .sandbox import SandboxSpec, Sandboxed, new_workdir, python_argv
    from .protocol import MEMCHECK_GO_FILE

    runs: list[SanitizerRun] = []
    limit_s = tool_limit_s(config)
    for tool in tools_for(sources):
        workdir = new_workdir(work_root / "runs", f"{tool}-")
        inner = python_argv("cuda_agent.judge.memcheck_run", "--device", device, "--init-seed", str(init_seed),
                            "--input-seed", str(input_seed), "--policy", config.policy)

        def spawn(wrap, workdir=workdir, inner=inner):
            spec = SandboxSpec(argv=wrap(inner), workdir=workdir, uid=uid, env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
                               hide=(config.cache_dir, work_root), landlock=config.landlock_mode())
            proc = Sandboxed(spec)
            live.append(proc)
            # the judge's files, written after the uid took the folder (they stay the judge's), then `go`
            (workdir / "model.py").write_text(task_source)
            (workdir / "model_new.py").write_text(model_new)
            (workdir / "libs").mkdir()
            for lib in libraries:
                shutil.copy2(lib, workdir / "libs" / lib.name)
            for path in [workdir / "model.py", workdir / "model_new.py", workdir / "libs",
                         *(workdir / "libs").iterdir()]:
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
            (workdir / MEMCHECK_GO_FILE).write_text("")
            return proc

        run, log = run_tool(tool, spawn, limit_s)
        runs.append(run)
        failure = failure_of(run, log)
        if failure is not None:
            return runs, failure
    return runs, None
