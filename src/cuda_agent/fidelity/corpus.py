"""The leaderboard corpus: records paired with their reference, the sample, and the resumable results file."""

from __future__ import annotations

import fnmatch
import json
import math
import os
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path


CLASSES = ("solution_error", "hack", "policy_difference", "judge_problem")
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


def read_json(path: Path, kind: type, expected: str, label: str | None = None):
    """The JSON document at `path`, which must be a `kind`; anything else is a usage error that
    names the file (as `label`, default its path) and says what was `expected`."""
    label = label or str(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{label}: unreadable: {exc}") from None
    if not isinstance(data, kind):
        raise UsageError(f"{label}: expected {expected}")
    return data


def names_by_file(root: Path) -> tuple[dict[str, tuple[int, int]], dict[tuple[int, int], str]]:
    """From data.json: record file -> (level, problem number), and (level, number) -> task name."""
    path = root / "data.json"
    if not path.is_file():
        return {}, {}
    data = read_json(path, dict, "an object mapping problem names to records")
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
    raw = read_json(raw_path, list, "a list of records")
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
