"""A client of `cuda-agent serve` with the pool's API: `submit(task, candidate) -> Future[Verdict]`.

    with JudgeClient("http://judge-host:8765", token=os.environ["CUDA_AGENT_SERVE_TOKEN"], run="rl-step-40") as judge:
        futures = [judge.submit(task, candidate) for task, candidate in work]
        verdicts = [f.result() for f in futures]

The agent, RL rollouts and `bench` use it where they would use an in-process `Pool`.

* `submit` returns once the service has committed the submission. It retries on connection
  errors, timeouts and 5xx answers with exponential back-off and jitter (`retries` attempts), and
  waits out 429 (a full queue: the service's back-pressure) for as long as `Retry-After` says, for
  at most `timeout` seconds when given. Retrying is safe: a submission's id is a hash of its content,
  so a repeated request is the same submission.
* One background thread resolves the futures with long-polling status requests (`poll_wait_s`),
  many submissions per request. A verdict resolves its future; a pair the judge could not judge
  raises `JudgeError` (its message as the service stored it); a submission the service does not
  know (its database was replaced) is submitted again.
* Errors that retrying cannot fix (401 token, 409 run settings, 413 size, 422 fields) raise
  `ServiceError` at once, with the service's explanation.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import Future

import httpx
from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.candidate import Candidate
from cuda_agent.judge.harness import JudgeError
from cuda_agent.judge.verdict import Verdict
from cuda_agent.tasks import Task

from . import TOKEN_ENV
from .records import (API, MAX_IDS, CandidateSpec, Health, ServiceInfo, StatusReply, Submission, SubmitRequest,
                      TaskSpec)


class ServiceError(RuntimeError):
    """The service refused a request, or could not be reached within the retries."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ClientConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    timeout_s: float = Field(30.0, gt=0, description="limit on one HTTP request (a long poll adds its wait)")
    retries: int = Field(8, ge=0, description="retries of a request after a connection error, timeout or 5xx")
    backoff_s: float = Field(0.25, gt=0, description="first back-off; doubles per retry, with jitter")
    max_backoff_s: float = Field(20.0, gt=0, description="longest single back-off (and Retry-After honoured)")
    poll_wait_s: float = Field(20.0, ge=0, le=60, description="how long one status request waits for a verdict")


_FATAL = {400, 401, 403, 404, 405, 409, 413, 422}


class JudgeClient:
    """The judge service as a pool. Thread-safe; use as a context manager or call `shutdown()`."""

    def __init__(self, url: str, token: str, *, run: str = "serve", config: ClientConfig | None = None,
                 http_transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        self.run = run
        self.config = config or ClientConfig()
        self._http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                  timeout=self.config.timeout_s, transport=http_transport)
        self._cond = threading.Condition()
        self._futures: dict[str, tuple[Future, dict]] = {}   # id -> (future, its request body)
        self._closed = False
        self._poller = threading.Thread(target=self._poll_loop, name="judge-client", daemon=True)
        self._poller.start()

    @classmethod
    def from_env(cls, url: str, *, run: str = "serve", config: ClientConfig | None = None) -> "JudgeClient":
        """A client whose token is $CUDA_AGENT_SERVE_TOKEN (the `--judge-url` options). Raises
        ValueError without one."""
        token = os.environ.get(TOKEN_ENV, "")
        if not token:
            raise ValueError(f"--judge-url needs the service's token in ${TOKEN_ENV}")
        return cls(url, token, run=run, config=config)

    # ------------------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, *, json: dict | None = None, deadline: float | None = None,
                 http_timeout: float | None = None, accept: tuple[int, ...] = ()) -> httpx.Response:
        """One request, retried as the module docstring says. Returns a 2xx response (or one whose
        status is in `accept`)."""
        failures = 0
        while True:
            wait = None
            try:
                response = self._http.request(method, f"{API}{path}", json=json,
                                              timeout=http_timeout or self.config.timeout_s)
            except httpx.TransportError as exc:  # refused, reset, timed out: the service may be restarting
                failures += 1
                if failures > self.config.retries:
                    raise ServiceError(f"{self.url}: {type(exc).__name__}: {exc} (after {failures} tries)") from None
            else:
                if response.status_code < 300 or response.status_code in accept:
                    return response
                if response.status_code in _FATAL:
                    raise ServiceError(f"{self.url}{API}{path}: {response.status_code} {_detail(response)}",
                                       response.status_code)
                if response.status_code == 429:  # back-pressure: wait as asked, for as long as `deadline` allows
                    wait = _retry_after(response, self.config.max_backoff_s)
                else:  # 5xx; 503: the service cannot judge now (counted: it may not recover by itself)
                    failures += 1
                    if response.status_code == 503:
                        wait = _retry_after(response, self.config.max_backoff_s)
                    if failures > self.config.retries:
                        raise ServiceError(f"{self.url}{API}{path}: {response.status_code} {_detail(response)} "
                                           f"(after {failures} tries)", response.status_code)
            if wait is None:
                wait = min(self.config.max_backoff_s, self.config.backoff_s * 2 ** max(0, failures - 1))
                wait *= 0.5 + random.random() / 2
            if deadline is not None and time.monotonic() + wait > deadline:
                raise ServiceError(f"{self.url}{API}{path}: not accepted within the time limit", 429)
            if self._closed:
                raise ServiceError("the client is shut down")
            time.sleep(wait)

    # ------------------------------------------------------------------------------ API
    def submit(self, task: Task, candidate: Candidate, timeout: float | None = None) -> Future:
        """Submit and return a future of its verdict; blocks while the service's queue is full
        (raises ServiceError after `timeout` seconds)."""
        if self._closed:
            raise ServiceError("the client is shut down")
        body = SubmitRequest(task=TaskSpec.of(task), candidate=CandidateSpec.of(candidate),
                             run=self.run).model_dump(mode="json")
        deadline = None if timeout is None else time.monotonic() + timeout
        sub = Submission.model_validate_json(self._request("POST", "/submissions", json=body, deadline=deadline).content)
        with self._cond:
            entry = self._futures.get(sub.id)
            if entry is None:  # one future per submission: the same candidate twice shares it
                future: Future = Future()
                future.set_running_or_notify_cancel()
                entry = self._futures[sub.id] = (future, body)
                self._cond.notify_all()
            future = entry[0]
        if sub.finished:
            self._resolve([sub])
        return future

    def evaluate(self, task: Task, candidate: Candidate, timeout: float | None = None) -> Verdict:
        return self.submit(task, candidate, timeout).result(timeout)

    def health(self) -> Health:
        return Health.model_validate_json(self._request("GET", "/health", accept=(503,)).content)

    def info(self) -> ServiceInfo:
        return ServiceInfo.model_validate_json(self._request("GET", "/info").content)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the service has a judge worker (True); raises ServiceError when it is broken."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            h = self.health()
            if h.status == "ok":
                return True
            if h.status == "broken":
                raise ServiceError(f"the judge service cannot judge: {h.detail}", 503)
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.5)

    def pending(self) -> int:
        with self._cond:
            return len(self._futures)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop: with `wait`, first let the pending futures resolve; the rest fail with ServiceError.
        (The service keeps judging them: a later client gets their verdicts by submitting again.)"""
        if wait and not cancel_futures:
            with self._cond:
                futures = [f for f, _ in self._futures.values()]
            for f in futures:
                try:
                    f.exception()
                except Exception:  # noqa: BLE001 - cancelled
                    pass
        with self._cond:
            self._closed = True
            left = list(self._futures.values())
            self._futures.clear()
            self._cond.notify_all()
        for future, _ in left:
            if not future.done():
                future.set_exception(ServiceError("the client shut down before this verdict arrived"))
        self._poller.join(timeout=self.config.timeout_s + self.config.poll_wait_s + 5)
        self._http.close()

    close = shutdown

    def __enter__(self) -> "JudgeClient":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)

    # ------------------------------------------------------------------------------ futures
    def _resolve(self, subs: list[Submission]) -> None:
        done = []
        with self._cond:
            for sub in subs:
                if sub.finished and sub.id in self._futures:
                    done.append((self._futures.pop(sub.id)[0], sub))
        for future, sub in done:
            if future.done():
                continue
            if sub.verdict is not None:
                future.set_result(sub.verdict)
            else:
                failure = sub.failure
                future.set_exception(JudgeError(failure.message if failure else "the judge could not judge it"))

    def _poll_loop(self) -> None:
        while True:
            with self._cond:
                while not self._futures and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                ids = list(self._futures)[:MAX_IDS]
            try:
                reply = StatusReply.model_validate_json(self._request(
                    "POST", "/submissions/status", json={"ids": ids, "wait_s": self.config.poll_wait_s},
                    http_timeout=self.config.timeout_s + self.config.poll_wait_s).content)
            except ServiceError as exc:
                if self._closed:
                    return
                self._fail_all(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - an answer that is not a status reply: no future may hang
                if self._closed:
                    return
                self._fail_all(ServiceError(f"{self.url}: unreadable status answer: {type(exc).__name__}: {exc}"))
                continue
            self._resolve(reply.submissions)
            for id_ in reply.unknown:  # the service lost it (a new database): submit it again
                with self._cond:
                    entry = self._futures.get(id_)
                if entry is None:
                    continue
                try:
                    sub = Submission.model_validate_json(self._request("POST", "/submissions", json=entry[1]).content)
                except ServiceError as exc:
                    with self._cond:
                        self._futures.pop(id_, None)
                    entry[0].set_exception(exc)
                    continue
                self._resolve([sub])

    def _fail_all(self, exc: ServiceError) -> None:
        """The service stayed unreachable through every retry: the waiting futures fail with why."""
        with self._cond:
            left = list(self._futures.values())
            self._futures.clear()
        for future, _ in left:
            if not future.done():
                future.set_exception(exc)


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail", "")
    except ValueError:
        return response.text[:500]
    return str(detail)[:1000]


def _retry_after(response: httpx.Response, cap: float) -> float:
    try:
        return min(cap, max(0.05, float(response.headers.get("retry-after", "1"))))
    except ValueError:
        return min(cap, 1.0)
