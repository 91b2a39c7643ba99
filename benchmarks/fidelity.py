"""Does the judge accept real published kernels? The KernelBench leaderboard corpus, judged.

The corpus is the public KernelBench leaderboard (anneouyang/KernelBenchLeaderboard), its
`docs/assets/` folder: `raw_data.json` (one record per published solution: `level`, `problem_id`,
`code` - a `load_inline` ModelNew module -, `model`, `torch_speedup`, `baseline_torch_time`,
`kernel_eval_time`, ...), `problems/l{level}_p{N}.py` (the reference tasks) and `data.json`
("Level L: N_Name" -> the records of that problem, by `file`). A record's `problem_id` counts from
0: its reference is `problems/l{level}_p{problem_id + 1}.py`; where `data.json` names the record,
the number in that name decides (and a disagreement is reported).

    python benchmarks/fidelity.py --corpus CORPUS/docs/assets --out fidelity-h200
    python benchmarks/fidelity.py --corpus ... --out ... --sample 60 --seed 1 --ncu-sample 8
    python benchmarks/fidelity.py --corpus ... --out ... --time-budget 8     # again until all are judged
    python benchmarks/fidelity.py --corpus ... --out ... --report-only --explain benchmarks/fidelity_reviewed.json
    python benchmarks/fidelity.py --corpus ... --out ... --prescreen       # static checks only, no device
    python benchmarks/fidelity.py --corpus ... --out ... --rejudge 'l3_p15_*'  # after a judge fix
    python benchmarks/fidelity.py --corpus ... --out ... --report-only --compare OTHER_OUT  # a repeat

1. Every record (or a sample stratified by level) is paired with its reference and judged through
   the project's pool (`cuda_agent.pool`), by default on CUDA with the lenient policy (published
   solutions use torch glue) and no torch.compile baseline. Each result is appended to
   `OUT/verdicts.jsonl` as it arrives: a rerun judges only the records that file lacks
   (`--rejudge GLOB` takes the matching records' verdicts out first, so they are judged again).
2. The share judged correct, overall and per level; every rejection is classified by explicit
   rules over the verdict's failure category and message (`RULES` below) into `solution_error`,
   `hack`, `policy_difference` or `judge_problem`; `--explain FILE` (JSON: record key -> {"class",
   "reason"}) overrides the rules for refusals a person has reviewed (`fidelity_reviewed.json`: the
   ones whose source shows a cause the rules cannot see, such as eval-mode BatchNorm in a training-
   mode task); a review never turns a pass into anything else.
3. Spearman's rank correlation of the judge's speed-up over eager with the leaderboard's recorded
   `torch_speedup`, over the records judged correct on both sides.
4. `--ncu-sample K` (CUDA, `ncu` on PATH): K correct solutions are run under Nsight Compute in a
   trusted subprocess outside the judge (this script with `--ncu-runner`: build ModelNew from the
   reference's init inputs, flush L2 between calls, profile a few forwards) and the summed
   `gpu__time_duration` per forward is set beside the judge's runtime of the same candidate. Their
   extensions are built first, `--ncu-build-parallel` at once, each in a folder of its own; the
   profiled runs, one at a time, then only load them.
5. `OUT/fidelity.json` (every figure, every record) and `OUT/fidelity.md` (the tables).

Exit codes: 0 the report was written; 2 usage error (missing corpus, bad options, an output folder
judged with other settings); 3 the judge could not run (no such device, the pool broke).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

CLASSES = ("solution_error", "hack", "policy_difference", "judge_problem")
EXIT_USAGE, EXIT_JUDGE = 2, 3
VERDICTS_FILE = "verdicts.jsonl"
RUN_FILE = "run.json"


class UsageError(Exception):
    """Bad arguments or inputs: reported in one line, exit 2."""


# ---------------------------------------------------------------------------------------------
# The corpus

@dataclass(frozen=True)
class Record:
    key: str                      # stable, readable identity: l{level}_p{N}_{model}
    level: int
    problem_id: int
    number: int                   # the N of problems/l{level}_p{N}.py
    model: str
    file: str
    code: str
    problem: Path
    task_name: str
    torch_speedup: float | None
    torch_compile_speedup: float | None
    baseline_torch_time: float | None
    kernel_eval_time: float | None


@dataclass
class Corpus:
    root: Path
    records: list[Record]
    skipped: list[str] = field(default_factory=list)        # records that could not be paired, and why
    conflicts: list[str] = field(default_factory=list)      # data.json and problem_id disagree


def corpus_root(path: Path) -> Path:
    """The folder holding raw_data.json: the given one, or docs/assets under a repository checkout."""
    if not path.exists():
        raise UsageError(f"{path}: corpus folder not found")
    for cand in (path, path / "docs" / "assets", path / "assets"):
        if (cand / "raw_data.json").is_file():
            if not (cand / "problems").is_dir():
                raise UsageError(f"{cand}: raw_data.json found but no problems/ folder beside it")
            return cand
    raise UsageError(f"{path}: not a KernelBench leaderboard corpus (no raw_data.json here or in docs/assets/)")


_NAME = re.compile(r"^Level\s+(\d+):\s*(\d+)_(.*)$")


def names_by_file(root: Path) -> tuple[dict[str, tuple[int, int]], dict[tuple[int, int], str]]:
    """From data.json: record file -> (level, problem number), and (level, number) -> task name."""
    path = root / "data.json"
    if not path.is_file():
        return {}, {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected an object mapping problem names to records")
    by_file, names = {}, {}
    for title, entries in data.items():
        m = _NAME.match(str(title))
        if not m:
            continue
        level, number = int(m[1]), int(m[2])
        names[(level, number)] = f"{number}_{m[3]}"
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("file"), str):
                by_file[entry["file"]] = (level, number)
    return by_file, names


def _number(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "model"


def load_corpus(path: Path) -> Corpus:
    root = corpus_root(path)
    raw_path = root / "raw_data.json"
    try:
        raw = json.loads(raw_path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{raw_path}: unreadable: {exc}") from None
    if not isinstance(raw, list):
        raise UsageError(f"{raw_path}: expected a list of records")
    by_file, names = names_by_file(root)
    corpus = Corpus(root=root, records=[])
    seen: Counter = Counter()
    for i, rec in enumerate(raw):
        where = f"raw_data.json[{i}]"
        if not isinstance(rec, dict):
            corpus.skipped.append(f"{where}: not an object")
            continue
        level, pid, code = rec.get("level"), rec.get("problem_id"), rec.get("code")
        if not isinstance(level, int) or not isinstance(pid, int) or not isinstance(code, str) or not code.strip():
            corpus.skipped.append(f"{where}: needs integer level and problem_id and a code string")
            continue
        file = str(rec.get("file") or "")
        number = pid + 1
        named = by_file.get(file)
        if named is not None:
            if named != (level, number):
                corpus.conflicts.append(f"{where} ({file}): data.json places it at level {named[0]} problem "
                                        f"{named[1]}, problem_id {pid} says level {level} problem {number}")
            level, number = named
        problem = root / "problems" / f"l{level}_p{number}.py"
        model = str(rec.get("display_name") or rec.get("model") or "unknown")
        if not problem.is_file():
            corpus.skipped.append(f"{where} ({model}): no reference problems/{problem.name}")
            continue
        key = f"l{level}_p{number}_{_slug(model)}"
        seen[key] += 1
        if seen[key] > 1:  # two published solutions of one model for one problem: keep both apart
            key = f"{key}_{file[:8] or seen[key]}"
        corpus.records.append(Record(
            key=key, level=level, problem_id=pid, number=number, model=model, file=file, code=code,
            problem=problem, task_name=names.get((level, number), f"l{level}_p{number}"),
            torch_speedup=_number(rec.get("torch_speedup")),
            torch_compile_speedup=_number(rec.get("torch_compile_speedup")),
            baseline_torch_time=_number(rec.get("baseline_torch_time")),
            kernel_eval_time=_number(rec.get("kernel_eval_time"))))
    corpus.records.sort(key=lambda r: (r.level, r.number, r.key))
    return corpus


def stratified_sample(records: list[Record], n: int | None, seed: int) -> list[Record]:
    """`n` records spread over the levels in proportion to their sizes (largest remainders), each
    level drawn at random with `seed`; all records when `n` is None or not smaller than the corpus."""
    if n is None or n >= len(records):
        return list(records)
    by_level: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        by_level[r.level].append(r)
    total = len(records)
    quotas = {lv: n * len(rs) / total for lv, rs in by_level.items()}
    take = {lv: int(q) for lv, q in quotas.items()}
    for lv in sorted(quotas, key=lambda lv: (-(quotas[lv] - take[lv]), lv))[: n - sum(take.values())]:
        take[lv] += 1
    rng = random.Random(seed)
    out = []
    for lv in sorted(by_level):
        out += rng.sample(by_level[lv], min(take[lv], len(by_level[lv])))
    out.sort(key=lambda r: (r.level, r.number, r.key))
    return out


def interleaved(records: list[Record]) -> list[Record]:
    """The judging order: the levels mixed in proportion to their shares (each level's records keep
    their order), so a run stopped by its time budget has judged a stratified part of the sample,
    not level 1 alone."""
    by_level: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        by_level[r.level].append(r)
    ranked = [(i / len(rs), lv, r) for lv, rs in by_level.items() for i, r in enumerate(rs)]
    return [r for _, _, r in sorted(ranked, key=lambda x: (x[0], x[1]))]


# ---------------------------------------------------------------------------------------------
# Results file (resumable)

def read_results(out: Path) -> dict[str, dict]:
    """Judged records by key. A line cut short by a killed run is ignored (that record is judged again)."""
    path = out / VERDICTS_FILE
    results: dict[str, dict] = {}
    if not path.is_file():
        return results
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("key"), str):
            results[entry["key"]] = entry
    return results


def forget_results(out: Path, patterns: list[str]) -> list[str]:
    """Take the verdicts of records whose key matches any of `patterns` (fnmatch) out of the
    results file, so a rerun judges them again; the file is replaced in one step. Returns the keys."""
    path = out / VERDICTS_FILE
    if not patterns or not path.is_file():
        return []
    kept, dropped = [], []
    for line in path.read_text().splitlines():
        try:
            key = json.loads(line).get("key")
        except (ValueError, AttributeError):
            key = None
        if isinstance(key, str) and any(fnmatch.fnmatchcase(key, p) for p in patterns):
            dropped.append(key)
        elif line.strip():
            kept.append(line)
    if dropped:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return dropped


def append_result(out: Path, entry: dict) -> None:
    path = out / VERDICTS_FILE
    with path.open("a+b") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell():
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":  # the previous run died mid-line: start a fresh one
                fh.write(b"\n")
        fh.write((json.dumps(entry) + "\n").encode())
        fh.flush()
        os.fsync(fh.fileno())


def check_run_settings(out: Path, settings: dict) -> None:
    """An output folder holds verdicts of one judge configuration; refuse to mix in another."""
    path = out / RUN_FILE
    if path.is_file():
        try:
            before = json.loads(path.read_text())
        except ValueError:
            before = None
        if isinstance(before, dict) and before.get("digest") != settings["digest"]:
            raise UsageError(f"{out} holds verdicts judged with other settings ({before.get('summary')}); "
                             f"these are {settings['summary']}: use another --out")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=1))


# ---------------------------------------------------------------------------------------------
# Judging

def judge_records(records: list[Record], out: Path, config, pool_config, done: dict[str, dict],
                  time_budget_s: float | None = None) -> tuple[int, int]:
    """Judge the records not in `done` through the pool, appending each result as it arrives.
    With a time budget, nothing new is submitted once it is spent and records still waiting for a
    judge worker are withdrawn (the ones being judged finish): a later run takes them up.
    Returns (judged now, left for a later run)."""
    import queue
    from concurrent.futures import CancelledError

    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import JudgeError
    from cuda_agent.pool import Pool, PoolError, PoolFull
    from cuda_agent.tasks import Task, TaskError

    console = Console(stderr=True)
    deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
    # A pool error says nothing about the record (no worker could start, the pool was shut down):
    # such records are judged again.
    todo = interleaved([r for r in records
                        if r.key not in done or (done[r.key].get("error") or {}).get("kind") == "pool_error"])
    console.print(f"{len(records)} records, {len(records) - len(todo)} already judged in {out / VERDICTS_FILE}; "
                  f"judging {len(todo)} on {config.device} ({config.policy} policy)")
    if not todo:
        return 0, 0
    base = {"settings": settings_of(config)["digest"]}
    pending = []
    for r in todo:
        try:
            task = Task.from_source(r.problem.read_text(), name=r.task_name, origin=str(r.problem),
                                    group=f"level{r.level}", level=r.level)
        except (TaskError, OSError, UnicodeDecodeError) as exc:
            entry = _entry(r, base, error={"kind": "task_error", "message": str(exc)})
            append_result(out, entry)
            done[r.key] = entry
            continue
        pending.append((r, task, Candidate.from_source(r.code, origin=f"{r.key}.py")))

    finished: queue.Queue = queue.Queue()
    futures = []
    feeder_error: list[BaseException] = []
    judged = 0
    with Pool(config, pool_config) as pool:
        def feed() -> None:
            submitted = 0
            try:
                for r, task, cand in pending:
                    wait = None if deadline is None else deadline - time.monotonic()
                    if wait is not None and wait <= 0:
                        break
                    try:
                        future = pool.submit(task, cand, timeout=wait)
                    except PoolFull:  # the budget ran out while the queue was full
                        break
                    futures.append(future)
                    submitted += 1
                    future.add_done_callback(lambda f, r=r, task=task, cand=cand: finished.put((r, task, cand, f)))
            except PoolError as exc:
                feeder_error.append(exc)
            finally:
                finished.put(("fed", submitted))

        feeder = threading.Thread(target=feed, name="fidelity-feeder", daemon=True)
        feeder.start()
        correct = failed = received = 0
        expected: int | None = None
        withdrawn = False
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                      console=console, transient=True) as progress:
            bar = progress.add_task("judging", total=len(pending), status="")
            while expected is None or received < expected:
                if deadline is not None and not withdrawn and time.monotonic() >= deadline:
                    withdrawn = True
                    for f in list(futures):
                        f.cancel()  # only those still waiting for a judge worker; running ones finish
                try:
                    got = finished.get(timeout=1.0)
                except queue.Empty:
                    continue
                if got[0] == "fed":
                    expected = got[1]
                    if feeder_error and not futures:
                        raise feeder_error[0]
                    continue
                received += 1
                r, task, cand, future = got
                ids = {"task_id": task.id, "candidate_hash": cand.hash}
                try:
                    verdict = future.result()
                except CancelledError:
                    continue
                except JudgeError as exc:  # the judge could not use the task (baseline failed, reference broken)
                    entry = _entry(r, base | ids, error={"kind": "judge_error", "message": str(exc)})
                except PoolError as exc:
                    entry = _entry(r, base | ids, error={"kind": "pool_error", "message": str(exc)})
                except Exception as exc:  # anything else from the pool's side is the judge's, never the record's
                    entry = _entry(r, base | ids, error={"kind": "judge_error",
                                                         "message": f"{type(exc).__name__}: {exc}"})
                else:
                    entry = _entry(r, base | ids, verdict=verdict.model_dump(mode="json"))
                append_result(out, entry)
                done[r.key] = entry
                judged += 1
                ok = bool(entry.get("verdict") and entry["verdict"].get("correct"))
                correct += ok
                failed += not ok
                progress.update(bar, advance=1, description=f"judged {r.key}",
                                status=f"[green]{correct} correct[/green] [red]{failed} not[/red]")
        feeder.join()
    if feeder_error:
        console.print(f"[red]the pool stopped taking records: {feeder_error[0]}[/red]")
    left = len(pending) - judged
    if left:
        console.print(f"{left} records left for a later run (rerun with the same --out to judge them)")
    return judged, left


def _entry(r: Record, base: dict, verdict: dict | None = None, error: dict | None = None) -> dict:
    return {"key": r.key, "level": r.level, "problem": r.number, "problem_id": r.problem_id, "model": r.model,
            "file": r.file, "task": r.task_name, **base, "judged_at": time.time(), "verdict": verdict, "error": error}


def settings_of(config) -> dict:
    from cuda_agent.bench import settings_digest

    return {"digest": settings_digest(config),
            "summary": f"device={config.device} policy={config.policy} compile_mode={config.compile_mode}",
            "config": json.loads(config.model_dump_json(exclude={"cache_dir", "sandbox_uid", "use_zygote"}))}


# ---------------------------------------------------------------------------------------------
# Classification of rejections

@dataclass(frozen=True)
class Rule:
    """One explicit rule: matches a result whose failure category (or pool/judge error kind) is one of
    `kinds` and whose message matches `pattern` (when given) and `test` (when given)."""

    name: str
    cls: str
    kinds: tuple[str, ...]
    reason: str
    pattern: str | None = None
    test: object = None           # callable(message, config dict) -> bool

    def matches(self, kind: str, message: str, config: dict) -> bool:
        if kind not in self.kinds:
            return False
        if self.pattern and not re.search(self.pattern, message, re.I | re.S):
            return False
        return self.test is None or bool(self.test(message, config))


NEAR_FACTOR = 10.0  # an error within this factor of the bound is "just above it", not a wrong kernel

_ELEMENTWISE = re.compile(r"values outside atol=([0-9.eE+-]+), rtol=([0-9.eE+-]+) "
                         r"\(max abs error ([0-9.eE+-]+|inf|nan)")
_NORMWISE = re.compile(r"relative L2 error ([0-9.eE+-]+|inf|nan) (?:against the float64 reference )?exceeds "
                       r"(?:the bound )?([0-9.eE+-]+)")
# The noise-scaled bound's message: the error, the bound, and the float32 reference's own error
# against float64 (its rounding noise), from `cuda_agent.judge.compare`.
# (Older verdicts write the bound as clamp(M x NOISE, FLOOR, CEILING), newer ones as
# min(max(FLOOR, M x NOISE), CEILING + NOISE) or min(max(FLOOR, M x NOISE), CEILING + K x NOISE).)
_NOISE = re.compile(r"relative L2 error ([0-9.eE+-]+) against the float64 reference exceeds the bound "
                    r"([0-9.eE+-]+) = (?:clamp\(|min\(max\([0-9.eE+-]+, )[0-9.eE+-]+ x ([0-9.eE+-]+)[,)]")
KERNELBENCH_TOL = 1e-2   # KernelBench's atol = rtol: what the leaderboard accepted
APPROX_FACTOR = 1000.0   # an error this many times the reference's own rounding noise is no reordering


def approximation(message: str, config: dict) -> bool:
    """A mismatch far beyond the reference's own float32 rounding noise (no reordering of the same
    arithmetic gets there) yet within KernelBench's tolerance: a different, approximate computation
    (a tanh GELU for the exact one, say) that the leaderboard accepted and the judge's fp32 bound
    refuses by design."""
    m = _NOISE.search(message)
    if not m:
        return False
    err, noise = float(m[1]), float(m[3])
    return math.isfinite(err) and err <= KERNELBENCH_TOL and err > APPROX_FACTOR * max(noise, 1e-12)


def near_tolerance(message: str, config: dict) -> bool:
    """Whether a mismatch is only just outside the judge's bound (a tolerance question, not a bug):
    the max abs error within NEAR_FACTOR x atol, or the relative L2 error within NEAR_FACTOR x its bound."""
    factor = float(config.get("near_factor", NEAR_FACTOR))
    m = _ELEMENTWISE.search(message)
    if m:
        atol, err = float(m[1]), float(m[3])
        return math.isfinite(err) and err <= factor * atol
    m = _NORMWISE.search(message)
    if m:
        err, bound = float(m[1]), float(m[2])
        return math.isfinite(err) and err <= factor * bound
    return False


# First match wins. Kinds are the verdict's failure categories, or for results without a verdict
# the error kind: judge_error (JudgeError: baseline failed, reference unusable), pool_error (the pool
# or its transport), task_error (the reference file could not be read as a task).
RULES: tuple[Rule, ...] = (
    Rule("pool-error", "judge_problem", ("pool_error",), "the pool or its transport could not judge it"),
    Rule("baseline-failed", "judge_problem", ("judge_error",), "the judge's baseline of the reference failed",
         pattern=r"baseline failed"),
    Rule("reference-unusable", "judge_problem", ("judge_error", "task_error"),
         "the judge could not use the reference task"),
    Rule("judge-error", "judge_problem", ("judge",), "the judge itself broke"),
    Rule("pool-time-limit", "judge_problem", ("timeout",), "the pool's time limit on a judge worker, not a call",
         pattern=r"pool's time limit"),
    Rule("load-time-limit", "judge_problem", ("timeout",),
         "loading the module and constructing ModelNew outran the judge's limit (builds have their own)",
         pattern=r"loading the candidate did not finish"),
    Rule("call-timeout", "solution_error", ("timeout",), "a call of the solution outran the per-call limit"),
    Rule("build-time-limit", "judge_problem", ("compile_timeout",), "the build outran the judge's build limit"),
    Rule("build-flags", "judge_problem", ("compile",), "the judge refused the solution's compiler flags",
         pattern=r"flags not allowed"),
    Rule("wrong-backend", "judge_problem", ("compile",), "CUDA sources judged on the CPU backend",
         pattern=r"CUDA sources cannot be built for the CPU backend"),
    Rule("removed-torch-api", "solution_error", ("compile",),
         "uses a PyTorch C++ API the installed PyTorch no longer has (Tensor::type() given to AT_DISPATCH_*, "
         "deprecated since 1.x): it compiled against the leaderboard's older PyTorch",
         pattern=r"DeprecatedTypeProperties"),
    Rule("compile-error", "solution_error", ("compile",), "the solution's code does not compile"),
    Rule("reference-fallback", "hack", ("policy",), "ModelNew falls back on the reference Model",
         pattern=r"must derive from nn\.Module, not|reference Model may not be used"),
    Rule("clone-pattern", "judge_problem", ("policy",),
         "the C++ check's thread pattern matches a tensor's .clone(); a clone syscall is refused at link time anyway",
         pattern=r"threads \('clone\('\) is not allowed"),
    Rule("input-as-a-name", "judge_problem", ("policy",),
         "'input' refused as a name: published code names forward's argument so; the builtin reads stdin",
         pattern=r"use of 'input' is not allowed"),
    Rule("policy-refusal", "policy_difference", ("policy",),
         "refused by the judge's policy (KernelBench has no such rule)"),
    Rule("tampering", "hack", ("tampering",), "the solution changed the judge's state or files"),
    Rule("input-mutation", "policy_difference", ("mismatch",),
         "the judge refuses in-place changes to inputs; KernelBench does not check them",
         pattern=r"modified input \d+ in place"),
    Rule("lower-precision", "policy_difference", ("mismatch",),
         "lower-precision arithmetic (fp16, bf16 or TF32 operands or outputs) within KernelBench's 1e-2: the "
         "judge's precision probe found the output's response to a small change of the inputs lost in rounding",
         pattern=r"lower precision than the task(, not an approximation| on the calls after)"),
    Rule("approximation", "policy_difference", ("mismatch",),
         "an approximate computation: over 1000x the reference's own float32 rounding error, within "
         "KernelBench's 1e-2 tolerance; the judge's float32 bound refuses lower precision than the task",
         test=approximation),
    Rule("near-tolerance", "judge_problem", ("mismatch",), "error just above the judge's bound (within 10x)",
         test=near_tolerance),
    Rule("wrong-results", "solution_error", ("mismatch",), "wrong results far outside tolerance, shape or dtype"),
    Rule("timing-disagreement", "judge_problem", ("timing",),
         "the outside clock disagreed with the call's own: on published code, a noisy host more likely than a hack"),
    Rule("reading-back-inputs", "judge_problem", ("runtime",), "reading back the inputs failed",
         pattern=r"reading back the inputs failed"),
    Rule("memory-limit", "judge_problem", ("oom", "resource"),
         "the judge's memory or disk limit (the leaderboard ran it within its own)"),
    Rule("unsupported-build-call", "judge_problem", ("load", "init", "runtime"),
         "the judge does not support this way of building (extra_include_paths, cpp_extension.load)",
         pattern=r"is not supported by the judge|only load_inline \(or a workspace\) can build extensions"),
    Rule("raised-or-crashed", "solution_error", ("load", "init", "runtime", "crash"),
         "the solution raised or crashed (load, construction or forward)"),
)
FALLBACK = Rule("unclassified", "judge_problem", (), "no rule matched: needs a person's review")


def result_kind_and_message(entry: dict) -> tuple[str, str]:
    if entry.get("error"):
        return str(entry["error"].get("kind", "judge_error")), str(entry["error"].get("message", ""))
    v = entry.get("verdict") or {}
    failure = v.get("failure") or {}
    return str(failure.get("category", "judge")), str(failure.get("message", ""))


def classify(entry: dict, config: dict) -> tuple[str, str, str]:
    """(class, rule name, reason) of a result; class 'correct' for a verdict judged correct."""
    v = entry.get("verdict")
    if v and v.get("correct"):
        return "correct", "correct", "judged correct"
    kind, message = result_kind_and_message(entry)
    for rule in RULES:
        if rule.matches(kind, message, config):
            return rule.cls, rule.name, rule.reason
    return FALLBACK.cls, FALLBACK.name, FALLBACK.reason


def load_explain(path: Path | None) -> dict[str, dict]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--explain {path}: unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--explain {path}: expected an object mapping record keys to {{class, reason}}")
    out = {}
    for key, value in data.items():
        if isinstance(value, str):
            value = {"class": value}
        if not isinstance(value, dict) or value.get("class") not in CLASSES:
            raise UsageError(f"--explain {path}: {key}: class must be one of {', '.join(CLASSES)} "
                             "(a refusal the judge should not have made is a judge_problem)")
        out[key] = {"class": value["class"], "reason": str(value.get("reason", "reviewed"))}
    return out


def first_line(text: str, kind: str = "") -> str:
    """The line of a failure message that says what happened: the first one, except the first
    compiler error of a build log and the last line (the exception) of a traceback."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    if kind in ("compile", "compile_timeout"):
        line = next((x for x in lines if re.search(r"\berror\b", x, re.I)), lines[0])
    elif lines[0].startswith("Traceback (most recent call last)"):
        line = lines[-1]
    else:
        line = lines[0]
    return line[:240]


# ---------------------------------------------------------------------------------------------
# Static pre-screen (no device)

def prescreen_record(code: str, policy: str) -> list[tuple[str, str]]:
    """What the judge would refuse before running anything, as (failure category, message) in the
    judge's own words: the Python policy, the compiler flags and the C++ policy of every load_inline
    call whose arguments are literals (or module-level names bound to literals). An approximation
    of the judge's checks, which see the arguments load_inline is really called with."""
    import ast

    from cuda_agent.judge import policy as pol
    from cuda_agent.judge.build import check_flags
    from cuda_agent.judge.build import static_load_inline_calls
    from cuda_agent.judge.worker import load_inline_request

    def strings(value) -> list[str]:
        return [value] if isinstance(value, str) else [str(x) for x in value or []]

    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [("load", f"model_new: syntax error at line {exc.lineno}: {exc.msg}")]
    found = [("policy", v) for v in pol.check_python(code, policy)]
    # the judge's own reader of load_inline calls (the compile workers' plan): calls whose
    # arguments it cannot read statically are checked by the judge when they run, not here
    for _, args in static_load_inline_calls(tree, []):
        try:
            request = load_inline_request(*args.args, **args.kwargs)
        except RuntimeError as exc:  # what the worker's stand-in raises (extra_include_paths)
            found.append(("load", f"RuntimeError: {exc}"))
            continue
        bad = check_flags(strings(request["cflags"]) + strings(request["cuda_cflags"]) + strings(request["ldflags"]))
        if bad:
            found.append(("compile", f"compiler/linker flags not allowed: {' '.join(bad)}"))
        for key, file in (("cpp_sources", "main.cpp"), ("cuda_sources", "cuda.cu")):
            for src in strings(request[key]):
                found += [("policy", v) for v in pol.check_cpp(src, f"{request['name']}/{file}", policy)]
    return found


def prescreen(records: list[Record], policy: str, near_factor: float) -> dict:
    rows = []
    for r in records:
        found = prescreen_record(r.code, policy)
        if not found:
            continue
        entries = []
        for kind, message in found:
            cls, rule, reason = classify({"verdict": {"correct": False, "failure": {
                "category": kind, "message": message}}}, {"near_factor": near_factor})
            entries.append({"class": cls, "rule": rule, "category": kind, "message": first_line(message, kind)})
        rows.append({"key": r.key, "level": r.level, "findings": entries})
    first = Counter((x["findings"][0]["rule"], x["findings"][0]["class"]) for x in rows)
    every = Counter((f["rule"], f["class"]) for x in rows for f in {(f["rule"], f["class"]): f
                                                                    for f in x["findings"]}.values())
    return {"policy": policy, "records": len(records), "refused": len(rows),
            "first_finding": [{"rule": k[0], "class": k[1], "count": n} for k, n in first.most_common()],
            "any_finding": [{"rule": k[0], "class": k[1], "count": n} for k, n in every.most_common()],
            "list": rows}


def prescreen_markdown(pre: dict) -> str:
    lines = ["# Static pre-screen: what the judge refuses before running anything", "",
             f"{pre['refused']} of {pre['records']} records ({pre['policy']} policy). The judge stops at its "
             "first finding; a record can have several.", "",
             "| rule | class | records (first finding) | records (any finding) |", "|---|---|---|---|"]
    anyf = {(x["rule"], x["class"]): x["count"] for x in pre["any_finding"]}
    firstf = {(x["rule"], x["class"]): x["count"] for x in pre["first_finding"]}
    for k in sorted(anyf, key=lambda k: -anyf[k]):
        lines.append(f"| {k[0]} | {k[1]} | {firstf.get(k, 0)} | {anyf[k]} |")
    lines += ["", "| record | class | rule | message |", "|---|---|---|---|"]
    for x in pre["list"]:
        f = x["findings"][0]
        lines.append(f"| {x['key']} | {f['class']} | {f['rule']} | {f['message'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Statistics

def rankdata(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank (as scipy.stats.rankdata's 'average')."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the ranks (ties averaged). None below 3 pairs or
    when either side is constant."""
    if len(x) != len(y) or len(x) < 3:
        return None
    import numpy as np

    rx, ry = np.asarray(rankdata(x)), np.asarray(rankdata(y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    return None if den == 0 else float((rx * ry).sum()) / den


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


# ---------------------------------------------------------------------------------------------
# Nsight Compute

# The CSV reader is the package's (`cuda_agent.hardware.ncu`), shared with the agent's profile tool.
from cuda_agent.hardware.ncu import parse_ncu_csv  # noqa: E402


def ncu_runner(argv: list[str]) -> int:
    """Trusted runner of one published solution, outside the judge (run under ncu):
    build ModelNew from the reference's init inputs, then run forwards, each between
    cudaProfilerStart/Stop with L2 flushed before it, so ncu sees the forwards' kernels only."""
    p = argparse.ArgumentParser(prog="fidelity.py --ncu-runner")
    p.add_argument("problem", type=Path)
    p.add_argument("solution", type=Path)
    p.add_argument("--forwards", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--build-only", action="store_true",
                   help="build the solution's extensions and construct ModelNew, run no forward")
    args = p.parse_args(argv)
    import torch

    device = torch.device(args.device)
    ns: dict = {"__name__": "reference"}
    exec(compile(args.problem.read_text(), str(args.problem), "exec"), ns)
    # KernelBench runs a solution with the reference's globals in reach (sizes, helper names).
    sol = dict(ns, __name__="solution")
    exec(compile(args.solution.read_text(), str(args.solution), "exec"), sol)
    torch.manual_seed(args.seed)
    init = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ns["get_init_inputs"]()]
    # in the mode the judge (and KernelBench) runs it: as constructed, training mode, under no_grad;
    # eval() would switch a BatchNorm solution to its running statistics, another kernel
    model = sol["ModelNew"](*init).to(device)
    if args.build_only:
        print(json.dumps({"built": True}), file=sys.stderr)
        return 0
    torch.manual_seed(args.seed + 1)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    flush = None
    if device.type == "cuda":
        l2 = torch.cuda.get_device_properties(device).L2_cache_size or (64 << 20)
        flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device=device)
    with torch.no_grad():
        model(*inputs)  # warm-up: first-call set-up stays out of the profile
        shapes = []
        for _ in range(args.forwards):
            if flush is not None:
                flush.zero_()
                torch.cuda.synchronize(device)
                torch.cuda.profiler.start()
            out = model(*inputs)
            if flush is not None:
                torch.cuda.synchronize(device)
                torch.cuda.profiler.stop()
            outs = out if isinstance(out, (tuple, list)) else [out]
            shapes = [list(o.shape) for o in outs if isinstance(o, torch.Tensor)]
    print(json.dumps({"forwards": args.forwards, "output_shapes": shapes}), file=sys.stderr)
    return 0


def _runner(record: Record, folder: Path) -> list[str]:
    """The command line of the trusted runner (`--ncu-runner`) on the record's solution in `folder`."""
    return [sys.executable, str(Path(__file__).resolve()), "--ncu-runner", str(record.problem),
            str(folder / "solution.py")]


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


# ---------------------------------------------------------------------------------------------
# Report

def build_report(corpus: Corpus, records: list[Record], results: dict[str, dict], explain: dict[str, dict],
                 settings: dict, near_factor: float, ncu: list[dict] | None, ncu_note: str | None) -> dict:
    rows = []
    cfg = {"near_factor": near_factor}
    for r in records:
        entry = results.get(r.key)
        if entry is None:
            continue
        rule_cls, rule, reason = classify(entry, cfg)
        cls, reviewed = rule_cls, False
        if r.key in explain and rule_cls != "correct":  # a review explains a refusal, never overrides a pass
            cls, reason, reviewed = explain[r.key]["class"], explain[r.key]["reason"], True
        kind, message = result_kind_and_message(entry) if rule_cls != "correct" else ("", "")
        v = entry.get("verdict") or {}
        runtime = (v.get("runtime") or {}).get("median_ms")
        eager = (v.get("eager") or {}).get("median_ms")
        compiled = (v.get("compiled_ref") or {}).get("median_ms")
        correct = bool(v.get("correct"))
        rows.append({
            "key": r.key, "level": r.level, "problem": r.number, "task": r.task_name, "model": r.model,
            "correct": correct, "class": cls, "rule_class": rule_cls, "rule": rule, "reason": reason,
            "reviewed": reviewed, "category": kind, "message": first_line(message, kind),
            "runtime_ms": runtime, "eager_ms": eager, "compile_ms": compiled,
            "judge_speedup": eager / runtime if correct and runtime and eager else None,
            "judge_compile_speedup": compiled / runtime if correct and runtime and compiled else None,
            "recorded_speedup": r.torch_speedup, "recorded_compile_speedup": r.torch_compile_speedup,
        })
    levels = sorted({r.level for r in records})

    def share(rs: list[dict]) -> dict:
        n = len(rs)
        c = sum(x["correct"] for x in rs)
        classes = {k: sum(x["class"] == k for x in rs) for k in ("correct",) + CLASSES}
        # Agreement with the leaderboard where the judge differs from KernelBench only by design
        # (a documented policy difference), and the share with no judge problem at all.
        return {"judged": n, "correct": c, "share": c / n if n else None, "classes": classes,
                "share_with_policy": (c + classes["policy_difference"]) / n if n else None,
                "share_no_judge_problem": (n - classes["judge_problem"]) / n if n else None}

    per_level = {str(lv): share([x for x in rows if x["level"] == lv]) for lv in levels}
    rule_counts = Counter((x["rule"], x["rule_class"]) for x in rows if x["rule"] != "correct")

    def corr(field_j: str, field_r: str, rs: list[dict]) -> dict:
        pairs = [(x[field_j], x[field_r]) for x in rs
                 if x["correct"] and x[field_j] and x[field_r] and x[field_r] > 0]
        rho = spearman([a for a, _ in pairs], [b for _, b in pairs])
        ratio = geomean([a / b for a, b in pairs])
        return {"n": len(pairs), "spearman": rho, "geomean_judge_over_recorded": ratio}

    correlation = {"overall": corr("judge_speedup", "recorded_speedup", rows),
                   "per_level": {str(lv): corr("judge_speedup", "recorded_speedup",
                                               [x for x in rows if x["level"] == lv]) for lv in levels}}
    if any(x["judge_compile_speedup"] for x in rows):
        correlation["vs_compile"] = corr("judge_compile_speedup", "recorded_compile_speedup", rows)
    return {
        "corpus": str(corpus.root), "records_in_corpus": len(corpus.records), "selected": len(records),
        "judged": len(rows), "not_judged_yet": len(records) - len(rows),
        "skipped": corpus.skipped, "mapping_conflicts": corpus.conflicts,
        "settings": settings, "near_factor": near_factor,
        "overall": share(rows), "per_level": per_level,
        "rules": [{"rule": name, "class": cls, "count": n} for (name, cls), n in sorted(
            rule_counts.items(), key=lambda kv: (-kv[1], kv[0]))],
        "reviewed": sum(x["reviewed"] for x in rows),
        "rejections": [x for x in rows if not x["correct"] or x["class"] != "correct"],
        "correlation": correlation,
        "ncu": ncu, "ncu_note": ncu_note,
        "markers": marker_summary({r.key: (results[r.key].get("verdict") or {}) for r in records if r.key in results}),
        "records": rows,
    }


def marker_summary(verdicts: dict[str, dict], over: float = 1.02) -> dict:
    """How the judge's gated times of correct verdicts sit against their own end markers.

    A gated call's time is its start-to-end-marker time (`stream_ms`) unless the device looked busy
    past the end marker (side-stream work, or an idle marker made late by the host: timing.py
    `device_busy_ms`). Counted over the timed calls: how many were read past their end marker, and
    of those how many had the timing thread wait for a core meanwhile (`run_delay_ms`); listed: the
    verdicts whose runtime is more than `over` times the median end-marker time of the calls it
    was taken from (the last `runtime.n` timed calls), and whether that was the second round."""
    calls = past = waited = 0
    stretched = []
    for key, v in sorted(verdicts.items()):
        runtime = v.get("runtime") or {}
        if not v.get("correct") or runtime.get("source") != "gated":
            continue
        timed = [c for c in v.get("calls") or [] if c.get("role") == "timed"]
        timed = timed[-int(runtime.get("n") or len(timed)):]
        gated = [c for c in timed if c.get("stream_ms") is not None and c.get("inside_ms") is not None]
        for c in gated:
            calls += 1
            if c["inside_ms"] > c["stream_ms"] * 1.0001 + 1e-6:
                past += 1
                waited += (c.get("run_delay_ms") or 0.0) > 0.001
        if gated and runtime.get("median_ms"):
            ratio = runtime["median_ms"] / statistics.median(c["stream_ms"] for c in gated)
            if ratio > over:
                stretched.append({"key": key, "ratio": ratio,
                                  "second_round": any("second round" in n for n in v.get("notes") or [])})
    return {"gated_timed_calls": calls, "past_end_marker": past, "past_end_marker_waited": waited,
            "over": over, "stretched": stretched}


def compare_runs(mine: dict[str, dict], other: dict[str, dict], close: float = 0.005) -> dict:
    """The records both folders judged (`--compare`): whether the verdicts agree, and how the
    runtimes of those judged correct in both compare (this run's over the other's): the median
    ratio, how many agree within `close`, and the others by key, with how each was timed."""
    both = sorted(set(mine) & set(other))
    verdict = {k: ((mine[k].get("verdict") or {}), (other[k].get("verdict") or {})) for k in both}
    differ = [k for k, (a, b) in verdict.items() if bool(a.get("correct")) != bool(b.get("correct"))]
    ratios, apart = [], []
    for k, (a, b) in verdict.items():
        ra, rb = (a.get("runtime") or {}), (b.get("runtime") or {})
        if a.get("correct") and b.get("correct") and ra.get("median_ms") and rb.get("median_ms"):
            ratio = ra["median_ms"] / rb["median_ms"]
            ratios.append(ratio)
            if abs(ratio - 1) > close:
                apart.append({"key": k, "ratio": ratio, "ms": ra["median_ms"], "other_ms": rb["median_ms"],
                              "source": ra.get("source"), "other_source": rb.get("source")})
    return {"both": len(both), "verdicts_differ": differ, "timed_both": len(ratios),
            "median_ratio": statistics.median(ratios) if ratios else None, "close": close,
            "within_close": len(ratios) - len(apart), "apart": sorted(apart, key=lambda x: -abs(x["ratio"] - 1))}


def compare_sentence(c: dict) -> str:
    return (f"{c['both']} records judged in both runs, {len(c['verdicts_differ'])} with another verdict; of the "
            f"{c['timed_both']} correct in both, {c['within_close']} runtimes within {100 * c['close']:g}% "
            f"(median ratio {_fmt(c['median_ratio'], 4)})")


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(report: dict) -> str:
    o = report["overall"]
    lines = ["# Fidelity: the judge on the KernelBench leaderboard corpus", "",
             f"Corpus `{report['corpus']}`: {report['records_in_corpus']} records paired with a reference, "
             f"{report['selected']} selected, {report['judged']} judged. Judge: {report['settings']['summary']}.",
             ""]
    if report["skipped"]:
        lines += [f"Records not paired with a reference: {len(report['skipped'])}.", ""]
    if report["mapping_conflicts"]:
        lines += [f"data.json and problem_id disagree on {len(report['mapping_conflicts'])} records.", ""]
    lines += ["## Judged correct", "", "| level | judged | correct | share | solution_error | hack | "
              "policy_difference | judge_problem |", "|---|---|---|---|---|---|---|---|"]
    for name, s in list(report["per_level"].items()) + [("all", o)]:
        c = s["classes"]
        lines.append(f"| {name} | {s['judged']} | {s['correct']} | {_pct(s['share'])} | {c['solution_error']} | "
                     f"{c['hack']} | {c['policy_difference']} | {c['judge_problem']} |")
    lines += ["", summary_sentence(o)]
    lines += ["", "## Rules", "", "| rule | class | count |", "|---|---|---|"]
    lines += [f"| {x['rule']} | {x['class']} | {x['count']} |" for x in report["rules"]]
    if report["reviewed"]:
        lines += ["", f"{report['reviewed']} records classified by review (--explain) instead of the rules."]
    lines += ["", "## Speed-up vs eager: judge against the leaderboard's torch_speedup", "",
              "| scope | pairs | Spearman | geomean judge/recorded |", "|---|---|---|---|"]
    corr = report["correlation"]
    for name, c in [("all", corr["overall"])] + [(f"level {k}", v) for k, v in corr["per_level"].items()]:
        lines.append(f"| {name} | {c['n']} | {_fmt(c['spearman'])} | {_fmt(c['geomean_judge_over_recorded'])} |")
    if "vs_compile" in corr:
        c = corr["vs_compile"]
        lines.append(f"| vs torch.compile | {c['n']} | {_fmt(c['spearman'])} | "
                     f"{_fmt(c['geomean_judge_over_recorded'])} |")
    if report["ncu"] is not None or report["ncu_note"]:
        lines += ["", "## Nsight Compute: summed gpu__time_duration per forward beside the judge's runtime", ""]
        if report["ncu_note"]:
            lines += [report["ncu_note"], ""]
        if report["ncu"]:
            lines += ["| record | judge ms | ncu ms | judge/ncu | kernels/forward | note |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {x['key']} | {_fmt(x['judge_ms'])} | {_fmt(x['ncu_ms'])} | {_fmt(x['ratio'])} | "
                      f"{_fmt(x['kernels_per_forward'])} | {_ncu_row_note(x)} |" for x in report["ncu"]]
    c = report.get("compare")
    if c:
        lines += ["", f"## Against another run ({c['folder']})", "", compare_sentence(c)]
        if c["verdicts_differ"]:
            lines += ["", "Other verdicts: " + ", ".join(c["verdicts_differ"])]
        if c["apart"]:
            lines += ["", "| record | ms | other ms | ratio | timed | other timed |", "|---|---|---|---|---|---|"]
            lines += [f"| {x['key']} | {_fmt(x['ms'], 4)} | {_fmt(x['other_ms'], 4)} | {_fmt(x['ratio'])} | "
                      f"{x['source']} | {x['other_source']} |" for x in c["apart"]]
    m = report.get("markers")
    if m and m["gated_timed_calls"]:
        lines += ["", "## Gated times against their end markers", "", marker_sentence(m)]
        if m["stretched"]:
            lines += ["", "| record | runtime / end-marker time | second round |", "|---|---|---|"]
            lines += [f"| {x['key']} | {_fmt(x['ratio'])} | {'yes' if x['second_round'] else 'no'} |"
                      for x in m["stretched"]]
    lines += ["", "## Records not judged correct", "", "| record | class | rule | category | message |",
              "|---|---|---|---|---|"]
    for x in report["rejections"]:
        msg = x["message"].replace("|", "\\|")
        lines.append(f"| {x['key']} | {x['class']}{' (reviewed)' if x['reviewed'] else ''} | {x['rule']} | "
                     f"{x['category']} | {msg} |")
    return "\n".join(lines) + "\n"


def marker_sentence(m: dict) -> str:
    return (f"{m['past_end_marker']} of {m['gated_timed_calls']} gated timed calls of correct verdicts were timed "
            f"past their end marker ({m['past_end_marker_waited']} of them with the timing thread waiting for a "
            f"core meanwhile); {len(m['stretched'])} runtimes over {m['over']:g}x their calls' median "
            f"end-marker time.")


def summary_sentence(o: dict) -> str:
    """The overall shares in one sentence: judged correct, then what the rest comes down to."""
    c = o["classes"]
    return (f"{o['correct']} of {o['judged']} judged correct ({_pct(o['share'])}); counting the "
            f"{c['policy_difference']} refused by a documented policy difference as agreement, "
            f"{_pct(o.get('share_with_policy'))}; {c['judge_problem']} judge problems, so "
            f"{_pct(o.get('share_no_judge_problem'))} of the verdicts are correct or explained by the solution "
            f"or the policy.")


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal and console.width < 160:
        console.width = 160
    t = Table(title=f"judged correct ({report['settings']['summary']})")
    for col in ("level", "judged", "correct", "share") + CLASSES:
        t.add_column(col, justify="right" if col != "level" else "left")
    for name, s in list(report["per_level"].items()) + [("all", report["overall"])]:
        t.add_row(name, str(s["judged"]), str(s["correct"]), _pct(s["share"]),
                  *(str(s["classes"][c]) for c in CLASSES))
    console.print(t)
    console.print(summary_sentence(report["overall"]))
    rt = Table(title="rules")
    for col in ("rule", "class", "count"):
        rt.add_column(col)
    for x in report["rules"]:
        rt.add_row(x["rule"], x["class"], str(x["count"]))
    console.print(rt)
    if report["rejections"]:
        xt = Table(title="records not judged correct")
        for col in ("record", "class", "rule", "category", "message"):
            xt.add_column(col, overflow="fold")
        for x in report["rejections"]:
            xt.add_row(x["key"], x["class"] + (" (reviewed)" if x["reviewed"] else ""), x["rule"], x["category"],
                       x["message"])
        console.print(xt)
    c = report["correlation"]["overall"]
    console.print(f"Spearman (judge speed-up vs recorded torch_speedup): {_fmt(c['spearman'])} over {c['n']} "
                  f"records correct on both sides; geomean judge/recorded {_fmt(c['geomean_judge_over_recorded'])}")
    c = report.get("compare")
    if c:
        console.print(f"against {c['folder']}: " + compare_sentence(c) + "".join(
            f"\n  {x['key']}: {_fmt(x['ms'], 4)} vs {_fmt(x['other_ms'], 4)} ms ({_fmt(x['ratio'])}x)"
            for x in c["apart"]))
    m = report.get("markers")
    if m and m["gated_timed_calls"]:
        console.print(marker_sentence(m) + "".join(f"\n  {x['key']}: {_fmt(x['ratio'])}x"
                                                   + (" (second round)" if x["second_round"] else "")
                                                   for x in m["stretched"]))
    if report["ncu_note"]:
        console.print(report["ncu_note"])
    for x in report["ncu"] or []:
        note = _ncu_row_note(x)
        console.print(f"ncu {x['key']}: judge {_fmt(x['judge_ms'])} ms, kernels {_fmt(x['ncu_ms'])} ms per forward, "
                      f"ratio {_fmt(x['ratio'])}" + (f" ({note})" if note else ""))


# ---------------------------------------------------------------------------------------------
# Command line

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fidelity.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help="the leaderboard's docs/assets folder (or the checkout)")
    p.add_argument("--out", type=Path, required=True, help="output folder (verdicts.jsonl, fidelity.json, fidelity.md)")
    p.add_argument("--sample", type=int, help="judge N records, stratified by level (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--policy", choices=("strict", "lenient"), default="lenient")
    p.add_argument("--compile-mode", default="none",
                   choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "none"))
    p.add_argument("-c", "--set", dest="sets", action="append", default=[],
                   help="override one JudgeConfig field, e.g. -c n_timed=50")
    p.add_argument("--workers", type=int, help="judge workers (cuda: one per visible GPU; cpu: default 1)")
    p.add_argument("--compile-workers", type=int, help="compile workers (default: the pool's)")
    p.add_argument("--time-limit", type=float, help="seconds one record may hold a judge worker")
    p.add_argument("--explain", type=Path, help="JSON: record key -> {class, reason} for reviewed records")
    p.add_argument("--near-factor", type=float, default=NEAR_FACTOR,
                   help=f"a mismatch within this factor of the bound is a tolerance question (default {NEAR_FACTOR:g})")
    p.add_argument("--time-budget", type=float,
                   help="minutes: submit nothing new after this, withdraw what waits; a rerun goes on from there")
    p.add_argument("--report-only", action="store_true", help="judge nothing: report what OUT holds")
    p.add_argument("--compare", type=Path, metavar="DIR",
                   help="another output folder (the same records judged again, on another machine or "
                        "with other settings): the report adds which verdicts differ and how the runtimes agree")
    p.add_argument("--rejudge", action="append", default=[], metavar="GLOB",
                   help="judge again the records whose key matches (e.g. 'l3_p15_*'; repeatable): their "
                        "verdicts are taken out of OUT/verdicts.jsonl first")
    p.add_argument("--only", action="append", default=[], metavar="GLOB",
                   help="of the sample, judge (and report) only the records whose key matches (repeatable): "
                        "a few records under other settings, in an output folder of their own")
    p.add_argument("--prescreen", action="store_true",
                   help="no device: the judge's static checks (policy, compiler flags) over the records, "
                        "classified by the same rules, to OUT/prescreen.json and prescreen.md")
    p.add_argument("--ncu-sample", type=int, default=0, help="profile K correct solutions under ncu (cuda)")
    p.add_argument("--ncu-forwards", type=int, default=3, help="profiled forwards per solution (default 3)")
    p.add_argument("--ncu-timeout", type=float, default=900.0, help="limit on one ncu run, and on one build ahead of it (s)")
    p.add_argument("--ncu-build-parallel", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                   help="sampled solutions built at once before the profiled runs (default: half the cores, at most 8)")
    args = p.parse_args(argv)
    for name in ("sample", "workers", "ncu_forwards"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.compile_workers is not None and args.compile_workers < 0:
        p.error("--compile-workers must be 0 or more")
    if args.time_budget is not None and args.time_budget <= 0:
        p.error("--time-budget must be positive (minutes)")
    if args.ncu_sample < 0 or args.near_factor < 1:
        p.error("--ncu-sample must be 0 or more and --near-factor at least 1")
    if args.ncu_build_parallel < 1:
        p.error("--ncu-build-parallel must be at least 1")
    return args


def judge_config(args: argparse.Namespace):
    from pydantic import ValidationError

    from cuda_agent.judge import JudgeConfig

    from cuda_agent.settings import SettingsError, apply_overrides

    try:
        values = apply_overrides({}, args.sets, JudgeConfig)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    values.update(device=args.device, policy=args.policy, compile_mode=args.compile_mode)
    try:
        return JudgeConfig(**values)
    except ValidationError as exc:
        raise UsageError(f"invalid judge settings: {exc}") from None


def pool_config(args: argparse.Namespace):
    from pydantic import ValidationError

    from cuda_agent.pool import PoolConfig

    try:
        return PoolConfig(judge_workers=args.workers, compile_workers=args.compile_workers,
                          time_limit_s=args.time_limit)
    except ValidationError as exc:
        raise UsageError(f"invalid pool settings: {exc}") from None


def pick_ncu(records: list[Record], results: dict[str, dict], k: int, seed: int) -> list[Record]:
    correct = [r for r in records if (results.get(r.key) or {}).get("verdict")
               and results[r.key]["verdict"].get("correct")]
    return stratified_sample(correct, k, seed)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--ncu-runner"]:
        return ncu_runner(argv[1:])
    args = parse_args(argv)
    try:
        corpus = load_corpus(args.corpus)
        if not corpus.records:
            raise UsageError(f"{corpus.root}: no record could be paired with a reference")
        explain = load_explain(args.explain)
        config = judge_config(args)
        settings = settings_of(config)
        records = stratified_sample(corpus.records, args.sample, args.seed)
        if args.only:
            records = [r for r in records if any(fnmatch.fnmatchcase(r.key, g) for g in args.only)]
            if not records:
                raise UsageError(f"--only {' '.join(args.only)}: no record of the sample matches")
        if args.compare is not None and not (args.compare / VERDICTS_FILE).is_file():
            raise UsageError(f"--compare {args.compare}: no {VERDICTS_FILE} there")
        if args.prescreen:
            pre = prescreen(records, args.policy, args.near_factor)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "prescreen.json").write_text(json.dumps(pre, indent=1))
            (args.out / "prescreen.md").write_text(prescreen_markdown(pre))
            print(prescreen_markdown(pre))
            return 0
        if args.report_only:
            if not (args.out / VERDICTS_FILE).is_file():
                raise UsageError(f"{args.out / VERDICTS_FILE}: nothing judged yet")
            try:  # the report names the settings the verdicts were judged with, not this command's
                settings = json.loads((args.out / RUN_FILE).read_text())
            except (OSError, ValueError):
                pass
        else:
            check_run_settings(args.out, settings)
        unknown = sorted(set(explain) - {r.key for r in corpus.records})
        if unknown:
            print(f"--explain names {len(unknown)} keys not in the corpus: {', '.join(unknown[:5])}", file=sys.stderr)
    except UsageError as exc:
        print(f"fidelity.py: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for line in corpus.conflicts:
        print(f"mapping conflict: {line}", file=sys.stderr)
    if args.rejudge and not args.report_only:
        dropped = forget_results(args.out, args.rejudge)
        print(f"--rejudge: {len(dropped)} verdicts taken out ({', '.join(dropped[:8])}"
              f"{', ...' if len(dropped) > 8 else ''})")
    results = read_results(args.out)
    if not args.report_only:
        from cuda_agent.judge import JudgeError
        from cuda_agent.pool import PoolError

        try:
            budget = None if args.time_budget is None else 60.0 * args.time_budget
            judge_records(records, args.out, config, pool_config(args), results, budget)
        except UsageError as exc:
            print(f"fidelity.py: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except (JudgeError, PoolError) as exc:
            print(f"fidelity.py: the judge could not run: {exc}", file=sys.stderr)
            return EXIT_JUDGE
    ncu, ncu_note = None, None
    if args.ncu_sample:
        if args.device != "cuda":
            ncu_note = "ncu sample skipped: Nsight Compute profiles CUDA kernels (--device cuda)"
        elif not shutil.which("ncu"):
            ncu_note = "ncu sample skipped: ncu is not on PATH"
        else:
            by_key = {r.key: r for r in records}
            picked = pick_ncu(list(by_key.values()), results, args.ncu_sample, args.seed)
            t0 = time.monotonic()
            failed = prebuild_ncu(picked, args.out, args.ncu_build_parallel, args.ncu_timeout)
            print(f"ncu sample: {len(picked)} solutions built ahead in {time.monotonic() - t0:.0f} s "
                  f"({len(failed)} failed), {args.ncu_build_parallel} at once", file=sys.stderr)
            ncu = [run_ncu(r, results[r.key], args.out, args.ncu_forwards, args.ncu_timeout) for r in picked]
            ncu_note = (f"{len(ncu)} correct solutions profiled (clock control off, L2 flushed before each "
                        f"forward, {args.ncu_forwards} forwards each)")
    report = build_report(corpus, records, results, explain, settings, args.near_factor, ncu, ncu_note)
    if args.compare is not None:
        keys = {r.key for r in records}
        report["compare"] = {"folder": str(args.compare), **compare_runs(
            {k: e for k, e in results.items() if k in keys},
            {k: e for k, e in read_results(args.compare).items() if k in keys})}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fidelity.json").write_text(json.dumps(report, indent=1))
    (args.out / "fidelity.md").write_text(markdown(report))
    print_report(report)
    print(f"wrote {args.out / 'fidelity.json'} and {args.out / 'fidelity.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
