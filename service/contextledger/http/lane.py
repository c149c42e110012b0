"""``Lane``: the hot routes without the framework's per-request work (the usual append
is answered before it, by ``append_lane.AppendLane``; this lane takes the appends that
reach the stack: chunked bodies, say).

Appending is the service's hot path, and FastAPI's routing, dependency solving and
exception middlewares cost a request more CPU than the append itself (py-spy under
bench/service.py). This pure ASGI middleware serves ``POST /v1/sessions/{id}/messages``
requests that the route's own model and header limits accept, through the route's own
code (``rest.append``), and hands every other request, its body replayed, to FastAPI: a
rejected request gets the route's own error, and the OpenAPI document still describes
the route. ``POST /v1/chat/completions`` goes straight to its route's function, which
reads and checks its body itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute, APIRouter
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.responses import Response

from contextledger.http import problems, proxy, rest
from contextledger.http.auth import current_tenant
from contextledger.http.replay import replay

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

APPEND = "/v1/sessions/{session_id}/messages"
PROXY = "/v1/chat/completions"
APPEND_PATH = re.compile(r"/v1/sessions/([^/]+)/messages")  # starlette's {name}: one segment


class Lane:
    """The hot routes' fast path: appends (above) and the proxy, whose route reads its
    own body, so FastAPI adds nothing to it but routing and exception handling."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.append_route = route(rest.router, APPEND)
        self.proxy_route = route(proxy.router, PROXY)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
        elif scope["path"] == PROXY:
            scope["route"], scope["path_params"] = self.proxy_route, {}
            request = Request(scope, receive)
            await _answer(request, send, proxy.chat_completions(request))
        elif (match := APPEND_PATH.fullmatch(scope["path"])) is not None:
            await self._append(scope, receive, send, match.group(1))
        else:
            await self.app(scope, receive, send)

    async def _append(self, scope: Scope, receive: Receive, send: Send, session_id: str) -> None:
        consumed: list[Message] = []
        chunks: list[bytes] = []
        while True:
            message = await receive()
            consumed.append(message)
            if message["type"] != "http.request":
                break  # the client left: FastAPI's path sees the same
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        headers = Headers(scope=scope)
        parsed = None
        if consumed[-1]["type"] == "http.request":
            parsed = accepted(headers, b"".join(chunks))
        if parsed is None:
            await self.app(scope, replay(consumed, receive), send)
            return
        scope["route"] = self.append_route  # what the access log and metrics name it by
        scope["path_params"] = {"session_id": session_id}
        request = Request(scope, receive)

        async def respond() -> Response:
            tenant = await current_tenant(request)
            return await rest.append(
                request,
                tenant,
                session_id,
                parsed,
                headers.get("idempotency-key"),
                headers.get("if-match"),
            )

        await _answer(request, send, respond())


async def _answer(request: Request, send: Send, work: Awaitable[Response]) -> None:
    """Send what the route's code answers, or the problem its error maps to (as
    starlette's ExceptionMiddleware would); anything else goes on to unexpected_error."""
    try:
        response = await work
    except Exception as exc:
        handler = problems.handler_for(exc)
        if handler is None:
            raise
        response = await handler(request, exc)
    await response(request.scope, request.receive, send)


def accepted(headers: Headers, body: bytes) -> rest.MessageAppend | None:
    """The body as the route would see it, or None for anything the route might reject
    or read differently (FastAPI then answers)."""
    ctype = headers.get("content-type")  # none: FastAPI's strict content type rejects it
    if ctype is None or ctype.split(";", 1)[0].strip().lower() != "application/json":
        return None
    key, if_match = headers.get("idempotency-key"), headers.get("if-match")
    if key is not None and len(key) > rest.IDEMPOTENCY_KEY_MAX:
        return None
    if if_match is not None and len(if_match) > rest.IF_MATCH_MAX:
        return None
    if not body:
        return None
    try:
        data = json.loads(body)  # what starlette's Request.json() does
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        return rest.MessageAppend.model_validate(data, from_attributes=True)
    except ValidationError:
        return None


def route(router: APIRouter, path: str) -> APIRoute:
    """The POST route at ``path`` (FastAPI puts it in ``scope["route"]``; so does the lane)."""
    for candidate in router.routes:
        if (
            isinstance(candidate, APIRoute)
            and candidate.path == path
            and "POST" in (candidate.methods or ())
        ):
            return candidate
    raise LookupError(f"no POST {path} route")
