"""The agent's tools over one workspace, and the judge behind them.

`Toolbox` is the agent's environment (`cuda_agent.rollout.env.Environment`): `reset()` gives the task and the
tools (OpenAI function schemas, one pydantic model per tool), `step(call)` runs one tool call and
returns a `StepResult`; `call(name, arguments)` is the same for a name and arguments, returning
an `Observation`. A bad call (malformed arguments, unknown tool, wrong arguments, a path outside
the workspace, an edit of a read-only file) is an observation that says what was wrong, never an
exception; the judge being unable to work at all is `JudgeFailure`.

What is and is not isolated:
- file tools resolve every path (symlinks included) inside the workspace and refuse the
  read-only files (model.py, the fixed infrastructure, SKILL.md);
- `run_shell` runs bash in its own session with a time limit that kills the whole process group,
  an environment holding only what the toolchain needs (no API keys or other secrets of the
  parent), a private HOME/TMPDIR and a cap on output size. It is not a sandbox: it runs with the
  user's rights, so run untrusted models in a container. Nothing it can do changes a verdict:
  the judge reads the reference from the task, the infrastructure from this package, and builds
  and runs candidates in its own sandbox.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cuda_agent.candidate import Candidate, CandidateError
from cuda_agent.judge import FailureCategory, JudgeError, Verdict
from cuda_agent.judge.devlock import counters_lock
from cuda_agent.llm import ToolCall
from cuda_agent.hardware import ncu
from cuda_agent.report import fmt_pct, fmt_x
from cuda_agent.reward import Reward, RewardConfig, reward_of
from cuda_agent.tasks import Task

from cuda_agent.rollout.env import Reset, StepResult
from cuda_agent.rollout.evaluator import Evaluator, candidate_verdict
from cuda_agent.rollout.outcome import JudgeFailure

from .workspace import READ_ONLY

# ---------------------------------------------------------------------------------------------
# Observations


@dataclass
class Observation:
    """What a tool call returned to the model, plus what the loop needs to know about it."""

    text: str
    ok: bool = True                     # False: refused, failed, or the candidate was rejected
    verdict: Verdict | None = None      # set by verify/profile/submit
    candidate: Candidate | None = None  # the candidate that verdict is about
    submitted: bool = False
    reward: Reward | None = None        # the verdict scored by the toolbox's RewardConfig


_ERROR_LINE = re.compile(r"error|Error|ERROR|FAILED|Traceback|exception|Exception|undefined|fatal|warning")


def truncate(text: str, limit: int) -> str:
    """Cut `text` to about `limit` characters: the head, every error-looking line of the middle
    that fits, and the tail (where compilers and tracebacks put the decisive part)."""
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    if len(lines) < 3:  # one giant line: keep both ends
        half = max(limit // 2 - 40, 1)
        return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
    head_budget, tail_budget = limit // 5, limit // 2
    err_budget = limit - head_budget - tail_budget - 120

    def take(seq, budget):
        out, used = [], 0
        for line in seq:
            line = line if len(line) <= 500 else line[:500] + " [...]"
            if used + len(line) + 1 > budget:
                break
            out.append(line)
            used += len(line) + 1
        return out

    head = take(lines, head_budget)
    tail = take(reversed(lines[len(head):]), tail_budget)[::-1]
    middle = lines[len(head): len(lines) - len(tail)]
    errors = take((ln for ln in middle if _ERROR_LINE.search(ln)), err_budget)
    note = f"[... {len(middle)} lines cut" + (f"; {len(errors)} error lines kept ...]" if errors else " ...]")
    return "\n".join(head + [note] + errors + (["[...]"] if errors else []) + tail)


# ---------------------------------------------------------------------------------------------
# Verdicts as the model reads them


def verdict_text(v: Verdict, focus: Literal["verify", "profile", "submit"], reward: Reward) -> str:
    """A verdict as the model should see it: the failure first, then the numbers that matter."""
    lines = []
    if v.failure is not None:
        lines.append(f"FAILED ({v.failure.category.value}): {v.failure.message}")
    else:
        lines.append(f"PASSED: {v.n_checked} outputs matched the reference on fresh inputs "
                     f"(max abs err {_g(v.max_abs_err)}, max rel L2 err {_g(v.max_rel_l2_err)})")
    if v.policy_violations:
        lines.append("policy violations:")
        lines += [f"  - {p}" for p in v.policy_violations[:10]]
    if v.correct and v.runtime is not None:
        t = v.runtime
        lines.append(f"runtime {t.median_ms:.4f} ms (median of {t.n}; p10 {t.p10_ms:.4f}, p90 {t.p90_ms:.4f})")
        lines.append(f"eager   {_ms(v.eager_ms)}  -> speed-up {fmt_x(v.speedup_vs_eager)}")
        if v.compile_ms is None:
            lines.append("torch.compile: not measured by this judge (compile_mode none)")
        else:
            lines.append(f"torch.compile ({v.compile_mode}) {_ms(v.compile_ms)}  -> speed-up {fmt_x(v.speedup_vs_compile)}")
    sol = v.speed_of_light
    if sol is not None and sol.sol_ms is not None:
        w = sol.work
        mine = f"your runtime is {fmt_pct(v.sol_share)} of it, " if v.correct and v.runtime is not None else ""
        lines.append(f"speed-of-light {sol.sol_ms:.4f} ms on {sol.gpu_model} ({sol.bound}-bound: at least "
                     f"{w.dram_bytes / 1e6:.1f} MB through DRAM, {w.flops / 1e9:.2f} GFLOP): {mine}"
                     f"eager {fmt_pct(v.eager_sol_share)}")
    lines.append(f"reward {reward.value:g} ({reward.reason})")
    if focus != "verify":
        build = "-" if v.build_s is None else f"{v.build_s:.1f} s{' (cached)' if v.build_cached else ''}"
        phases = ", ".join(f"{k} {s:.1f} s" for k, s in v.phase_s.items() if s >= 0 and ":" not in k)
        lines.append(f"build {build}; judged in {v.judge_s or 0:.1f} s ({phases})")
    lines += [f"note: {n}" for n in v.task_warnings + v.notes]
    return "\n".join(lines)


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f} ms"


# ---------------------------------------------------------------------------------------------
# Tool arguments: one model per tool; the docstring is the description the model sees.


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListFiles(_Args):
    """List the files under a folder of the workspace, with sizes; read-only files are marked."""

    path: str = Field(".", description="folder relative to the workspace root")


class ReadFile(_Args):
    """Read a text file of the workspace; lines come numbered."""

    path: str = Field(description="file path relative to the workspace root")
    start_line: int = Field(1, ge=1, description="first line to show (1-based)")
    end_line: int | None = Field(None, ge=1, description="last line to show (default: to the end)")


class WriteFile(_Args):
    """Create or replace a file of the workspace (model_new.py, kernels/...). Read-only files are refused."""

    path: str = Field(description="file path relative to the workspace root, e.g. kernels/my_op.cu")
    content: str = Field(description="the whole new content of the file")


class EditFile(_Args):
    """Replace an exact snippet of a file. old_text must occur exactly once unless replace_all is true."""

    path: str = Field(description="file path relative to the workspace root")
    old_text: str = Field(description="the exact text to replace, whitespace included")
    new_text: str = Field(description="the replacement")
    replace_all: bool = Field(False, description="replace every occurrence")


class RunShell(_Args):
    """Run a bash command in the workspace (no secrets in its environment). Returns the exit code and output."""

    command: str = Field(description="the bash command line")
    timeout_s: int = Field(120, ge=1, le=600, description="time limit; the whole process group is killed after it")


class Compile(_Args):
    """Build kernels/* with the fixed bindings exactly as the judge does, and run its policy checks."""


class Verify(_Args):
    """Judge the workspace: build, policy, correctness on fresh inputs, timing against eager and torch.compile."""


class Profile(_Args):
    """Where the time goes. target=reference: the reference's operators and their times (start here).
    target=candidate: the judge's timing of your ModelNew against eager, torch.compile and the task's
    speed-of-light, and on CUDA Nsight Compute's counters per kernel (duration, DRAM and SM throughput as
    shares of peak, occupancy, top stall reasons, and whether it is memory-, compute-, latency- or launch-bound)."""

    target: Literal["candidate", "reference"] = Field("candidate", description="what to profile")


class Submit(_Args):
    """Judge the workspace as the final answer. Ends the run if it is correct; otherwise says why not."""


TOOLS: dict[str, type[_Args]] = {
    "list_files": ListFiles, "read_file": ReadFile, "write_file": WriteFile, "edit_file": EditFile,
    "run_shell": RunShell, "compile": Compile, "verify": Verify, "profile": Profile, "submit": Submit,
}


def _schema(model: type[BaseModel]) -> dict:
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    schema = strip(model.model_json_schema())
    schema.setdefault("properties", {})
    return schema


def tool_specs() -> list[dict]:
    """The tools as OpenAI function-calling schemas."""
    return [{"type": "function", "function": {
        "name": name, "description": " ".join((model.__doc__ or "").split()), "parameters": _schema(model)}}
        for name, model in TOOLS.items()]


# ---------------------------------------------------------------------------------------------
# The toolbox


class ToolConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    observation_chars: int = Field(10_000, ge=500, description="longest observation; longer ones are cut")
    max_file_bytes: int = Field(1_000_000, description="largest file write_file accepts")
    shell_output_bytes: int = Field(64 << 20, description="largest file (output included) a shell command may "
                                                          "write (RLIMIT_FSIZE)")
    profile_timeout_s: float = Field(600.0, description="limit on one profiling run")


class ToolError(Exception):
    """A refused or impossible tool call; its message goes back to the model."""


SHELL_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES",
                  "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CC", "CXX",
                  "OMP_NUM_THREADS", "TORCH_CUDA_ARCH_LIST")


class Toolbox:
    """One workspace, its tools, and the judge behind them."""

    def __init__(self, task: Task, workspace: Path, evaluator: Evaluator, config: ToolConfig | None = None,
                 reward: RewardConfig | None = None):
        """`evaluator`: how the judge is reached (any `rollout.evaluator.Evaluator`). `reward`: how this
        environment scores the judge's verdicts (the judge does not); every observation shows that
        reward and every StepResult carries it, the one number the episode is rewarded with."""
        self.task = task
        self.reward = reward or RewardConfig()
        self.root = Path(workspace).resolve()
        self.evaluator = evaluator
        self.config = config or ToolConfig()
        self._home = Path(tempfile.mkdtemp(prefix="cuda-agent-shell-"))
        self._verdicts: dict[str, Verdict] = {}   # candidate hash -> verdict, so an unchanged verify is free

    def close(self) -> None:
        shutil.rmtree(self._home, ignore_errors=True)

    # ------------------------------------------------------------------------------ environment
    def reset(self) -> Reset:
        return Reset(task=self.task, device=self.evaluator.device, tools=tool_specs(), reward=self.reward)

    def step(self, call: ToolCall) -> StepResult:
        """One tool call of the model. Raises JudgeFailure when the judge cannot work at all."""
        if call.error:  # the reply's arguments did not parse: the model is told, nothing runs
            obs = Observation(f"error: malformed call of {call.name or 'a tool'}: {call.error}", ok=False)
        else:
            try:
                obs = self.call(call.name, call.arguments or {})
            except JudgeError as exc:
                raise JudgeFailure(str(exc)) from exc
        return StepResult(observation=obs.text, ok=obs.ok, verdict=obs.verdict, candidate=obs.candidate,
                          reward=obs.reward, terminated=obs.submitted)

    # ------------------------------------------------------------------------------ dispatch
    def call(self, name: str, arguments: dict) -> Observation:
        """Run one tool. JudgeError (the judge cannot work at all) is the only exception that escapes."""
        model = TOOLS.get(name)
        if model is None:
            return Observation(f"error: unknown tool {name!r}; the tools are: {', '.join(TOOLS)}", ok=False)
        try:
            args = model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return Observation(f"error: bad arguments for {name}: {problems}. Expected parameters: "
                               f"{_schema(model)['properties']}", ok=False)
        try:
            obs = getattr(self, f"_{name}")(args)
        except ToolError as exc:
            obs = Observation(f"error: {exc}", ok=False)
        except CandidateError as exc:
            obs = Observation(f"error: the workspace is not a candidate yet: {exc}", ok=False)
        except OSError as exc:  # e.g. writing over a folder, a full disk
            obs = Observation(f"error: {type(exc).__name__}: {exc}", ok=False)
        obs.text = truncate(obs.text, self.config.observation_chars)
        return obs

    # ------------------------------------------------------------------------------ paths
    def resolve(self, path: str, *, write: bool = False) -> Path:
        if not path or "\0" in path:
            raise ToolError("empty or invalid path")
        full = (self.root / path).resolve()
        if full != self.root and self.root not in full.parents:
            raise ToolError(f"{path}: outside the workspace")
        rel = full.relative_to(self.root).as_posix()
        if write and rel in READ_ONLY:
            raise ToolError(f"{rel} is read-only (the reference, the fixed infrastructure and SKILL.md "
                            "cannot be changed); write model_new.py and files under kernels/")
        return full

    def candidate(self) -> Candidate:
        return Candidate.from_path(self.root)

    # ------------------------------------------------------------------------------ files
    def _list_files(self, a: ListFiles) -> Observation:
        base = self.resolve(a.path)
        if not base.is_dir():
            raise ToolError(f"{a.path}: not a folder")
        rows = []
        for p in sorted(base.rglob("*")):
            if len(rows) >= 500:
                rows.append("[... more files not listed]")
                break
            rel = p.relative_to(self.root).as_posix()
            if p.is_dir():
                continue
            mark = "  (read-only)" if rel in READ_ONLY else ""
            rows.append(f"{rel}  {p.stat().st_size} B{mark}")
        return Observation("\n".join(rows) or "(no files)")

    def _read_file(self, a: ReadFile) -> Observation:
        path = self.resolve(a.path)
        if not path.is_file():
            raise ToolError(f"{a.path}: no such file")
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            raise ToolError(f"{a.path}: not a text file") from None
        end = min(a.end_line or len(lines), len(lines))
        width = len(str(max(end, 1)))
        body = "\n".join(f"{i:>{width}}| {lines[i - 1]}" for i in range(a.start_line, end + 1))
        return Observation(body or f"({a.path} has {len(lines)} lines)")

    def _write_file(self, a: WriteFile) -> Observation:
        path = self.resolve(a.path, write=True)
        data = a.content.encode()
        if len(data) > self.config.max_file_bytes:
            raise ToolError(f"{len(data)} bytes; files over {self.config.max_file_bytes} bytes are refused")
        if path.is_dir():
            raise ToolError(f"{a.path}: is a folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return Observation(f"wrote {len(data)} bytes ({a.content.count(chr(10)) + 1} lines) to "
                           f"{path.relative_to(self.root).as_posix()}")

    def _edit_file(self, a: EditFile) -> Observation:
        path = self.resolve(a.path, write=True)
        if not path.is_file():
            raise ToolError(f"{a.path}: no such file")
        text = path.read_text()
        count = text.count(a.old_text) if a.old_text else 0
        if count == 0:
            raise ToolError(f"old_text not found in {a.path} (it must match exactly, whitespace included)")
        if count > 1 and not a.replace_all:
            raise ToolError(f"old_text occurs {count} times in {a.path}; add context to make it unique "
                            "or set replace_all")
        new = text.replace(a.old_text, a.new_text) if a.replace_all else text.replace(a.old_text, a.new_text, 1)
        path.write_text(new)
        start = text[: text.find(a.old_text)].count("\n")  # lines before the first edit are unchanged
        lines = new.splitlines()
        lo, hi = max(start - 3, 0), min(start + a.new_text.count("\n") + 4, len(lines))
        snippet = "\n".join(f"{i + 1}| {lines[i]}" for i in range(lo, hi))
        return Observation(f"replaced {count if a.replace_all else 1} occurrence(s) in {a.path}:\n{snippet}")

    # ------------------------------------------------------------------------------ shell
    def shell_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in SHELL_ENV_KEEP if k in os.environ}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
        env.update(HOME=str(self._home), TMPDIR=str(self._home), PYTHONDONTWRITEBYTECODE="1")
        return env

    def run_process(self, argv: list[str], timeout_s: float) -> tuple[int | None, str, str]:
        """Run `argv` in the workspace in its own session; (exit code or None on timeout, stdout, stderr).
        The whole process group is killed on timeout and whatever it left running is killed after."""
        # the file-size limit through bash's ulimit (soft and hard): no preexec_fn, which is unsafe
        # while other threads run agents
        blocks = max(self.config.shell_output_bytes // 1024, 1)
        argv = ["bash", "-c", f'ulimit -f {blocks} && exec "$@"', "cuda-agent-tool", *argv]
        with tempfile.TemporaryFile(dir=self._home) as out, tempfile.TemporaryFile(dir=self._home) as err:
            proc = subprocess.Popen(argv, cwd=self.root, env=self.shell_env(), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True)
            try:
                code: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
            return code, _read_capped(out), _read_capped(err)

    def _run_shell(self, a: RunShell) -> Observation:
        code, out, err = self.run_process(["bash", "-c", a.command], a.timeout_s)
        text = out + (("\n" if out and not out.endswith("\n") else "") + err if err else "")
        status = f"timed out after {a.timeout_s} s (process group killed)" if code is None else f"exit code {code}"
        return Observation(f"{status}\n{text}".rstrip(), ok=code == 0)

    # ------------------------------------------------------------------------------ judge
    def _compile(self, a: Compile) -> Observation:
        outcome = self.evaluator.build(self.candidate(), self.task)
        failure = outcome.failure
        if failure is None:
            how = "unchanged, from the build cache" if outcome.cached else f"built in {outcome.seconds:.1f} s"
            text = f"compile: OK ({how})"
        elif failure.category is FailureCategory.POLICY:
            text = ("compile: REFUSED, the judge rejects this candidate (policy):\n"
                    + "\n".join(f"  - {p}" for p in outcome.policy_violations[:10]))
        elif failure.category is FailureCategory.LOAD:
            text = f"compile: the workspace does not load: {failure.message}"
        else:
            text = f"compile: FAILED ({failure.category.value})\n{failure.message}"
        text += "".join(f"\nnote: {n}" for n in outcome.notes)
        return Observation(text, ok=outcome.compiled)

    def _judge(self, cand: Candidate, *, fresh: bool) -> Verdict:
        if not fresh and cand.hash in self._verdicts:
            return self._verdicts[cand.hash]
        verdict = candidate_verdict(self.evaluator, self.task, cand)  # JudgeError for the judge's own failure
        self._verdicts[cand.hash] = verdict
        return verdict

    def _verify(self, a: Verify) -> Observation:
        cand = self.candidate()
        seen = cand.hash in self._verdicts
        v = self._judge(cand, fresh=False)
        head = "verify (unchanged since the last judgement): " if seen else "verify: "
        r = reward_of(v, self.reward)
        return Observation(head + verdict_text(v, "verify", r), ok=v.correct, verdict=v, candidate=cand, reward=r)

    def _profile(self, a: Profile) -> Observation:
        if a.target == "reference":
            return self._profile_run([])
        cand = self.candidate()
        v = self._judge(cand, fresh=True)
        r = reward_of(v, self.reward)
        text = "profile (judge's timing): " + verdict_text(v, "profile", r)
        if v.correct and self.evaluator.device == "cuda" and self.evaluator.local:
            report = self.evaluator.build(cand, self.task)
            if report.library is not None:
                cand_args = ["--candidate", str(self.root / "model_new.py"), "--library", str(report.library),
                             "--confine"]
                counters, why = self._ncu_run(cand_args, v)
                if counters is not None:
                    text += "\n\nper-kernel profile (Nsight Compute, one call, cold L2):\n" + counters
                else:
                    detail = self._profile_run(cand_args)
                    text += (f"\n\nper-kernel profile (torch.profiler, warm cache, no counters; Nsight Compute "
                             f"unavailable: {why}):\n" + detail.text)
        elif v.correct and self.evaluator.device == "cuda":
            text += ("\n\nno per-kernel profile: the judge is a service on another machine and your library "
                     "was built there")
        return Observation(text, ok=v.correct, verdict=v, candidate=cand, reward=r)

    def _ncu_run(self, cand_args: list[str], v: Verdict) -> tuple[str | None, str]:
        """The candidate's kernels under Nsight Compute: (summary, "") or (None, why not). ncu is
        started here, on the judge's side; the candidate runs confined in the process it launches."""
        exe = shutil.which("ncu")
        if exe is None:
            return None, "ncu is not on PATH"
        reference = self._home / "reference_model.py"
        reference.write_text(self.task.source)
        log = self._home / "ncu.csv"
        log.unlink(missing_ok=True)
        # --clock-control none: the GPU's own clocks, as the judge times it (ncu locks base clocks by default)
        argv = [exe, "--csv", "--print-units", "base", "--profile-from-start", "off", "--clock-control", "none", "--metrics",
                ",".join(ncu.NCU_METRICS), "--log-file", str(log), sys.executable, "-m",
                "cuda_agent.agent.profile_run", "--reference", str(reference), "--device", "cuda", "--ncu",
                *cand_args]
        with self.evaluator.exclusive(), counters_lock().hold(exclusive=True):
            code, out, err = self.run_process(argv, self.config.profile_timeout_s)
        report = log.read_text(errors="replace") if log.exists() else ""
        problem = ncu.ncu_problem(report + "\n" + out + "\n" + err)
        if code is None:
            return None, f"ncu timed out after {self.config.profile_timeout_s:.0f} s"
        if problem is not None:
            return None, problem + (f"; exit code {code}: {_tail(err or out, 5)}" if code else "")
        peaks = None
        if v.speed_of_light is not None and v.speed_of_light.dram_gbs:
            peaks = v.speed_of_light.dram_gbs
        return ncu.render(ncu.summarize(ncu.parse_ncu(report)), peak_dram_gbs=peaks), ""

    def _profile_run(self, extra: list[str]) -> Observation:
        if not self.evaluator.local and self.evaluator.device == "cuda" and not _local_cuda():
            return Observation("profiling the reference runs on this machine, which has no GPU (the judge is a "
                               "service elsewhere): verify() and profile() give the judge's own times of your "
                               "candidate, eager PyTorch and torch.compile", ok=False)
        reference = self._home / "reference_model.py"
        reference.write_text(self.task.source)  # the task's copy: the workspace's model.py is not trusted
        argv = [sys.executable, "-m", "cuda_agent.agent.profile_run", "--reference", str(reference),
                "--device", self.evaluator.device, *extra]
        with self.evaluator.exclusive():
            code, out, err = self.run_process(argv, self.config.profile_timeout_s)
        if code != 0:
            why = "timed out" if code is None else f"failed (exit code {code})"
            return Observation(f"profiling {why}:\n{out}\n{_tail(err, 40)}", ok=False)
        return Observation(out.rstrip())

    def _submit(self, a: Submit) -> Observation:
        cand = self.candidate()
        v = self._judge(cand, fresh=False)
        r = reward_of(v, self.reward)
        if v.correct:
            return Observation("submitted: " + verdict_text(v, "submit", r), verdict=v, candidate=cand, submitted=True,
                               reward=r)
        return Observation("submit refused, the workspace does not pass the judge (fix it, or end without "
                           "submitting to keep the best verified version):\n" + verdict_text(v, "submit", r),
                           ok=False, verdict=v, candidate=cand, reward=r)


def _local_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _read_capped(fh, keep: int = 1 << 20) -> str:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(0)
    if size <= 2 * keep:
        return fh.read().decode(errors="replace")
    head = fh.read(keep).decode(errors="replace")
    fh.seek(size - keep)
    return f"{head}\n[... {size - 2 * keep} bytes cut ...]\n{fh.read().decode(errors='replace')}"


def _tail(text: str, n: int) -> str:
    return "\n".join(text.splitlines()[-n:])
