"""``AppendLane``: ``POST /v1/sessions/{id}/messages`` without the framework's per-request work.

Appending is the service's hot path, and FastAPI's routing, dependency solving and
exception middlewares cost a request more CPU than the append itself (py-spy under
bench/service.py). This pure ASGI middleware serves the requests that the route's own
model and header limits accept, through the route's own code (``rest.append``), and
hands every other request, its body replayed, to FastAPI: a rejected request gets the
route's own error, and the OpenAPI document still describes the route.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.datastructures import Headers

from contextledger.http import problems, rest
from contextledger.http.auth import current_tenant

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PATH = "/v1/sessions/{session_id}/messages"
_PATH = re.compile(r"/v1/sessions/([^/]+)/messages")  # starlette's {name}: one segment


class AppendLane:
    def __init__(self, app: Any, route: APIRoute) -> None:
        self.app, self.route = app, route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = (
            _PATH.fullmatch(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
            else None
        )
        if match is None:
            await self.app(scope, receive, send)
            return
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
            await self.app(scope, _replay(consumed, receive), send)
            return
        session_id = match.group(1)
        scope["route"] = self.route  # what the access log and metrics name the request by
        scope["path_params"] = {"session_id": session_id}
        request = Request(scope, receive)
        try:
            tenant = await current_tenant(request)
            response = await rest.append(
                request,
                tenant,
                session_id,
                parsed,
                headers.get("idempotency-key"),
                headers.get("if-match"),
            )
        except Exception as exc:
            handler = problems.handler_for(exc)
            if handler is None:
                raise  # to unexpected_error, as from the route
            response = await handler(request, exc)
        await response(scope, receive, send)


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
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    try:
        return rest.MessageAppend.model_validate(data, from_attributes=True)
    except ValidationError:
        return None


def _replay(consumed: list[Message], receive: Receive) -> Receive:
    """``receive`` that first gives back what the lane read."""
    pending = list(consumed)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def append_route() -> APIRoute:
    """The append route (FastAPI puts it in ``scope["route"]``; so does the lane)."""
    for route in rest.router.routes:
        if isinstance(route, APIRoute) and route.path == PATH and "POST" in (route.methods or ()):
            return route
    raise LookupError(f"no POST {PATH} route")
