"""`cuda-agent serve` and its client on loopback, with scripted judges in real pool workers
(tests/pool_fakes.py): token, field validation, size caps, back-pressure (429 + Retry-After),
idempotency by content hash, verdicts committed before they are read, a restart that loses no
finished verdict and judges again what was in flight, clients that disconnect, and a bounded load
test of many clients with duplicates. The end-to-end run with the real judge and a C++ candidate
is in test_serve_e2e.py (slow tier)."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
import httpx  # noqa: E402

from test_pool import SCRIPTED, scripted, task  # noqa: E402

from cuda_agent.judge import JudgeConfig, JudgeError  # noqa: E402
from cuda_agent.pool import PoolConfig  # noqa: E402
from cuda_agent.serve.app import BodyLimit, create_app  # noqa: E402
from cuda_agent.serve.client import ClientConfig, JudgeClient, ServiceError  # noqa: E402
from cuda_agent.serve.records import CandidateSpec, State, SubmitRequest, TaskSpec  # noqa: E402
from cuda_agent.serve.service import JudgeService, ServiceConfig  # noqa: E402

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class LoopbackServer:
    """The app on 127.0.0.1 on a free port, in a thread of this process."""

    def __init__(self, service: JudgeService):
        self.service = service
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(service, TOKEN), log_level="warning",
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()


def make_service(tmp_path, *, judge_workers=1, max_pending=1024, max_request_bytes=1 << 20, factory=SCRIPTED,
                 **judge) -> JudgeService:
    cfg = JudgeConfig(device="cpu", compile_mode="none", cache_dir=tmp_path / "cache", **judge)
    return JudgeService(cfg, PoolConfig(judge_factory=factory, compile_workers=0, judge_workers=judge_workers),
                        ServiceConfig(db=tmp_path / "results.sqlite", max_pending=max_pending,
                                      max_request_bytes=max_request_bytes, retry_after_s=1))


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One service for the tests whose requests are all refused (nothing is judged there)."""
    s = LoopbackServer(make_service(tmp_path_factory.mktemp("shared")))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def server(tmp_path):
    s = LoopbackServer(make_service(tmp_path))
    s.service.pool.wait_ready(120)
    try:
        yield s
    finally:
        s.stop()


def body(i: int = 0, *lines: str, tag: str = "", run: str = "serve") -> dict:
    return SubmitRequest(task=TaskSpec.of(task(i)), candidate=CandidateSpec.of(scripted(*lines, tag=tag)),
                         run=run).model_dump(mode="json")


def verdict_rows(db) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT run, task_id, task_name, candidate_hash FROM verdicts").fetchall()


# --------------------------------------------------------------------------------- access and input
def test_every_route_but_health_needs_the_token(shared_server):
    with httpx.Client(base_url=shared_server.url) as http:
        assert http.get("/v1/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
            r = http.post("/v1/submissions", json=body(), headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert http.get("/v1/metrics", headers=headers).status_code == 401
            assert http.get("/v1/info", headers=headers).status_code == 401
        assert http.get("/v1/metrics", headers=AUTH).status_code == 200
    assert shared_server.service.counters["submitted"] == 0


def test_a_short_token_is_refused(tmp_path):
    service = make_service(tmp_path)
    try:
        with pytest.raises(ValueError, match="16 characters"):
            create_app(service, "short")
    finally:
        service.close()


@pytest.mark.parametrize("change, where", [
    (lambda b: b.update(extra=1), "extra"),
    (lambda b: b["candidate"].update(kind="binary"), "kind"),
    (lambda b: b["candidate"].update(kernels=[{"path": "../../etc/x.cpp", "source": "int x;"}]), "path"),
    (lambda b: b["candidate"].update(kernels=[{"path": "k.so", "source": "x"}]), "path"),
    (lambda b: b["candidate"].update(kind="file", kernels=[{"path": "k.cpp", "source": "x"}]), "candidate"),
    (lambda b: b["task"].update(name="a b; rm -rf /"), "name"),
    (lambda b: b.update(run="../other"), "run"),
    (lambda b: b["task"].update(source="print('not a KernelBench module')"), "source"),
    (lambda b: b["task"].update(level=-1), "level"),
])
def test_malformed_submissions_get_422_without_the_input_echoed(shared_server, change, where):
    b = body()
    change(b)
    with httpx.Client(base_url=shared_server.url, headers=AUTH) as http:
        r = http.post("/v1/submissions", json=b)
        assert r.status_code == 422, r.text
        assert where in json.dumps(r.json()["detail"])
        assert "torch.relu" not in r.text and "class ModelNew" not in r.text, "the submitted source is not echoed"
        assert http.post("/v1/submissions", content=b"{not json", headers={"content-type": "application/json"}
                         ).status_code == 422
        assert http.get("/v1/submissions/not-an-id").status_code == 422
        assert http.post("/v1/submissions/status", json={"ids": [], "wait_s": 1}).status_code == 422
        assert http.post("/v1/submissions/status", json={"ids": ["0" * 32], "wait_s": 3600}).status_code == 422
    assert shared_server.service.counters["submitted"] == 0


def test_oversized_requests_get_413_before_they_are_read(shared_server):
    limit = 1 << 20  # make_service's max_request_bytes
    big = body()
    big["candidate"]["model_new"] += "#" * limit
    as_json = {"content-type": "application/json"}

    def chunks(n: int):  # no Content-Length: counted while read
        for at in range(0, n, 65536):
            yield b"x" * min(65536, n - at)

    with httpx.Client(base_url=shared_server.url, headers=AUTH) as http:
        assert http.post("/v1/submissions", json=big).status_code == 413
        # Many times, each on a kept-alive connection (as a client with a pool sends them): answered
        # with the body unread, the closed socket sent a reset that often cost the client the 413 (a
        # protocol error instead), at any size over the limit.
        for i in range(20):
            n = limit + 4096 * (i + 1)
            for content in (b"x" * n, chunks(n)):
                assert http.get("/v1/health").status_code == 200
                assert http.post("/v1/submissions", content=content, headers=as_json).status_code == 413
        # Far over what the server drains (4x the limit): refused at once, unread; the client sees the
        # 413 or a reset, and soon.
        t0 = time.monotonic()
        try:
            status = http.post("/v1/submissions", content=b"x" * (16 * limit), headers=as_json).status_code
        except httpx.TransportError:
            status = None
        assert status in (413, None) and time.monotonic() - t0 < 10
        assert http.get("/v1/health").status_code == 200
    assert shared_server.service.counters["submitted"] == 0


def run_body_limit(chunks: list[int], *, length: int | None = None, expect: bool = False,
                   drain_s: float = 5.0) -> tuple[list, list]:
    """BodyLimit(limit=100, drain_bytes=400) before an app that reads its whole body. The client sends
    `chunks` (sizes; more_body on all but the last) and then waits. Returns the order of what happened
    (("read", size) and ("sent", status)) and the messages the app was given."""
    events, seen = [], []
    queue = [{"type": "http.request", "body": b"x" * n, "more_body": i < len(chunks) - 1}
             for i, n in enumerate(chunks)]

    async def receive():
        if not queue:
            await asyncio.sleep(3600)  # a client that sends no more
        message = queue.pop(0)
        events.append(("read", len(message["body"])))
        return message

    async def send(message):
        if message["type"] == "http.response.start":
            events.append(("sent", message["status"]))

    async def app(scope, receive, send):
        while True:
            message = await receive()
            seen.append(message["type"])
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    headers = [(b"content-length", str(length).encode())] if length is not None else []
    if expect:
        headers.append((b"expect", b"100-continue"))
    asyncio.run(BodyLimit(app, 100, drain_bytes=400, drain_s=drain_s)({"type": "http", "headers": headers},
                                                                      receive, send))
    return events, seen


def test_an_oversized_body_is_drained_within_bounds_before_its_413():
    # Content-Length over the limit: the body is read (and dropped) to its end, then the 413; the
    # app is not called.
    assert run_body_limit([100, 100, 100], length=300) == ([("read", 100)] * 3 + [("sent", 413)], [])
    # Over the drain bound, or a client waiting for `100 Continue`: 413 at once, nothing read.
    assert run_body_limit([100] * 5, length=500) == ([("sent", 413)], [])
    assert run_body_limit([100] * 3, length=300, expect=True) == ([("sent", 413)], [])
    # A client that stops sending: 413 once the drain time is up.
    t0 = time.monotonic()
    assert run_body_limit([100], length=300, drain_s=0.2) == ([("read", 100), ("sent", 413)], [])
    assert time.monotonic() - t0 < 3
    # Chunked: the app reads until the limit is passed and is then told the client left; the rest is
    # drained up to its end, or up to the drain bound (400 bytes in all) of an endless body.
    assert run_body_limit([60] * 4) == ([("read", 60)] * 4 + [("sent", 413)], ["http.request", "http.disconnect"])
    assert run_body_limit([60] * 100) == ([("read", 60)] * 7 + [("sent", 413)], ["http.request", "http.disconnect"])


# --------------------------------------------------------------------------------- judging
def test_submissions_are_idempotent_and_committed_before_they_are_read(server, tmp_path):
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        first = http.post("/v1/submissions", json=body(0, "runtime: 0.5", tag="a"))
        again = http.post("/v1/submissions", json=body(0, "runtime: 0.5", tag="a"))
        assert first.status_code == 202 and again.status_code == 200
        sub_id = first.json()["id"]
        assert again.json()["id"] == sub_id
        done = http.get(f"/v1/submissions/{sub_id}", params={"wait_s": 30}).json()
        assert done["state"] == "done" and done["verdict"]["correct"]
        # Read it: it is in the results database already.
        assert verdict_rows(tmp_path / "results.sqlite") == [("serve", done["task_id"], done["task_name"],
                                                              done["candidate_hash"])]
        verdict = http.get(f"/v1/submissions/{sub_id}/verdict")
        assert verdict.status_code == 200 and verdict.json()["runtime"]["median_ms"] == 0.5
        after = http.post("/v1/submissions", json=body(0, "runtime: 0.5", tag="a"))
        assert after.status_code == 200 and after.json()["state"] == "done"
        assert http.get(f"/v1/submissions/{'f' * 32}").status_code == 404
        metrics = http.get("/v1/metrics").text
    assert "cuda_agent_serve_verdicts_total 1" in metrics
    assert "cuda_agent_serve_duplicates_total 2" in metrics
    assert len(verdict_rows(tmp_path / "results.sqlite")) == 1


def test_the_client_resolves_futures_and_judge_errors(server, tmp_path):
    with JudgeClient(server.url, TOKEN, run="rl-step-1", config=ClientConfig(poll_wait_s=5)) as client:
        assert client.wait_ready(60)
        futures = [client.submit(task(i % 2), scripted(f"runtime: {1 + i / 10}", tag=str(i))) for i in range(6)]
        broken = client.submit(task(2), scripted("judge-error"))
        verdicts = [f.result(timeout=120) for f in futures]
        with pytest.raises(JudgeError, match="reference does not import"):
            broken.result(timeout=120)
        assert client.info().device == "cpu"
    assert [v.runtime.median_ms for v in verdicts] == pytest.approx([1 + i / 10 for i in range(6)])
    with sqlite3.connect(tmp_path / "results.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM verdicts WHERE run='rl-step-1'").fetchone()[0] == 6
        assert conn.execute("SELECT category FROM judge_failures").fetchall() == [("reference",)]


def test_a_full_queue_answers_429_and_the_client_waits_it_out(tmp_path):
    s = LoopbackServer(make_service(tmp_path, max_pending=2))
    try:
        with httpx.Client(base_url=s.url, headers=AUTH) as http:
            for i in range(2):
                assert http.post("/v1/submissions", json=body(0, "sleep: 1.0", tag=str(i))).status_code == 202
            full = http.post("/v1/submissions", json=body(0, tag="third"))
            assert full.status_code == 429 and full.headers["retry-after"] == "1"
            # A duplicate of an accepted one is not new work: it is answered, not refused.
            assert http.post("/v1/submissions", json=body(0, "sleep: 1.0", tag="0")).status_code == 200
        with JudgeClient(s.url, TOKEN) as client:
            with pytest.raises(ServiceError, match="time limit"):
                client.submit(task(0), scripted(tag="third"), timeout=0.3)
            t0 = time.monotonic()
            v = client.submit(task(0), scripted(tag="third")).result(timeout=60)   # waits for room
            assert v.correct and time.monotonic() - t0 > 0.5
    finally:
        s.stop()


def test_a_run_with_other_judge_settings_is_a_conflict(tmp_path):
    s = LoopbackServer(make_service(tmp_path))
    try:
        with httpx.Client(base_url=s.url, headers=AUTH) as http:
            assert http.post("/v1/submissions", json=body(0, run="shared")).status_code == 202
    finally:
        s.stop()
    s = LoopbackServer(make_service(tmp_path, n_timed=7))
    try:
        with httpx.Client(base_url=s.url, headers=AUTH) as http:
            r = http.post("/v1/submissions", json=body(1, run="shared"))
            assert r.status_code == 409 and "other judge settings" in r.text
    finally:
        s.stop()


# --------------------------------------------------------------------------------- faults
def test_a_service_whose_judges_cannot_start_says_so(tmp_path):
    s = LoopbackServer(make_service(tmp_path, factory="pool_fakes:BrokenJudge"))
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(base_url=s.url, headers=AUTH) as http:
            while http.get("/v1/health").json()["status"] != "broken" and time.monotonic() < deadline:
                time.sleep(0.2)
            health = http.get("/v1/health")
            assert health.status_code == 503 and "CUDA is not available" in health.json()["detail"]
            assert http.post("/v1/submissions", json=body()).status_code == 503
        with JudgeClient(s.url, TOKEN, config=ClientConfig(retries=1, max_backoff_s=0.1)) as client:
            with pytest.raises(ServiceError, match="cannot judge"):
                client.wait_ready(10)
            with pytest.raises(ServiceError, match="503"):
                client.submit(task(0), scripted())
    finally:
        s.stop()


def test_a_restart_keeps_finished_verdicts_and_judges_again_what_was_in_flight(tmp_path):
    db = tmp_path / "results.sqlite"
    s = LoopbackServer(make_service(tmp_path))
    with httpx.Client(base_url=s.url, headers=AUTH, timeout=90) as http:
        done_id = http.post("/v1/submissions", json=body(0, tag="quick")).json()["id"]
        assert http.get(f"/v1/submissions/{done_id}", params={"wait_s": 30}).json()["state"] == "done"
        slow_id = http.post("/v1/submissions", json=body(1, "sleep: 5", tag="slow")).json()["id"]
        queued_id = http.post("/v1/submissions", json=body(1, tag="behind")).json()["id"]
        deadline = time.monotonic() + 30
        while http.get(f"/v1/submissions/{slow_id}").json()["state"] != "judging" and time.monotonic() < deadline:
            time.sleep(0.05)
    t0 = time.monotonic()
    s.stop()                                   # stops the pool mid-candidate
    assert time.monotonic() - t0 < 30
    assert len(verdict_rows(db)) == 1, "the candidate in flight and the one behind it have no verdict yet"

    s = LoopbackServer(make_service(tmp_path))
    try:
        assert s.service.counters["requeued_at_start"] == 2
        with httpx.Client(base_url=s.url, headers=AUTH, timeout=90) as http:
            assert http.get(f"/v1/submissions/{done_id}").json()["state"] == "done"
            for sub_id in (slow_id, queued_id):
                assert http.get(f"/v1/submissions/{sub_id}", params={"wait_s": 60}).json()["state"] == "done"
            metrics = http.get("/v1/metrics").text
    finally:
        s.stop()
    assert "cuda_agent_serve_verdicts_total 2" in metrics, "only the two unfinished ones were judged again"
    assert len(verdict_rows(db)) == 3


def test_a_verdict_committed_before_a_crash_is_not_judged_again(tmp_path):
    """The crash window between the verdict's commit and the submission's: the start-up finds the verdict."""
    from cuda_agent.db import ResultsDB
    from cuda_agent.serve.records import Submission, submission_id
    from cuda_agent.serve.service import JobStore
    from pool_fakes import ScriptedJudge

    cfg = JudgeConfig(device="cpu", compile_mode="none", cache_dir=tmp_path / "cache")
    t, c = task(0), scripted(tag="x")
    from cuda_agent.bench import settings_digest

    sub = Submission(id=submission_id("serve", t, c, settings_digest(cfg)), run="serve", state=State.QUEUED,
                     task_id=t.id, task_name=t.name, candidate_hash=c.hash, submitted_at=time.time())
    with ResultsDB(tmp_path / "results.sqlite") as db:
        db.open_run("serve", spec="serve", device="cpu", settings_digest=settings_digest(cfg), info={})
        jobs = JobStore(tmp_path / "results.sqlite")
        jobs.put_queued(sub, t, c)                                         # accepted ...
        db.add_verdict("serve", t, c, ScriptedJudge(cfg).evaluate(t, c), reward=1.0)   # ... judged, committed, then the crash
        jobs.close()
    service = make_service(tmp_path)
    try:
        assert service.counters["recovered_verdicts"] == 1 and service.counters["requeued_at_start"] == 0
        found, _ = service.lookup([sub.id])
        assert found[0].state == State.DONE and found[0].verdict.candidate_hash == sub.candidate_hash
    finally:
        service.close()


def test_clients_that_disconnect_do_not_hurt_the_service(server):
    # A request cut off in the middle of its body, and a long poll whose client goes away.
    raw = socket.create_connection(("127.0.0.1", server.port))
    raw.sendall(b"POST /v1/submissions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"task\": ")
    raw.close()
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        sub_id = http.post("/v1/submissions", json=body(0, "sleep: 1.0")).json()["id"]
        with pytest.raises(httpx.ReadTimeout):
            http.get(f"/v1/submissions/{sub_id}", params={"wait_s": 20}, timeout=0.3)
        assert http.get("/v1/health").json()["status"] == "ok"
        assert http.get(f"/v1/submissions/{sub_id}", params={"wait_s": 30}).json()["state"] == "done"
    assert server.service.counters["submitted"] == 1


def test_the_client_retries_through_a_restart(tmp_path):
    """Submissions made while the service is down go through once it is back (connection errors are retried)."""
    s = LoopbackServer(make_service(tmp_path))
    port = s.port
    s.stop()
    results = {}

    def submit_while_down():
        with JudgeClient(f"http://127.0.0.1:{port}", TOKEN,
                         config=ClientConfig(retries=40, backoff_s=0.05, max_backoff_s=0.5)) as client:
            results["v"] = client.submit(task(0), scripted(tag="late")).result(timeout=120)

    t = threading.Thread(target=submit_while_down)
    t.start()
    time.sleep(1.0)
    service = make_service(tmp_path)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(create_app(service, TOKEN), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        t.join(timeout=120)
        assert results["v"].correct
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


# --------------------------------------------------------------------------------- load
def test_many_clients_with_duplicates_lose_and_duplicate_no_verdict(tmp_path):
    """32 clients, 1,000 submissions of 250 distinct candidates (each sent 4 times, interleaved):
    every future resolves to its own candidate's verdict and the database holds each pair once."""
    s = LoopbackServer(make_service(tmp_path, judge_workers=2))
    n_distinct, copies, n_clients = 250, 4, 32
    work = [(i % 5, f"c{i}") for i in range(n_distinct)] * copies
    try:
        clients = [JudgeClient(s.url, TOKEN, run="load", config=ClientConfig(poll_wait_s=10)) for _ in range(n_clients)]

        def run(k: int):
            mine = work[k::n_clients]
            futures = [(tag, clients[k].submit(task(t), scripted(f"runtime: 0.{len(tag)}", tag=tag))) for t, tag in mine]
            return [(tag, f.result(timeout=300)) for tag, f in futures]

        t0 = time.monotonic()
        with ThreadPoolExecutor(n_clients) as ex:
            results = [r for part in ex.map(run, range(n_clients)) for r in part]
        elapsed = time.monotonic() - t0
        for c in clients:
            c.shutdown()
        counters = dict(s.service.counters)
    finally:
        s.stop()
    assert len(results) == n_distinct * copies
    by_tag = {}
    for tag, v in results:
        assert v.correct
        assert v.candidate_hash == scripted(f"runtime: 0.{len(tag)}", tag=tag).hash, "each future got its own verdict"
        by_tag.setdefault(tag, set()).add(v.candidate_hash)
    assert all(len(h) == 1 for h in by_tag.values())
    rows = verdict_rows(tmp_path / "results.sqlite")
    assert len(rows) == len(set(rows)) == n_distinct
    assert counters["submitted"] == n_distinct and counters["verdicts"] == n_distinct
    assert counters["duplicates"] == n_distinct * (copies - 1)
    print(f"load: {len(results)} submissions from {n_clients} clients in {elapsed:.1f} s")


def test_bench_judges_through_the_service(server, tmp_path):
    """`bench --judge-url`: the bench's own database and the service's both hold the run's verdicts."""
    from cuda_agent.bench import run_bench
    from cuda_agent.suite import suite_solutions

    local = JudgeConfig(device="cpu", cache_dir=tmp_path / "bench-cache")
    with JudgeClient(server.url, TOKEN) as client:
        result = run_bench("suite", None, local, levels=[1], db_path=tmp_path / "bench.sqlite", run_name="remote",
                           judge=client)
    assert result.judged_now == len(result.records) > 0 and result.failed_now == 0
    assert all(r.verdict.device_name == "scripted" for r in result.verdicts), "judged by the service's judges"
    assert {r.task_name for r in result.records} <= set(suite_solutions("cpu"))
    with sqlite3.connect(tmp_path / "results.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM verdicts WHERE run='remote'").fetchone()[0] == result.judged_now


def test_serve_refuses_to_start_without_a_good_token(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cuda_agent.cli import app

    monkeypatch.delenv("CUDA_AGENT_SERVE_TOKEN", raising=False)
    runner = CliRunner()
    res = runner.invoke(app, ["serve", "--device", "cpu"])
    assert res.exit_code == 2 and "token is required" in res.output
    short = tmp_path / "token"
    short.write_text("abc\n")
    res = runner.invoke(app, ["serve", "--token-file", str(short)])
    assert res.exit_code == 2 and "at least 16" in res.output
    res = runner.invoke(app, ["serve", "--token-file", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "missing" in res.output
    short.write_text(TOKEN)
    res = runner.invoke(app, ["serve", "--token-file", str(short), "-c", "no_such_field=1"])
    assert res.exit_code == 2 and "no_such_field" in res.output
