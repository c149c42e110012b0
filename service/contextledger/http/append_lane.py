"""``AppendLane``: the usual append answered in front of the middleware stack.

Under bench/service.py the library's ``Session.add_message`` behind a bare ASGI app on
the same server stack costs ~0.29-0.32 ms of CPU per append at 16 clients; main's
service spent 0.50-0.54 ms: the rest was the layers around the append (Starlette's
error and exception middlewares, FastAPI's, each middleware's wrapped ``send``, a
``Request`` and a ``Response``, the access line). This lane sits in front of all of
them (``ServiceApp.__call__``) and takes only the usual append:
``POST /v1/sessions/{id}/messages`` with a ``Content-Length`` body of
``application/json``. It runs the guard's checks, then the key before the body, and
hands every request the guard refuses or the route's model would not take as is to the
full stack, so those refusals and errors stay the stack's own:

1. ``Guard.refusal`` (Host in local mode, the size cap by ``Content-Length``, same-site,
   media type): a refused request goes on untouched (the guard refuses it there);
2. the key (``auth.tenant_for``), before a byte of the body is read: a missing or wrong
   key is answered here, 401 as the route's dependency answers it. (The stack's route
   reads and parses its body before its dependencies run: a body that is not JSON got
   a 422 there even without a key; here the key comes first, as docs/service/security.md
   says it does.)
3. the body, read up to its ``Content-Length`` (at most ``max_body_bytes``), parsed and
   validated as the route would (``lane.accepted``): anything it would not take as is
   goes on with the body replayed (the route's own 4xx);
4. the route's code (``rest.appended``); its errors (and the key's) rendered by the same
   problem handlers (``problems.handler_for``), an unexpected one as ``ServerErrorMiddleware``
   does (500, then raised for uvicorn's log); the 201 written as ``JSONResponse``
   writes it (same body, same headers).

Each request it answers is counted and logged by ``RequestRecords.record``, as the
stack's ``AccessLog`` does.
With a tracer provider configured everything goes through the stack (``TraceContext``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request

from contextledger import telemetry
from contextledger.errors import ContextLedgerError
from contextledger.http import problems, rest
from contextledger.http.auth import tenant_for
from contextledger.http.guard import Guard
from contextledger.http.lane import APPEND, APPEND_PATH, accepted, route
from contextledger.http.problems import Problem
from contextledger.http.replay import replay

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Record = Callable[[Scope, int, float], None]

_JSON = b"application/json"


class AppendLane:
    """The usual append, before the stack (the module's docstring says which)."""

    def __init__(
        self, stack: Callable[[Scope, Receive, Send], Awaitable[None]], guard: Guard, record: Record
    ) -> None:
        self.stack, self.guard, self.record = stack, guard, record
        self.route = route(rest.router, APPEND)
        #: Requests it answered itself (the rest went to the stack): what the tests
        #: check to know which path a request took.
        self.answered = 0

    def takes(self, scope: Scope) -> str | None:
        """The session id of a request this lane may answer, else None."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        match = APPEND_PATH.fullmatch(scope["path"])
        if match is None or telemetry.active():
            return None
        return match.group(1)

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, session_id: str, started: float
    ) -> None:
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)
        length = headers.get(b"content-length")
        ctype = headers.get(b"content-type", b"")
        if (
            length is None
            or b"transfer-encoding" in headers
            or ctype.split(b";", 1)[0].strip().lower() != _JSON
            or self.guard.refusal(scope, headers) is not None
        ):
            await self.stack(scope, receive, send)
            return
        request = Request(scope, receive)
        scope["route"] = self.route  # what the access log and metrics name it by
        scope["path_params"] = {"session_id": session_id}
        try:
            tenant = await tenant_for(request)
        except (Problem, ContextLedgerError) as exc:  # before a byte of the body is read
            self.answered += 1
            await self._problem(request, exc, send, started)
            return
        consumed: list[Message] = []
        chunks: list[bytes] = []
        size, cap = 0, self.guard.cap
        while True:
            message = await receive()
            consumed.append(message)
            if message["type"] != "http.request":
                break  # the client left: the stack's path sees the same
            chunk = message.get("body", b"")
            size += len(chunk)
            chunks.append(chunk)
            if size > cap or not message.get("more_body", False):
                break
        hdrs = request.headers
        parsed = None
        if consumed[-1]["type"] == "http.request" and size <= cap:
            parsed = accepted(hdrs, b"".join(chunks))
        if parsed is None:
            del scope["route"], scope["path_params"]  # the stack routes it itself
            await self.stack(scope, replay(consumed, receive), send)
            return
        self.answered += 1
        try:
            seqs, head = await rest.appended(
                request,
                tenant,
                session_id,
                parsed,
                hdrs.get("idempotency-key"),
                hdrs.get("if-match"),
            )
        except Exception as exc:
            await self._problem(request, exc, send, started)
            return
        body = b'{"seqs":[%s],"head":%d}' % (b",".join(b"%d" % s for s in seqs), head)
        status = 500  # until the head is out (as AccessLog counts)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 201,
                    "headers": [
                        (b"etag", b'"%d"' % head),
                        (b"content-length", b"%d" % len(body)),
                        (b"content-type", _JSON),
                    ],
                }
            )
            status = 201
            await send({"type": "http.response.body", "body": body})
        finally:
            self.record(scope, status, started)

    async def _problem(self, request: Request, exc: Exception, send: Send, started: float) -> None:
        """``exc`` answered as the stack answers it: the problem its handler makes
        (``problems.install``), or a 500 and then raised, as ``ServerErrorMiddleware``
        does with an error nothing handles."""
        status = 500
        try:
            handler = problems.handler_for(exc)
            if handler is None:
                await (await problems.unexpected_error(request, exc))(
                    request.scope, request.receive, send
                )
                raise exc
            response = await handler(request, exc)
            status = response.status_code
            await response(request.scope, request.receive, send)
        finally:
            self.record(request.scope, status, started)


class ServiceApp(FastAPI):
    """The service's FastAPI application, with the append lane in front of its stack."""

    append_lane: AppendLane | None = None

    async def full_stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request through FastAPI and every middleware (all but the append lane)."""
        await super().__call__(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = self.append_lane
        session_id = lane.takes(scope) if lane is not None and not self.root_path else None
        if session_id is None or lane is None:
            await self.full_stack(scope, receive, send)
            return
        scope["app"] = self
        await lane(scope, receive, send, session_id, time.perf_counter())
