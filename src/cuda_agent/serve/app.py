"""`cuda-agent serve`: the judge service over HTTP (FastAPI on uvicorn).

    POST /v1/submissions            SubmitRequest -> Submission  (202 new, 200 already known)
    GET  /v1/submissions/{id}       -> Submission (its verdict once done); ?wait_s=S waits for it
    GET  /v1/submissions/{id}/verdict -> Verdict (200 done; 202 not yet; 409 the judge could not judge it)
    POST /v1/submissions/status     StatusRequest -> StatusReply (waits until one of them is finished)
    GET  /v1/info                   -> ServiceInfo (judge settings)
    GET  /v1/metrics                -> Prometheus text
    GET  /v1/health                 -> Health (no token needed: status and counts only)

Every route but health needs `Authorization: Bearer TOKEN` (401 without it, compared in constant
time). Request bodies over `max_request_bytes` get 413 and are never stored (the rest of such a body
is read and dropped first, within bounds, so that the client gets the 413 and not a reset); a full queue
gets 429 with `Retry-After`; invalid fields get 422 listing where and why (the offending input is
not echoed back: it may be megabytes of source).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from cuda_agent.tasks import TaskError

from .records import API, ID_PATTERN, MAX_WAIT_S, Health, ServiceInfo, StatusReply, StatusRequest, Submission, SubmitRequest
from .service import JudgeService, QueueFull, RunConflict, ServiceBroken

POLL_S = 0.05   # how often a waiting request looks for finished submissions (a counter check, no I/O)


DRAIN_CAP = 64 << 20  # the most of a refused body read (and dropped) before its 413
DRAIN_S = 5.0         # and for how long at most, so a slow client cannot hold the worker


class BodyLimit:
    """ASGI middleware: refuse bodies over `limit` bytes with 413, by Content-Length when given and
    by counting while reading when not (chunked uploads).

    Before the 413 the rest of the body is read and dropped (a bounded "lingering" drain, as well-kept
    HTTP servers do): closing a socket with unread request bytes makes the kernel send a reset, and a
    client still writing its body then often loses the 413 and sees a protocol error instead. The
    drain stops past `drain_bytes` of body in all or `drain_s` seconds, and the 413 goes at once; it
    has to come before the 413 because once the response is complete uvicorn's `receive()` answers
    `http.disconnect` only."""

    def __init__(self, app, limit: int, *, drain_bytes: int | None = None, drain_s: float = DRAIN_S):
        self.app, self.limit = app, limit
        self.drain_bytes = min(4 * limit, DRAIN_CAP) if drain_bytes is None else drain_bytes
        self.drain_s = drain_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            # With `Expect: 100-continue` the client waits for our word before it sends the body:
            # nothing to drain. A body far over the drain bound is refused at once too: the client
            # may then see a reset, nothing to be done about that short of reading it all.
            if (length.isdigit() and int(length) <= self.drain_bytes
                    and headers.get(b"expect", b"").lower() != b"100-continue"):
                await self._drain(receive, 0)
            return await _too_large(send, self.limit)
        received = 0
        started = refused = False

        async def limited_receive():
            # Past the limit: drain the rest, answer 413 and tell the app the client left, so it stops
            # reading (the app's own error handling would turn an exception here into a 400).
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    if not started:
                        refused = True
                        if message.get("more_body", False):
                            await self._drain(receive, received)
                        await _too_large(send, self.limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            nonlocal started
            if refused:
                return  # the 413 is the answer
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise

    async def _drain(self, receive, received: int) -> None:
        """Read and drop the rest of the request body (`received` bytes of it read already) until its
        end, the client leaving, `drain_bytes` in all or `drain_s` seconds, whichever comes first."""
        deadline = time.monotonic() + self.drain_s
        while received <= self.drain_bytes:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                return
            if message["type"] != "http.request":
                return  # the client left
            received += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


async def _too_large(send, limit: int) -> None:
    body = f'{{"detail":"request body over {limit} bytes"}}'.encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def create_app(service: JudgeService, token: str) -> FastAPI:
    """The HTTP app over `service`; closes the service when the app shuts down."""
    if len(token) < 16:
        raise ValueError("the service token must have at least 16 characters")
    expected = token.encode()

    @asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            await run_in_threadpool(service.close)

    app = FastAPI(title="cuda-agent judge service", version="1", lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, limit=service.config.max_request_bytes)

    def authorised(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise HTTPException(401, "a valid token is needed: Authorization: Bearer TOKEN",
                                headers={"WWW-Authenticate": "Bearer"})

    auth = [Depends(authorised)]

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                  for e in exc.errors()[:20]]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.post(f"{API}/submissions", dependencies=auth, response_model=Submission)
    async def submit(body: SubmitRequest, response: Response):
        try:
            sub, created = await run_in_threadpool(service.submit, body)
        except TaskError as exc:
            raise HTTPException(422, [{"loc": ["body", "task", "source"], "msg": str(exc), "type": "task"}]) from None
        except QueueFull as exc:
            raise HTTPException(429, str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
        except RunConflict as exc:
            raise HTTPException(409, str(exc)) from None
        except ServiceBroken as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "30"}) from None
        response.status_code = 202 if created else 200
        return sub

    async def wait_for(ids: list[str], wait_s: float) -> tuple[list[Submission], list[str]]:
        """Until one of `ids` is finished (or unknown), or `wait_s` passed."""
        deadline = time.monotonic() + wait_s
        while True:
            seen = service.version
            found, unknown = await run_in_threadpool(service.lookup, ids)
            if unknown or any(s.finished for s in found) or time.monotonic() >= deadline:
                return found, unknown
            while service.version == seen and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)

    @app.post(f"{API}/submissions/status", dependencies=auth, response_model=StatusReply)
    async def status(body: StatusRequest):
        found, unknown = await wait_for(list(dict.fromkeys(body.ids)), body.wait_s)
        return StatusReply(submissions=found, unknown=unknown)

    @app.get(f"{API}/submissions/{{sub_id}}", dependencies=auth, response_model=Submission)
    async def get_submission(sub_id: str, wait_s: float = Query(0.0, ge=0.0, le=MAX_WAIT_S)):
        found, _ = await wait_for([_valid_id(sub_id)], wait_s)
        if not found:
            raise HTTPException(404, f"no submission {sub_id}")
        return found[0]

    @app.get(f"{API}/submissions/{{sub_id}}/verdict", dependencies=auth)
    async def get_verdict(sub_id: str, wait_s: float = Query(0.0, ge=0.0, le=MAX_WAIT_S)):
        found, _ = await wait_for([_valid_id(sub_id)], wait_s)
        if not found:
            raise HTTPException(404, f"no submission {sub_id}")
        sub = found[0]
        if sub.verdict is not None:
            return JSONResponse(sub.verdict.model_dump(mode="json"))
        if sub.failure is not None:
            return JSONResponse({"detail": sub.failure.model_dump()}, status_code=409)
        return JSONResponse({"detail": f"submission {sub_id} is {sub.state.value}"}, status_code=202,
                            headers={"Retry-After": "1"})

    @app.get(f"{API}/info", dependencies=auth, response_model=ServiceInfo)
    async def info():
        return await run_in_threadpool(service.info)

    @app.get(f"{API}/metrics", dependencies=auth)
    async def metrics():
        values = await run_in_threadpool(service.metrics)
        return PlainTextResponse("".join(f"{k} {v:g}\n" for k, v in sorted(values.items())),
                                 media_type="text/plain; version=0.0.4")

    @app.get(f"{API}/health", response_model=Health)
    async def health(response: Response):
        h = await run_in_threadpool(service.health)
        if h.status == "broken":
            response.status_code = 503
        return h

    return app


def _valid_id(sub_id: str) -> str:
    import re

    if not re.match(ID_PATTERN, sub_id):
        raise HTTPException(422, [{"loc": ["path", "sub_id"], "msg": "a submission id is 32 lowercase hex digits",
                                   "type": "id"}])
    return sub_id
