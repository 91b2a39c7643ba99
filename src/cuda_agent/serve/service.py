"""The judge service's core, without HTTP: a durable queue in front of a `Pool`.

Durability (the results database, SQLite in WAL mode):
* a submission is committed to the `service_jobs` table before it is acknowledged (`queued`);
* a verdict is committed to the results database's `verdicts` table (the run's row, as `bench`
  writes it) before the submission is marked `done` and before any client can read it; a pair the
  judge could not judge goes to `judge_failures` the same way (`failed`);
* on start, every submission that is not finished is looked up in the results database (a
  verdict committed just before a crash is not judged again) and otherwise queued again: a
  restarted service loses no finished verdict and re-judges what was in flight.

Identity: a submission's id is a hash of its content and the service's judge settings
(`records.submission_id`), so a client that retries, or many clients sending the same candidate,
get one submission and one verdict.

Candidate code never runs in this process: the pool's judge workers are other processes (local,
or Ray actors), and the judge runs each candidate in sandboxed processes of its own. This process
only parses requests, checks a reference statically and stores records.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from concurrent.futures import CancelledError
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.candidate import Candidate
from cuda_agent.db import DBError, ResultsDB
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.harness import JudgeError
from cuda_agent.judge.verdict import Verdict
from cuda_agent.pool import Pool, PoolConfig, PoolError
from cuda_agent.reward import RewardConfig, reward_of
from cuda_agent.tasks import Task

from .records import Health, JudgeFailureInfo, ServiceInfo, State, Submission, SubmitRequest, submission_id


class ServiceConfig(BaseModel):
    """Settings of `cuda-agent serve` beyond the judge's and the pool's."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    db: Path = Field(description="results database: verdicts, judge failures, baselines and the service's queue")
    max_request_bytes: int = Field(8 << 20, ge=4096, description="largest request body accepted (413 beyond)")
    max_pending: int = Field(1024, ge=1, description="submissions accepted and not finished before new ones "
                                                      "get 429 with Retry-After")
    retry_after_s: int = Field(2, ge=1, description="the Retry-After a 429 answer carries")


class QueueFull(Exception):
    def __init__(self, pending: int, retry_after_s: int):
        super().__init__(f"{pending} submissions are waiting; try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class RunConflict(Exception):
    """The run exists in the results database with other judge settings."""


class ServiceBroken(Exception):
    """The pool cannot judge (no judge worker could start)."""


_JOBS_SCHEMA = """
CREATE TABLE IF NOT EXISTS service_jobs (
    id TEXT PRIMARY KEY,                    -- records.submission_id
    run TEXT NOT NULL,
    task TEXT NOT NULL,                     -- the Task as JSON
    candidate TEXT NOT NULL,                -- the Candidate as JSON
    state TEXT NOT NULL,                    -- queued, done or failed (judging is not stored: it is queued again)
    submitted_at REAL NOT NULL,
    finished_at REAL,
    verdict TEXT,                           -- a copy of the verdict committed to `verdicts`
    failure TEXT                            -- JudgeFailureInfo as JSON
);
CREATE INDEX IF NOT EXISTS service_jobs_by_state ON service_jobs (state, submitted_at);
"""


class JobStore:
    """The service's submissions, in the results database file (its own table and connection)."""

    def __init__(self, path: Path):
        self._conn = sqlite3.connect(str(path), timeout=60.0, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.Lock()
        with self._lock, self._conn:
            self._conn.executescript(_JOBS_SCHEMA)

    def _row(self, row) -> tuple[Submission, Task, Candidate]:
        task, candidate = Task.model_validate_json(row[2]), Candidate.model_validate_json(row[3])
        sub = Submission(id=row[0], run=row[1], state=State(row[4]), task_id=task.id, task_name=task.name,
                         candidate_hash=candidate.hash, submitted_at=row[5], finished_at=row[6],
                         verdict=Verdict.model_validate_json(row[7]) if row[7] else None,
                         failure=JudgeFailureInfo.model_validate_json(row[8]) if row[8] else None)
        return sub, task, candidate

    _COLUMNS = "id, run, task, candidate, state, submitted_at, finished_at, verdict, failure"

    def get(self, id_: str) -> Submission | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {self._COLUMNS} FROM service_jobs WHERE id=?", (id_,)).fetchone()
        return None if row is None else self._row(row)[0]

    def unfinished(self) -> list[tuple[Submission, Task, Candidate]]:
        with self._lock:
            rows = self._conn.execute(f"SELECT {self._COLUMNS} FROM service_jobs WHERE state=? "
                                      "ORDER BY submitted_at", (State.QUEUED.value,)).fetchall()
        return [self._row(r) for r in rows]

    def put_queued(self, sub: Submission, task: Task, candidate: Candidate) -> None:
        """Store a new (or failed, now retried) submission as queued; committed on return."""
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO service_jobs VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, NULL)",
                               (sub.id, sub.run, task.model_dump_json(), candidate.model_dump_json(),
                                State.QUEUED.value, sub.submitted_at))

    def finish(self, id_: str, state: State, *, verdict: Verdict | None = None,
               failure: JudgeFailureInfo | None = None) -> float:
        now = time.time()
        with self._lock, self._conn:
            self._conn.execute("UPDATE service_jobs SET state=?, finished_at=?, verdict=?, failure=? WHERE id=?",
                               (state.value, now, verdict.model_dump_json() if verdict else None,
                                failure.model_dump_json() if failure else None, id_))
        return now

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._conn.execute("SELECT state, COUNT(*) FROM service_jobs GROUP BY state").fetchall())

    def close(self) -> None:
        with self._lock:
            self._conn.close()


@dataclass
class _Pending:
    sub: Submission
    task: Task
    candidate: Candidate


class JudgeService:
    """Accepts submissions, feeds them to the pool, commits their outcomes. Thread-safe."""

    def __init__(self, judge_config: JudgeConfig, pool_config: PoolConfig, config: ServiceConfig,
                 transport=None):
        from cuda_agent.bench import settings_digest

        self.judge_config = judge_config
        self.config = config
        self.settings = settings_digest(judge_config)
        self.db = ResultsDB(config.db)
        self.jobs = JobStore(config.db)
        pool_config = pool_config.model_copy(update={"baseline_db": pool_config.baseline_db or config.db})
        self.pool = Pool(judge_config, pool_config, transport)
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._runs: dict[str, RewardConfig] = {}  # run -> how its verdicts are scored in the database
        self._feed: queue.Queue = queue.Queue()
        self._outcomes: queue.Queue = queue.Queue()
        self._closing = False
        self.version = 0                  # changes whenever a submission finishes (long polls watch it)
        self.counters = {"submitted": 0, "duplicates": 0, "rejected_full": 0, "verdicts": 0, "judge_failures": 0,
                         "requeued_at_start": 0, "recovered_verdicts": 0}
        self._recover()
        self._feeder = threading.Thread(target=self._feed_pool, name="serve-feeder", daemon=True)
        self._committer = threading.Thread(target=self._commit_outcomes, name="serve-committer", daemon=True)
        self._feeder.start()
        self._committer.start()

    # ---------------------------------------------------------------------------------- start-up
    def _recover(self) -> None:
        """Queue again what a previous process accepted and did not finish; a verdict it committed
        to the results database just before it stopped is taken as it is."""
        for sub, task, candidate in self.jobs.unfinished():
            verdict = self.db.verdict_for(sub.run, task.id, task.name, candidate.hash)
            if verdict is not None:
                self.jobs.finish(sub.id, State.DONE, verdict=verdict)
                self.counters["recovered_verdicts"] += 1
                continue
            self._pending[sub.id] = _Pending(sub, task, candidate)
            self._feed.put(sub.id)
            self.counters["requeued_at_start"] += 1

    def _open_run(self, run: str) -> None:
        if run in self._runs:
            return
        try:
            info, _ = self.db.open_run(run, spec="serve", device=self.judge_config.device, settings_digest=self.settings,
                             info={"config": json.loads(self.judge_config.model_dump_json()), "service": True,
                                   "started": time.time()})
        except DBError as exc:
            raise RunConflict(str(exc)) from None
        self._runs[run] = info.reward()

    # ---------------------------------------------------------------------------------- requests
    def submit(self, request: SubmitRequest) -> tuple[Submission, bool]:
        """Accept a submission (committed before this returns). Returns it and whether it is new;
        the same content again returns the existing submission. Raises TaskError (the reference is
        not a KernelBench module), QueueFull, RunConflict or ServiceBroken."""
        task = request.task.to_task()
        candidate = request.candidate.to_candidate()
        id_ = submission_id(request.run, task, candidate, self.settings)
        with self._lock:
            if self._closing:
                raise ServiceBroken("the service is shutting down")
            if id_ in self._pending:
                self.counters["duplicates"] += 1
                return self._pending[id_].sub.model_copy(), False
            existing = self.jobs.get(id_)
            if existing is not None and existing.state == State.DONE:
                self.counters["duplicates"] += 1
                return existing, False
            broken = self.broken()
            if broken:
                raise ServiceBroken(broken)
            if len(self._pending) >= self.config.max_pending:
                self.counters["rejected_full"] += 1
                raise QueueFull(len(self._pending), self.config.retry_after_s)
            self._open_run(request.run)
            sub = Submission(id=id_, run=request.run, state=State.QUEUED, task_id=task.id, task_name=task.name,
                             candidate_hash=candidate.hash, submitted_at=time.time())
            self.jobs.put_queued(sub, task, candidate)
            self._pending[id_] = _Pending(sub, task, candidate)
            self.counters["submitted"] += 1
        self._feed.put(id_)
        return sub, True

    def lookup(self, ids: list[str]) -> tuple[list[Submission], list[str]]:
        found, unknown = [], []
        for id_ in ids:
            with self._lock:
                pending = self._pending.get(id_)
                sub = pending.sub.model_copy() if pending else None
            sub = sub or self.jobs.get(id_)
            if sub is None:
                unknown.append(id_)
            else:
                found.append(sub)
        return found, unknown

    def broken(self) -> str | None:
        try:
            self.pool.wait_ready(0)
        except PoolError as exc:
            return str(exc)
        return None

    def health(self) -> Health:
        ready = self.pool.workers_ready()
        broken = self.broken()
        with self._lock:
            pending = len(self._pending)
        status = "broken" if broken else ("ok" if ready["judge"] else "starting")
        return Health(status=status, judge_workers=ready["judge"], compile_workers=ready["compile"], queued=pending,
                      detail=broken or "")

    def info(self) -> ServiceInfo:
        return ServiceInfo(device=self.judge_config.device, settings_digest=self.settings,
                           judge_config=json.loads(self.judge_config.model_dump_json()),
                           device_names=self.pool.device_names(), max_request_bytes=self.config.max_request_bytes,
                           max_pending=self.config.max_pending)

    def metrics(self) -> dict[str, float]:
        """Counters and gauges, by Prometheus-style name."""
        stats = self.pool.stats()
        ready = self.pool.workers_ready()
        with self._lock:
            counters = dict(self.counters)
            pending = len(self._pending)
            judging = sum(p.sub.state == State.JUDGING for p in self._pending.values())
        out = {f"cuda_agent_serve_{k}_total": float(v) for k, v in counters.items()}
        out |= {"cuda_agent_serve_pending": float(pending), "cuda_agent_serve_judging": float(judging),
                "cuda_agent_pool_judge_workers_ready": float(ready["judge"]),
                "cuda_agent_pool_compile_workers_ready": float(ready["compile"]),
                "cuda_agent_pool_queued": float(self.pool.queued())}
        out |= {f"cuda_agent_pool_{k}": float(v) for k, v in stats.model_dump().items()}
        return out

    # ---------------------------------------------------------------------------------- threads
    def _feed_pool(self) -> None:
        """Hand queued submissions to the pool in order (submit blocks while the pool's own queue is full)."""
        while True:
            id_ = self._feed.get()
            if id_ is None:
                return
            with self._lock:
                pending = self._pending.get(id_)
            if pending is None:
                continue
            try:
                future = self.pool.submit(pending.task, pending.candidate)
            except PoolError:
                return  # shut down or broken: what is left stays queued in the database for the next start
            with self._lock:
                pending.sub.state = State.JUDGING
            future.add_done_callback(lambda f, id_=id_: self._outcomes.put((id_, f)))

    def _commit_outcomes(self) -> None:
        from cuda_agent.bench import failure_category

        while True:
            item = self._outcomes.get()
            if item is None:
                return
            id_, future = item
            with self._lock:
                pending = self._pending.get(id_)
            if pending is None:
                continue
            try:
                verdict, error = future.result(), None
            except CancelledError:
                continue      # the pool shut down: queued again at the next start
            except PoolError:
                continue      # the same, or a broken pool (health says so)
            except Exception as exc:  # JudgeError: the task's; anything else: the judge's
                verdict, error = None, exc
            try:
                self._commit(pending, verdict, error, failure_category)
            except Exception:  # noqa: BLE001 - the database failed: leave it queued for the next start
                continue

    def _commit(self, pending: _Pending, verdict: Verdict | None, error: BaseException | None, categorise) -> None:
        sub = pending.sub
        if verdict is not None:
            reward = reward_of(verdict, self._runs.get(sub.run) or RewardConfig()).value
            self.db.add_verdict(sub.run, pending.task, pending.candidate, verdict, reward=reward)   # committed first
            self.jobs.finish(sub.id, State.DONE, verdict=verdict)
            counter = "verdicts"
        else:
            category = categorise(error) if isinstance(error, JudgeError) else "judge"
            message = str(error) if isinstance(error, JudgeError) else f"{type(error).__name__}: {error}"
            self.db.add_failure(sub.run, pending.task, pending.candidate, category, message)
            failure = JudgeFailureInfo(category=category, message=message)
            self.jobs.finish(sub.id, State.FAILED, failure=failure)
            counter = "judge_failures"
        with self._lock:
            self._pending.pop(sub.id, None)
            self.counters[counter] += 1
            self.version += 1

    # ---------------------------------------------------------------------------------- stop
    def close(self) -> None:
        """Stop now: what is being judged is abandoned and stays queued in the database, so the next
        start judges it again; every verdict already committed stays."""
        with self._lock:
            self._closing = True
        self.pool.shutdown(wait=False, cancel_futures=True)
        self._feed.put(None)
        self._feeder.join(timeout=30)
        # Outcomes that arrived before the pool stopped are still committed.
        self._outcomes.put(None)
        self._committer.join(timeout=60)
        self.jobs.close()
        self.db.close()
