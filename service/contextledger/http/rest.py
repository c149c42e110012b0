"""The REST API: thin routes over ``Ledger``/``Session`` methods, nothing re-implemented.

``Idempotency-Key`` becomes ``idempotency_key`` and ``If-Match: <seq>`` becomes
``expected_seq``; every error is the library's typed error rendered as problem+json.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from contextledger import Checkpoint, Event, Session, SessionInfo, VerifyReport
from contextledger.core.messages import validate_message
from contextledger.core.shapes import shape_of
from contextledger.errors import (
    ContextLedgerError,
    InvalidArgument,
    SessionErased,
    SessionExists,
    SessionNotFound,
)
from contextledger.http.auth import current_tenant, tenant_for
from contextledger.http.guard import check_posted_config
from contextledger.http.problems import Problem
from contextledger.http.tenancy import Tenants
from contextledger.http.watch import Watches
from contextledger.provider_shapes import render

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
Tenant = Annotated[str, Depends(current_tenant)]
SessionId = Annotated[str, Field(min_length=1, max_length=200)]
MAX_BATCH = 1000
IDEMPOTENCY_KEY_MAX = 200
IF_MATCH_MAX = 40
#: How often the one shared poll of a watched session reads what is new (``watch.py``).
SSE_POLL_S = 0.25
#: How long a stream sleeps at most between looks at its client, its key and the poll.
SSE_WAKE_S = 1.0
SSE_KEEPALIVE_S = 15.0
#: How often an event stream checks that its key still holds (a revoked key ends it).
SSE_KEY_CHECK_S = 5.0


#: A session id is one path segment of every session route: "/" would make it unreachable.
SESSION_ID_PATTERN = r"^[^/]+$"


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(min_length=1, max_length=200, pattern=SESSION_ID_PATTERN)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    config: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class MessageAppend(BaseModel):
    """One message (``message``) or a batch (``messages``), appended in order."""

    model_config = ConfigDict(extra="forbid")
    message: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_BATCH)
    critical: bool = False


class CheckpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str | None = Field(default=None, min_length=1, max_length=200)


class Rollback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # strict: JSON true is no seq 1, nor 3.0 seq 3 (lax int took both, and wrote)
    to: str | StrictInt = Field(description="a checkpoint label, or a seq")


class Fork(BaseModel):
    """``POST /v1/sessions/{id}/fork``: the new session's id and where it stands."""

    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(min_length=1, max_length=200, pattern=SESSION_ID_PATTERN)
    at: Annotated[str, Field(min_length=1, max_length=200)] | StrictInt | None = Field(
        default=None, description="a checkpoint label, or a seq; default the head"
    )
    metadata: dict[str, Any] | None = Field(
        default=None, description="the fork's metadata; default the parent's"
    )


class Compact(BaseModel):
    model_config = ConfigDict(extra="forbid")
    strategy: str | None = Field(default=None, max_length=40)
    token_budget: int | None = Field(default=None, gt=0, le=2**31 - 1)


class Provider:
    """Stands in for a provider object: the target model names the request's shape."""

    def __init__(self, model: str) -> None:
        self.name = self.default_model = model


def tenants_of(request: Request) -> Tenants:
    tenants: Tenants = request.app.state.tenants
    return tenants


async def open_session(request: Request, tenant: str, session_id: str) -> Session:
    return await tenants_of(request).session(tenant, session_id)


def session_out(info: SessionInfo) -> dict[str, Any]:
    return {
        "session_id": info.session_id,
        "created_at": info.created_at.isoformat(),
        "model": info.model,
        "config": dict(info.config),
        "metadata": dict(info.metadata),
        "head": info.head,
        "view_tokens": info.view_tokens,
        "view_count": info.view_count,
        "parent": (
            None if info.parent is None else {"session_id": info.parent[0], "seq": info.parent[1]}
        ),
    }


def event_out(e: Event) -> dict[str, Any]:
    return {
        "seq": e.seq,
        "type": e.type,
        "version": e.version,
        "data": dict(e.data) if e.data is not None else e.payload.to_data(),
        "tokens": e.tokens,
        "created_at": e.created_at.isoformat(),
        "hash": e.hash,
        "idempotency_key": e.idempotency_key,
    }


def checkpoint_out(c: Checkpoint) -> dict[str, Any]:
    return {"seq": c.seq, "label": c.label, "created_at": c.created_at.isoformat()}


def verify_out(r: VerifyReport) -> dict[str, Any]:
    return {
        "session_id": r.session_id,
        "ok": r.ok,
        "events": r.events,
        "first_bad_seq": r.first_bad_seq,
        "reason": r.reason,
    }


def parse_if_match(value: str | None) -> int | None:
    """``If-Match: 5`` or ``"5"`` (an ETag) → 5; ``*`` (any head: RFC 9110) → no check."""
    if value is None or value.strip() == "*":
        return None
    raw = value.strip().removeprefix("W/").strip('"')
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidArgument("If-Match must be the session head (a seq)", field="If-Match")
    return int(raw)


def _cursor(info: SessionInfo) -> str:
    raw = json.dumps([info.created_at.isoformat(), info.session_id])
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _after(cursor: str) -> tuple[datetime, str]:
    try:
        created, session_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        when = datetime.fromisoformat(str(created))
        if when.tzinfo is None:
            raise ValueError("naive")
        return when, str(session_id)
    except (ValueError, TypeError, UnicodeError):
        raise InvalidArgument("cursor is not one this service returned", field="cursor") from None


# -- sessions -----------------------------------------------------------------------------


@router.post("", status_code=201)
async def create_session(body: SessionCreate, request: Request, tenant: Tenant) -> dict[str, Any]:
    tenants = tenants_of(request)
    check_posted_config(body.config, request.app.state.settings)
    ledger = await tenants.ledger(tenant)
    try:
        await ledger.session(body.session_id, create=False)
    except SessionNotFound:
        pass
    else:
        raise SessionExists(f"session {body.session_id!r} already exists")
    session = await tenants.session(
        tenant,
        body.session_id,
        create=True,
        model=body.model,
        config=body.config,
        metadata=body.metadata,
    )
    return session_out(await session.refresh())


@router.get("")
async def list_sessions(
    request: Request,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=600)] = None,
) -> dict[str, Any]:
    """Sessions in creation order, ``limit`` at a time; ``next_cursor`` fetches the next page."""
    ledger = await tenants_of(request).ledger(tenant)
    infos = await ledger.sessions(after=_after(cursor) if cursor else None, limit=limit + 1)
    page = infos[:limit]
    more = len(infos) > limit
    return {
        "items": [session_out(i) for i in page],
        "next_cursor": _cursor(page[-1]) if more and page else None,
    }


@router.get("/{session_id}")
async def get_session(session_id: str, request: Request, tenant: Tenant) -> dict[str, Any]:
    session = await open_session(request, tenant, session_id)
    return session_out(await session.refresh())


@router.delete("/{session_id}")
async def purge_session(
    session_id: str,
    request: Request,
    tenant: Tenant,
    reason: Annotated[str, Query(min_length=1, max_length=1000)],
    erase: Annotated[bool, Query()] = False,
    actor: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> dict[str, Any]:
    """The audited purge: removes the session; who, when and why stay in ``purges``.

    ``erase=true``: erase it instead, by destroying its data key (and its forks with
    it): the events stay, sealed, so the chain verifies; reads answer 410. ``actor``
    (on whose behalf) is recorded with the reason. A session written without a data
    key answers 409 ``SESSION_NOT_ENCRYPTED``: purge it."""
    tenants = tenants_of(request)
    ledger = await tenants.ledger(tenant)
    await open_session(request, tenant, session_id)  # 404 (410 if erased) before anything else
    if erase:
        receipts = await ledger.erase(session_id, reason=reason, actor=actor)
        for r in receipts:
            tenants.forget(tenant, r.session_id)
        return {"session_id": session_id, "erased": [r.to_dict() for r in receipts]}
    events = await ledger.store.purge(session_id, reason)
    tenants.forget(tenant, session_id)
    return {"session_id": session_id, "purged_events": events}


# -- messages ---------------------------------------------------------------------------


@router.post("/{session_id}/messages", status_code=201, response_model=None)
async def append_messages(
    session_id: str,
    body: MessageAppend,
    request: Request,
    tenant: Tenant,
    idempotency_key: Annotated[str | None, Header(max_length=IDEMPOTENCY_KEY_MAX)] = None,
    if_match: Annotated[str | None, Header(max_length=IF_MATCH_MAX)] = None,
) -> JSONResponse:
    """Append one message or a batch. A batch of OpenAI chat messages is one transaction
    (all or nothing; ``Idempotency-Key`` and ``If-Match`` cover it whole); items of
    another provider's shape are converted and appended one by one, the key as
    ``<key>:<index>``. Either way a batch is checked whole before anything is written."""
    return await append(request, tenant, session_id, body, idempotency_key, if_match)


async def append(
    request: Request,
    tenant: str,
    session_id: str,
    body: MessageAppend,
    idempotency_key: str | None,
    if_match: str | None,
) -> JSONResponse:
    """The append route's work and answer, shared with ``lane.Lane``."""
    seqs, head = await appended(request, tenant, session_id, body, idempotency_key, if_match)
    return JSONResponse(  # the hot path: no response-model pass
        {"seqs": seqs, "head": head}, status_code=201, headers={"ETag": f'"{head}"'}
    )


async def appended(
    request: Request,
    tenant: str,
    session_id: str,
    body: MessageAppend,
    idempotency_key: str | None,
    if_match: str | None,
) -> tuple[list[int], int]:
    """The append route's work: the seqs written and the head after them (shared with
    ``append_lane.AppendLane``, which renders the 201 itself)."""
    if (body.message is None) == (body.messages is None):
        raise InvalidArgument("send either 'message' or 'messages'", field="message")
    batch = [body.message] if body.message is not None else list(body.messages or [])
    if not batch:
        raise InvalidArgument("'messages' is empty", field="messages")
    if len(batch) > 1:  # a rejected batch writes nothing: check it whole first
        for i, m in enumerate(batch):
            try:
                validate_message(m)
            except ContextLedgerError as exc:
                exc.details["index"] = i
                raise
    expected = parse_if_match(if_match)
    session = await open_session(request, tenant, session_id)
    if len(batch) > 1 and all(shape_of(m) == "openai" for m in batch):
        # one transaction: a conflict or an outage mid-batch leaves nothing written
        seqs = await session.add_messages(
            batch, critical=body.critical, idempotency_key=idempotency_key, expected_seq=expected
        )
    else:  # one message, or items of another provider's shape: converted one by one
        seqs = []
        for i, message in enumerate(batch):
            key = idempotency_key
            if key is not None and len(batch) > 1:
                key = f"{idempotency_key}:{i}"
            seq = await session.add_message(
                message,
                critical=body.critical,
                idempotency_key=key,
                expected_seq=expected if i == 0 else seqs[-1],
            )
            assert seq is not None
            seqs.append(seq)
    request.app.state.metrics.appends.inc(len(seqs))
    return seqs, session.head


@router.get("/{session_id}/messages")
async def branch_messages(session_id: str, request: Request, tenant: Tenant) -> dict[str, Any]:
    """The current branch, uncompacted (``Session.get_messages``)."""
    session = await open_session(request, tenant, session_id)
    return {"messages": await session.get_messages(), "head": session.head}


@router.get("/{session_id}/view")
async def view(
    session_id: str,
    request: Request,
    tenant: Tenant,
    at: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> dict[str, Any]:
    """The working view now, or replayed right after seq ``at``."""
    session = await open_session(request, tenant, session_id)
    messages = await session.view() if at is None else await session.view_at(at)
    return {"messages": messages, "at": at if at is not None else session.head}


@router.get("/{session_id}/context")
async def context(
    session_id: str,
    request: Request,
    tenant: Tenant,
    token_budget: Annotated[int | None, Query(gt=0, le=2**31 - 1)] = None,
    provider: Annotated[
        Literal["openai", "anthropic", "gemini"] | None,
        Query(description="The messages' shape; the system prompt comes apart unless openai."),
    ] = None,
    model: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description="The model the request goes to: its window sets the budget, and "
            "the view is finished for it (signed thinking kept for Anthropic only…).",
        ),
    ] = None,
    at: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> dict[str, Any]:
    """The budgeted request view (``get_messages_for_request``), or ``request_at(at)``
    with the same budget, in ``provider``'s shape."""
    session = await open_session(request, tenant, session_id)
    target = Provider(model) if model else None
    if at is not None:
        messages = await session.request_at(at, target, token_budget=token_budget)
    else:
        messages = await session.get_messages_for_request(
            token_budget=token_budget, provider=target, in_force=False
        )
    out: dict[str, Any] = {
        "messages": messages,
        "at": at if at is not None else session.request_seq,
    }
    if provider is not None:
        shaped = await render(messages, provider, model or session.model)
        out.update(messages=shaped.messages, provider=provider, system=shaped.system)
    return out


# -- checkpoints, rollback, compaction ----------------------------------------------------


@router.post("/{session_id}/checkpoints", status_code=201)
async def create_checkpoint(
    session_id: str, body: CheckpointCreate, request: Request, tenant: Tenant
) -> dict[str, Any]:
    session = await open_session(request, tenant, session_id)
    return checkpoint_out(await session.checkpoint(body.label))


@router.get("/{session_id}/checkpoints")
async def list_checkpoints(session_id: str, request: Request, tenant: Tenant) -> dict[str, Any]:
    session = await open_session(request, tenant, session_id)
    return {"items": [checkpoint_out(c) for c in await session.checkpoints()]}


@router.post("/{session_id}/rollback")
async def rollback(
    session_id: str, body: Rollback, request: Request, tenant: Tenant
) -> dict[str, Any]:
    session = await open_session(request, tenant, session_id)
    seq = await session.rollback(body.to)
    return {"seq": seq, "head": session.head}


@router.post("/{session_id}/fork", status_code=201, response_model=None)
async def fork(session_id: str, body: Fork, request: Request, tenant: Tenant) -> JSONResponse:
    """A new session standing on this one at ``at`` (copy-on-write: one pointer event,
    nothing copied); its view is this session's view at that seq, item for item."""
    ledger = await tenants_of(request).ledger(tenant)
    await open_session(request, tenant, session_id)  # 404 before anything else
    new = await ledger.fork(session_id, body.session_id, at=body.at, metadata=body.metadata)
    return JSONResponse(
        session_out(await new.refresh()),
        status_code=201,
        headers={"Location": f"/v1/sessions/{quote(body.session_id, safe='')}"},
    )


@router.post("/{session_id}/compact")
async def compact(
    session_id: str, body: Compact, request: Request, tenant: Tenant
) -> dict[str, Any]:
    session = await open_session(request, tenant, session_id)
    saved = await session.compact(body.strategy, token_budget=body.token_budget)
    return {"tokens_saved": saved, "head": session.head}


@router.get("/{session_id}/verify")
async def verify(session_id: str, request: Request, tenant: Tenant) -> dict[str, Any]:
    """Walk the chain; an erased session's too (it hashes the sealed form it keeps)."""
    try:
        session = await open_session(request, tenant, session_id)
    except SessionErased:
        ledger = await tenants_of(request).ledger(tenant)
        return verify_out(await ledger.verify(session_id))
    return verify_out(await session.verify())


# -- events ------------------------------------------------------------------------------


@router.get("/{session_id}/events")
async def events(
    session_id: str,
    request: Request,
    tenant: Tenant,
    from_seq: Annotated[int, Query(ge=1, le=2**62)] = 1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Events in seq order, ``limit`` at a time; ``next_from_seq`` continues."""
    session = await open_session(request, tenant, session_id)
    items = [event_out(e) async for e in session.events(from_seq, from_seq + limit - 1)]
    full = len(items) == limit
    return {"items": items, "next_from_seq": items[-1]["seq"] + 1 if full else None}


@router.get("/{session_id}/events/stream", response_class=StreamingResponse)
async def event_stream(
    session_id: str,
    request: Request,
    tenant: Tenant,
    from_seq: Annotated[int, Query(ge=1, le=2**62)] = 1,
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
) -> StreamingResponse:
    """Server-sent events: every event from ``from_seq`` (or after ``Last-Event-ID``), then
    new ones as they are appended, by any process."""
    session = await open_session(request, tenant, session_id)
    start = from_seq
    if last_event_id:  # what the browser saw last: one of our seqs, or a clear 422
        if not (last_event_id.isascii() and last_event_id.isdigit()) or len(last_event_id) > 18:
            raise InvalidArgument("Last-Event-ID must be an event's seq", field="Last-Event-ID")
        start = int(last_event_id) + 1
    stopping: asyncio.Event = request.app.state.stopping
    tails: dict[str, int] = request.app.state.tails
    cap = request.app.state.settings.sse_tails_per_tenant
    if tails.get(tenant, 0) >= cap:
        raise Problem(
            429,
            "TOO_MANY_STREAMS",
            f"this tenant already has {cap} event streams open (sse_tails_per_tenant)",
        )
    tails[tenant] = tails.get(tenant, 0) + 1

    async def still_allowed() -> bool:
        """The key that opened the stream still names its tenant (not revoked)."""
        try:
            return await tenant_for(request) == tenant
        except Problem:
            return False

    async def stream() -> AsyncIterator[str]:
        try:
            async for chunk in tail():
                yield chunk
        finally:
            tails[tenant] -= 1
            if not tails[tenant]:
                del tails[tenant]

    async def tail() -> AsyncIterator[str]:
        cursor = start
        loop = asyncio.get_running_loop()
        checked = idle_since = loop.time()
        watches: Watches = request.app.state.watches
        async with watches.watching(tenant, session) as watch:
            while not stopping.is_set() and not await request.is_disconnected():
                now = loop.time()
                if now - checked >= SSE_KEY_CHECK_S:
                    checked = now
                    if not await still_allowed():
                        problem = {
                            "code": "UNAUTHORIZED",
                            "detail": "the stream's key is no longer valid",
                        }
                        yield "event: error\ndata: " + json.dumps(problem) + "\n\n"
                        return
                shared = watch.since(cursor)
                events = (
                    shared
                    if shared is not None
                    else [e async for e in session.events(cursor, cursor + 499)]
                )
                for e in events:
                    yield f"id: {e.seq}\nevent: {e.type}\ndata: {json.dumps(event_out(e))}\n\n"
                    cursor = e.seq + 1
                if events:
                    idle_since = now
                    continue
                if now - idle_since >= SSE_KEEPALIVE_S:
                    idle_since = now
                    yield ": keep-alive\n\n"
                await watch.wait(cursor, SSE_WAKE_S)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
