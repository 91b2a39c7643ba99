"""The results database: runs, verdicts, candidate sources and baselines in one SQLite file.

SQLite in WAL mode is the embedded default: one writer and any number of readers at once, across
processes (the bench process writes verdicts while pool workers read and write baselines). Every
verdict is committed in its own transaction as soon as it arrives, so a bench process killed with
SIGKILL loses no verdict it had finished: WAL commits survive the death of the process. With
`synchronous=NORMAL` the last commits can be lost if the *machine* loses power, never on a process
crash; that trade keeps commits cheap.

Identity: a verdict is keyed by (run, task id, task name, candidate hash): one row per (task,
candidate) pair, so two solutions of one reference source (two task names with the same source)
are two rows, even when their sources are identical. Rerunning a run skips every pair that has a
verdict, which is how an interrupted run resumes. Each verdict also records its solution (the
candidate's origin, e.g. its file): when a solution changes between two invocations of a run, the
newer candidate's row supersedes the older one in what the run reports.

A pair the judge could not judge (its reference or baseline failed, or the pool broke under it)
is a row of `judge_failures`, with a category and the message; it is not a verdict, so a resumed
run tries that pair again, and a verdict reached later replaces the failure.

A run records the judge settings it was made with (`settings_digest`); resuming it with other
settings is refused, because the verdicts would not be comparable. The reward is not among them:
verdicts hold measurements, and a run is scored under the reward settings of its latest invocation
(`RunInfo.reward`), so a changed reward margin re-scores a run instead of refusing to resume it.
The `reward` column of `verdicts` is the reward the verdict had when it was stored, for queries
in SQL; readers score the stored verdict again under the run's reward settings.

Schema versions: 1 keyed verdicts by (run, task id, candidate hash) and had no `judge_failures`;
opening a version-1 file migrates it in place (one transaction) to version 2.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path

from pydantic import BaseModel, Field

from cuda_agent.candidate import Candidate
from cuda_agent.judge.baselines import Baseline, BaselineKey
from cuda_agent.judge.verdict import Verdict
from cuda_agent.reward import RewardConfig
from cuda_agent.tasks import Task

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    name TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    spec TEXT NOT NULL,
    device TEXT NOT NULL,
    settings_digest TEXT NOT NULL,
    info TEXT NOT NULL                      -- JSON: judge config, levels, solutions, versions, argv
);
CREATE TABLE IF NOT EXISTS candidates (
    hash TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    origin TEXT NOT NULL,
    model_new TEXT NOT NULL,
    kernels TEXT NOT NULL                   -- JSON list of [relative path, source]
);
CREATE TABLE IF NOT EXISTS verdicts (
    run TEXT NOT NULL REFERENCES runs(name),
    task_id TEXT NOT NULL,
    candidate_hash TEXT NOT NULL,
    task_name TEXT NOT NULL,
    task_group TEXT NOT NULL,
    task_origin TEXT NOT NULL,
    level INTEGER,
    compiled INTEGER NOT NULL,
    correct INTEGER NOT NULL,
    reward REAL NOT NULL,
    failure TEXT,                           -- failure category, NULL when none
    runtime_ms REAL,
    eager_ms REAL,
    compile_ms REAL,
    speedup_vs_eager REAL,
    speedup_vs_compile REAL,
    judge_s REAL,
    finished_at REAL NOT NULL,
    verdict TEXT NOT NULL,                  -- the full verdict as JSON
    solution TEXT NOT NULL DEFAULT '',      -- the candidate's origin when judged (its file or folder)
    PRIMARY KEY (run, task_id, task_name, candidate_hash)
);
CREATE INDEX IF NOT EXISTS verdicts_by_run ON verdicts (run, finished_at);
CREATE TABLE IF NOT EXISTS judge_failures (
    run TEXT NOT NULL REFERENCES runs(name),
    task_id TEXT NOT NULL,
    candidate_hash TEXT NOT NULL,
    task_name TEXT NOT NULL,
    task_group TEXT NOT NULL,
    task_origin TEXT NOT NULL,
    level INTEGER,
    solution TEXT NOT NULL,
    category TEXT NOT NULL,                 -- baseline, reference, judge or pool
    message TEXT NOT NULL,
    finished_at REAL NOT NULL,
    PRIMARY KEY (run, task_id, task_name, candidate_hash)
);
CREATE TABLE IF NOT EXISTS baselines (
    key TEXT PRIMARY KEY,                   -- BaselineKey.digest()
    task_id TEXT NOT NULL,
    device_name TEXT NOT NULL,
    torch_version TEXT NOT NULL,
    mode TEXT NOT NULL,
    record TEXT NOT NULL,                   -- Baseline as JSON
    key_fields TEXT NOT NULL,               -- BaselineKey as JSON
    created_at REAL NOT NULL
);
"""


class DBError(RuntimeError):
    """The database cannot be used as asked (unreadable file, a run resumed with other settings)."""


def default_db_path(cache_dir: Path) -> Path:
    """`$CUDA_AGENT_DB`, else `results.sqlite` in the judge's cache folder."""
    env = os.environ.get("CUDA_AGENT_DB")
    return Path(env) if env else Path(cache_dir) / "results.sqlite"


class RunInfo(BaseModel):
    name: str
    created_at: float
    spec: str
    device: str
    settings_digest: str
    info: dict = Field(default_factory=dict)

    def reward(self) -> RewardConfig:
        """How this run scores its verdicts: the reward settings its latest invocation recorded
        (`info["reward"]`; runs made before the reward left the judge kept it in the judge's config)."""
        stored = self.info.get("reward")
        if stored is None:
            stored = (self.info.get("config") or {}).get("reward") or {}
        old_names = {"faster_than_eager": "rewarded_faster_than_eager",
                     "faster_than_compile": "rewarded_faster_than_compile"}
        return RewardConfig.model_validate({old_names.get(k, k): v for k, v in stored.items()})


class _StoredPair(BaseModel):
    """The (task, candidate) pair a stored row is about, with the task facts a verdict does not carry."""

    run: str
    task_id: str
    task_name: str
    task_group: str
    task_origin: str
    level: int | None
    candidate_hash: str
    finished_at: float
    solution: str = ""          # the candidate's origin when it was judged


class StoredVerdict(_StoredPair):
    """A verdict as stored."""

    verdict: Verdict

    @property
    def correct(self) -> bool:
        return self.verdict.correct


class StoredFailure(_StoredPair):
    """A (task, candidate) pair the judge could not judge: no verdict, the reason instead.

    `category`: `baseline` (the eager or torch.compile baseline of the reference failed),
    `reference` (the reference does not import, or its output is too large), `judge` (any other
    error of the judge) or `pool` (the pool broke or shut down before the pair was judged)."""

    category: str
    message: str

    @property
    def correct(self) -> bool:
        return False


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Version 1 keyed verdicts by (run, task id, candidate hash) and had no solution column: rebuild
    the table with the new key, each old verdict's solution taken from its candidate's origin.
    (`judge_failures` was created by the schema script already.)"""
    conn.execute("ALTER TABLE verdicts RENAME TO verdicts_v1")
    conn.execute("DROP INDEX IF EXISTS verdicts_by_run")
    body = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS verdicts"):_SCHEMA.index("CREATE TABLE IF NOT EXISTS judge_failures")]
    for statement in body.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("INSERT INTO verdicts SELECT v.*, COALESCE((SELECT origin FROM candidates c "
                 "WHERE c.hash = v.candidate_hash), '') FROM verdicts_v1 v")
    conn.execute("DROP TABLE verdicts_v1")
    conn.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),))


def _connect(path: Path) -> sqlite3.Connection:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(str(path), timeout=60.0, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
    except sqlite3.DatabaseError as exc:
        raise DBError(f"{path}: not a usable SQLite database: {exc}") from None
    return conn


class ResultsDB:
    """The results database. Thread-safe (one connection behind a lock); open one per process."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._conn = _connect(self.path)
        self._lock = threading.Lock()
        with self._lock:
            self._conn.executescript(_SCHEMA)
            self._check_schema()

    def _check_schema(self) -> None:
        """Record the version of a new file, migrate an older one, refuse a newer one."""
        conn = self._conn
        row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is not None and row[0] == str(SCHEMA_VERSION):
            return  # the common case takes no write lock (pool workers open the file as they start)
        conn.execute("BEGIN IMMEDIATE")  # two processes opening one old file: one migrates, one waits
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif row[0] == "1":
                _migrate_1_to_2(conn)
            elif row[0] != str(SCHEMA_VERSION):
                raise DBError(f"{self.path}: schema version {row[0]}, this program reads {SCHEMA_VERSION}")
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ runs
    def open_run(self, name: str, *, spec: str, device: str, settings_digest: str, info: dict) -> tuple[RunInfo, bool]:
        """The run called `name`, created if new. Returns (run, created). Refuses to resume a run
        made on another device or with other judge settings."""
        with self._lock, self._conn:
            existing = self._run(name)
            if existing is not None:
                if existing.device != device or existing.settings_digest != settings_digest:
                    raise DBError(
                        f"run {name!r} was made with other judge settings (device {existing.device}, settings "
                        f"{existing.settings_digest}; now {device}, {settings_digest}): its verdicts would not be "
                        f"comparable; choose another --run name")
                return existing, False
            run = RunInfo(name=name, created_at=time.time(), spec=spec, device=device,
                          settings_digest=settings_digest, info=info)
            self._conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)",
                               (run.name, run.created_at, run.spec, run.device, run.settings_digest,
                                json.dumps(run.info, default=str)))
            return run, True

    def _run(self, name: str) -> RunInfo | None:
        row = self._conn.execute("SELECT name, created_at, spec, device, settings_digest, info FROM runs "
                                 "WHERE name=?", (name,)).fetchone()
        if row is None:
            return None
        return RunInfo(name=row[0], created_at=row[1], spec=row[2], device=row[3], settings_digest=row[4],
                       info=json.loads(row[5]))

    def update_run_info(self, name: str, **fields) -> None:
        """Merge `fields` into a run's info (e.g. the tasks a resumed invocation found unsolved)."""
        with self._lock, self._conn:
            run = self._run(name)
            if run is None:
                raise DBError(f"no run named {name!r}")
            self._conn.execute("UPDATE runs SET info=? WHERE name=?",
                               (json.dumps(run.info | fields, default=str), name))

    def restate_settings_digest(self, name: str, old: str, new: str) -> None:
        """Replace a run's settings digest `old` by `new`, for a caller that has shown both name
        the same judge settings (a digest computed before a field left the settings)."""
        with self._lock, self._conn:
            self._conn.execute("UPDATE runs SET settings_digest=? WHERE name=? AND settings_digest=?", (new, name, old))

    def run(self, name: str) -> RunInfo | None:
        with self._lock:
            return self._run(name)

    def runs(self) -> list[tuple[RunInfo, int]]:
        """Every run with its number of verdicts, newest first."""
        return [(info, n) for info, n, _ in self.run_counts()]

    def run_counts(self) -> list[tuple[RunInfo, int, int]]:
        """Every run with its number of verdicts and of judge failures, newest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT r.name, (SELECT COUNT(*) FROM verdicts v WHERE v.run = r.name), "
                "(SELECT COUNT(*) FROM judge_failures f WHERE f.run = r.name) FROM runs r "
                "ORDER BY r.created_at DESC").fetchall()
            return [(self._run(name), n, k) for name, n, k in rows]

    # -------------------------------------------------------------------------------- verdicts
    def finished(self, run: str) -> set[tuple[str, str, str]]:
        """(task id, task name, candidate hash) of the pairs that already have a verdict in `run`
        (a pair with only a judge failure is not finished: a resumed run tries it again)."""
        with self._lock:
            return {(a, b, c) for a, b, c in self._conn.execute(
                "SELECT task_id, task_name, candidate_hash FROM verdicts WHERE run=?", (run,))}

    def _store_candidate(self, candidate: Candidate) -> None:
        self._conn.execute(
            "INSERT OR IGNORE INTO candidates VALUES (?, ?, ?, ?, ?)",
            (candidate.hash, candidate.kind, candidate.origin, candidate.model_new,
             json.dumps([list(k) for k in candidate.kernels])))

    def add_verdict(self, run: str, task: Task, candidate: Candidate, verdict: Verdict, *, reward: float) -> None:
        """Store a verdict and its candidate's source in one transaction, committed on return; a
        judge failure recorded earlier for the same pair is replaced by it. `reward`: the verdict's
        reward under the run's reward settings now (the `reward` column; see the module docstring)."""
        failure = verdict.failure.category.value if verdict.failure else None
        with self._lock, self._conn:
            self._store_candidate(candidate)
            self._conn.execute(
                "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run, task.id, candidate.hash, task.name, task.group, task.origin, task.level,
                 int(verdict.compiled), int(verdict.correct), float(reward), failure, verdict.runtime_ms,
                 verdict.eager_ms, verdict.compile_ms, verdict.speedup_vs_eager, verdict.speedup_vs_compile,
                 verdict.judge_s, time.time(), verdict.model_dump_json(), candidate.origin))
            self._conn.execute("DELETE FROM judge_failures WHERE run=? AND task_id=? AND task_name=? AND "
                               "candidate_hash=?", (run, task.id, task.name, candidate.hash))

    def add_failure(self, run: str, task: Task, candidate: Candidate, category: str, message: str) -> StoredFailure:
        """Record that the judge could not judge this pair (see `StoredFailure`), committed on return."""
        rec = StoredFailure(run=run, task_id=task.id, task_name=task.name, task_group=task.group,
                            task_origin=task.origin, level=task.level, candidate_hash=candidate.hash,
                            finished_at=time.time(), solution=candidate.origin, category=category, message=message)
        with self._lock, self._conn:
            self._store_candidate(candidate)
            self._conn.execute(
                "INSERT OR REPLACE INTO judge_failures VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run, rec.task_id, rec.candidate_hash, rec.task_name, rec.task_group, rec.task_origin, rec.level,
                 rec.solution, rec.category, rec.message, rec.finished_at))
        return rec

    def records(self, run: str, *, latest_per_solution: bool = True) -> list[StoredVerdict | StoredFailure]:
        """Every (task, candidate) pair of the run, a verdict or a judge failure, in the order they
        finished. With `latest_per_solution`, a pair is left out when a later pair has the same
        task and the same solution (the solution changed between two invocations of the run)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT run, task_id, task_name, task_group, task_origin, level, candidate_hash, finished_at, "
                "verdict, solution FROM verdicts WHERE run=? ORDER BY finished_at, rowid", (run,)).fetchall()
            failed = self._conn.execute(
                "SELECT run, task_id, task_name, task_group, task_origin, level, candidate_hash, finished_at, "
                "solution, category, message FROM judge_failures WHERE run=? ORDER BY finished_at, rowid",
                (run,)).fetchall()
        out: list[StoredVerdict | StoredFailure] = [
            StoredVerdict(run=r[0], task_id=r[1], task_name=r[2], task_group=r[3], task_origin=r[4], level=r[5],
                          candidate_hash=r[6], finished_at=r[7], verdict=Verdict.model_validate_json(r[8]),
                          solution=r[9]) for r in rows]
        out += [StoredFailure(run=r[0], task_id=r[1], task_name=r[2], task_group=r[3], task_origin=r[4], level=r[5],
                              candidate_hash=r[6], finished_at=r[7], solution=r[8], category=r[9], message=r[10])
                for r in failed]
        out.sort(key=lambda rec: rec.finished_at)
        if latest_per_solution:
            last = {(r.task_id, r.task_name, r.solution): r for r in out}
            out = [r for r in out if last[(r.task_id, r.task_name, r.solution)] is r]
        return out

    def verdicts(self, run: str, *, latest_per_solution: bool = True) -> list[StoredVerdict]:
        """The run's verdicts (one per pair judged; see `records`)."""
        return [r for r in self.records(run, latest_per_solution=latest_per_solution) if isinstance(r, StoredVerdict)]

    def failures(self, run: str, *, latest_per_solution: bool = True) -> list[StoredFailure]:
        """The run's pairs the judge could not judge (see `records`)."""
        return [r for r in self.records(run, latest_per_solution=latest_per_solution) if isinstance(r, StoredFailure)]

    def verdict_for(self, run: str, task_id: str, task_name: str, candidate_hash: str) -> Verdict | None:
        """The stored verdict of one pair of `run`, or None."""
        with self._lock:
            row = self._conn.execute("SELECT verdict FROM verdicts WHERE run=? AND task_id=? AND task_name=? AND "
                                     "candidate_hash=?", (run, task_id, task_name, candidate_hash)).fetchone()
        return None if row is None else Verdict.model_validate_json(row[0])

    def candidate(self, hash_: str) -> Candidate | None:
        with self._lock:
            row = self._conn.execute("SELECT kind, origin, model_new, kernels FROM candidates WHERE hash=?",
                                     (hash_,)).fetchone()
        if row is None:
            return None
        return Candidate(kind=row[0], origin=row[1], model_new=row[2],
                         kernels=tuple((rel, src) for rel, src in json.loads(row[3])))


class SqliteBaselineStore:
    """A `BaselineStore` in the results database's `baselines` table: each task pays for its
    torch.compile baseline once per machine model, whichever process or run measured it."""

    def __init__(self, path: Path):
        ResultsDB(path).close()  # creates the schema if needed
        self.path = Path(path)
        self._conn = _connect(self.path)
        self._lock = threading.Lock()

    def get(self, key: BaselineKey) -> Baseline | None:
        with self._lock:
            row = self._conn.execute("SELECT record FROM baselines WHERE key=?", (key.digest(),)).fetchone()
        if row is None:
            return None
        try:
            return Baseline.model_validate_json(row[0])
        except ValueError:
            return None

    def put(self, key: BaselineKey, baseline: Baseline) -> None:
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO baselines VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               (key.digest(), key.task_id, key.device_name, key.torch_version, key.mode,
                                baseline.model_dump_json(), key.model_dump_json(), time.time()))

    def close(self) -> None:
        with self._lock:
            self._conn.close()
