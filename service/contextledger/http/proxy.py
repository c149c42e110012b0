"""``POST /v1/chat/completions``: an OpenAI-compatible proxy that gives any client
managed, budgeted, auditable memory.

Clients resend the whole history each call. The proxy finds the common prefix
with the session's branch and appends only what is new (each new message under
an idempotency key derived from its position and content, so a retried request
appends nothing twice), replaces the messages with the session's budgeted
request view, forwards it to the configured upstream, streams the reply back as it
arrives and records it in the ledger. A resend of a request already answered (the
client never saw the answer) is forwarded with the view its first try got, replayed
from the ledger. An upstream failure keeps the client's new messages recorded (they
were said; the ledger holds what happened): the client's retry finds them there,
appends nothing and is answered from the same budgeted view. An OpenAI-compatible
upstream gets the request relayed as is (http/upstream.py); litellm carries every
other provider, and the fallbacks.

The reply is recorded once the response is on its way (``Tenants.defer``), off the
client's wait: the next request for the session through this process waits for that
record before it compares histories, and shutdown waits for every pending one. The
reply's record and a resend of the same message at the same place share one
idempotency key, so another process that sees the resend first appends it once.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import re
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from contextledger import Session
from contextledger.appends import check_size
from contextledger.core.messages import ROLES, validate_message
from contextledger.core.shapes import shape_of
from contextledger.errors import ConcurrencyError, SessionNotFound
from contextledger.http import upstream
from contextledger.http.auth import tenant_for
from contextledger.http.problems import Problem
from contextledger.http.rest import Provider
from contextledger.http.settings import Settings
from contextledger.http.tenancy import Tenants

if TYPE_CHECKING:
    from aiohttp import ClientResponse

    from contextledger.http.metrics import Metrics

log = structlog.get_logger(__name__)
#: structlog's filter_by_level asks this logger; asked first, a debug line that would be
#: dropped costs ~0.2 instead of ~11 us (its event is built before it is dropped).
_stdlog = logging.getLogger(__name__)
router = APIRouter(tags=["proxy"])
#: Request fields the proxy handles itself; everything else goes to the upstream as is.
OWN_FIELDS = frozenset({"messages", "model", "user", "stream", "stream_options"})


def loads(body: bytes) -> tuple[Any, bool]:
    """The request body parsed, and whether orjson read it: by orjson (a client resends
    its whole history every call, ~145 kB at 1,200 messages: 0.94 ms in ``json.loads``,
    0.51 in orjson), by ``json`` where orjson refuses what ``json`` reads (NaN, lone
    surrogates), so the same bodies are accepted. (An integer beyond 64 bits becomes a
    float in orjson, as in most JSON parsers; no chat completion field holds one.)"""
    try:
        return orjson.loads(body), True
    except orjson.JSONDecodeError:
        return json.loads(body), False


def essence(message: Mapping[str, Any]) -> dict[str, Any]:
    """What a message says, without the empty fields SDKs add (``refusal: None``, ...).

    Both sides of the prefix comparison, and what is recorded, go through this.
    """
    out: dict[str, Any] = {"role": message.get("role")}
    content = message.get("content")
    calls = message.get("tool_calls")
    if calls and isinstance(calls, list):
        out["content"] = content or None
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": c.get("type") or "function",
                "function": {
                    "name": (c.get("function") or {}).get("name"),
                    "arguments": (c.get("function") or {}).get("arguments") or "",
                },
            }
            for c in calls
            if isinstance(c, Mapping)
        ]
    else:
        out["content"] = content if content is not None else ""
    for key in ("name", "tool_call_id"):
        if message.get(key):
            out[key] = message[key]
    return out


def common_prefix(stored: Sequence[Mapping[str, Any]], sent: Sequence[Mapping[str, Any]]) -> int:
    n = 0
    for a, b in zip(stored, sent, strict=False):
        if essence(a) != essence(b):
            break
        n += 1
    return n


def _canonical(message: Mapping[str, Any]) -> bytes:
    return json.dumps(essence(message), sort_keys=True, separators=(",", ":"), default=str).encode()


def position_key(position: int, message: Mapping[str, Any]) -> str:
    """The idempotency key of ``message`` at ``position`` of the conversation: the same
    for a reply the proxy records and for that reply resent by the client (an earlier
    version keyed them apart, ``proxy:in:``/``proxy:out:``)."""
    return f"proxy:at:{position}:" + hashlib.sha256(_canonical(message)).hexdigest()[:32]


def fields(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """The fields ``essence`` reads, as sent: equal fields mean equal essences (the
    reverse need not hold: a mismatch only costs a read of the branch). Compared as
    tuples, ~0.3 us a message (a sha256 over their ``repr`` took ~3 us)."""
    get = message.get
    return (get("role"), get("content"), get("tool_calls"), get("name"), get("tool_call_id"))


@dataclass(slots=True)
class _Prefix:
    """What this process knows the session's branch holds, so the common prefix with a
    resent history is found without reading the branch: valid while the session's head
    is still ``head`` (any other write through this process moves it).

    ``items`` are the messages as the client sent them, except after ``exact``: those
    (a reply the proxy recorded) are compared by ``fields`` once, then kept as resent.
    Equal dicts have equal fields, and the client resends its history as it sent it,
    so most of a resend is one C-level list comparison: ~0.07 against ~0.25 ms for
    ``fields`` of 400 messages."""

    head: int
    items: list[Mapping[str, Any]]
    exact: int


#: Per cached session (dropped with it). A miss costs one read of the branch, as before.
_prefixes: weakref.WeakKeyDictionary[Session, _Prefix] = weakref.WeakKeyDictionary()


async def _common_prefix(
    session: Session, sent: Sequence[Mapping[str, Any]]
) -> tuple[int, int, int]:
    """``(k, branch length, head)``: how many of ``sent`` the branch already holds, as of
    the session's ``head`` this process knew. No read when this process wrote the
    branch's last messages itself: one comparison with what was sent."""
    known = _prefixes.get(session)
    head = session.head
    if known is not None and known.head == head:
        count, exact = len(known.items), known.exact
        if (
            count <= len(sent)
            and sent[:exact] == known.items[:exact]
            and list(map(fields, sent[exact:count])) == list(map(fields, known.items[exact:]))
        ):
            known.items[exact:] = sent[exact:count]
            known.exact = count
            return count, count, head
    branch = await session.get_messages()
    k = common_prefix(branch, sent)
    if k == len(branch):  # remembered as the client sends it, so its next resend matches
        _prefixes[session] = _Prefix(head, list(sent[:k]), k)
    else:
        _prefixes.pop(session, None)
    return k, len(branch), head


def _extend(
    session: Session,
    head_before: int,
    seq: int | None,
    message: Mapping[str, Any],
    *,
    as_sent: bool,
) -> None:
    """Extend the known prefix by what was just appended (``as_sent``: the client's
    message as it sent it, else a reply recorded here), unless anyone else (or a
    synthetic tool result) also wrote in between: then the next request reads."""
    known = _prefixes.get(session)
    if known is None:
        return
    if known.head != head_before or seq != head_before + 1:
        _prefixes.pop(session, None)
        return
    known.head = seq
    if as_sent and known.exact == len(known.items):
        known.exact += 1
    known.items.append(message)


@dataclass(frozen=True, slots=True)
class _Sent:
    """The request this process last built for a session: after the branch message
    written at ``seq``, for ``budget`` and ``model``. A retry of that request (the usual
    one: the client never saw the answer) is answered from it without a replay."""

    seq: int
    budget: int | None
    model: str
    messages: list[dict[str, Any]]


_sent: weakref.WeakKeyDictionary[Session, _Sent] = weakref.WeakKeyDictionary()


async def _view_as_sent(
    session: Session, count: int, token_budget: int | None, model: str
) -> list[dict[str, Any]]:
    """The request view a retried request's first try got: the one this process built
    right after the branch's ``count``-th message (found by the branch index), or else
    replayed there (``request_at``) with the same budget. Not the client's raw history:
    the model sees the same request twice."""
    seq = await session.branch_seq(count - 1)
    assert seq is not None  # count <= the branch's length: the caller compared them
    sent = _sent.get(session)
    if sent is not None and (sent.seq, sent.budget, sent.model) == (seq, token_budget, model):
        return sent.messages
    return await session.request_at(seq, Provider(model), token_budget=token_budget)


async def _session(
    tenants: Tenants, tenant: str, session_id: str, model: str, sent: Sequence[Mapping[str, Any]]
) -> Session:
    """The named session, created for ``sent`` if new (checked first: a refused request
    creates nothing)."""
    try:
        return await tenants.session(tenant, session_id)
    except SessionNotFound:
        _check(sent, None)
        return await tenants.session(tenant, session_id, create=True, model=model)


#: Times one request compares the history again after finding that another process wrote
#: the session since this one last looked (then ``ConcurrencyError``, a 409: retry it).
MAX_REREADS = 3


class _Behind(ConcurrencyError):
    """This process's idea of the session's branch is behind the ledger's."""


def _moved(session: Session, head: int) -> str:
    return (
        f"session {session.session_id!r} was written past seq {head} by another process"
        " while this request was recorded: retry it"
    )


async def _record(
    session: Session,
    sent: Sequence[Mapping[str, Any]],
    k: int,
    stored: int,
    head: int,
    metrics: Metrics,
) -> int | None:
    """Record what ``sent`` holds beyond the ``k`` messages the branch shares with it
    (``stored`` long, as of ``head``): appended, or the branch rewritten to it. The seq of
    the branch's last message, if written here. ``_Behind`` when the branch is not what
    the comparison saw: another process (a second instance behind the same balancer) or
    another request here wrote meanwhile. Each write is pinned to the head it follows (the
    first to ``head``, the next to where the one before left it, its own compaction
    included), and an append the ledger already holds under its key is one another
    process recorded (a duplicate leaves this handle's head where it was): either way the
    history is compared again, never appended after what was not looked at (an edited
    reply went after the original; each message the other process had written was one
    more round trip to find it held)."""
    if k < stored:  # the client rewrote its history: record what it now holds
        try:
            written = await session.set_messages([essence(m) for m in sent], expected_seq=head)
        except ConcurrencyError:
            raise _Behind(_moved(session, head)) from None
        _prefixes.pop(session, None)
        return written
    _check(sent[k:], session.config.max_message_bytes)
    last: int | None = None
    pin = head
    for i, m in enumerate(sent[k:], start=k):
        before = session.head
        try:
            last = await _append_at(session, essence(m), i, pin)
        except ConcurrencyError:
            raise _Behind(_moved(session, pin)) from None
        if session.head == before:  # held already: another process wrote it since
            raise _Behind(_moved(session, pin))
        _extend(session, before, last, m, as_sent=True)
        metrics.appends.inc()
        pin = session.head
    return last


async def _append_at(
    session: Session, message: Mapping[str, Any], position: int, pin: int | None
) -> int | None:
    """``message`` appended as the ``position``-th of the conversation under its position
    key (pinned to ``pin``, or unpinned). A key is a position and a content, so a branch
    rolled back or rewritten and then sent again brings the same message to the same
    place: the ledger holds the key on the branch left behind, at or below the head this
    write follows (what is on the branch now was compared, or is this process's own
    record), and the message is written again under a key of that head."""
    before = session.head
    key = position_key(position, message)
    seq = await session.add_message(message, idempotency_key=key, expected_seq=pin)
    if session.head == before and seq is not None and seq <= before:
        key = f"{key}:after:{before}"
        seq = await session.add_message(message, idempotency_key=key, expected_seq=pin)
    return seq


def _check(messages: Sequence[Mapping[str, Any]], cap: int | None) -> None:
    """Refuse (422) what ``add_message`` would refuse, before anything is appended: a
    request with a bad message writes nothing, not the new messages before it. (A message
    in another provider's shape is converted, and checked, by ``add_message`` itself.)"""
    for m in messages:
        message = essence(m)
        if shape_of(message) == "openai":
            validate_message(message)
            if cap is not None:
                check_size(message, cap)


def _litellm_kwargs(settings: Settings, routes: Sequence[upstream.Route]) -> dict[str, Any]:
    """litellm's arguments for ``routes[0]``, the rest as its fallbacks (each with its
    own endpoint and key)."""
    kwargs: dict[str, Any] = {
        "timeout": settings.upstream_timeout,
        "num_retries": settings.upstream_retries,
        **routes[0].litellm_kwargs(),
    }
    if len(routes) > 1:
        kwargs["fallbacks"] = [r.litellm_kwargs() for r in routes[1:]]
    return kwargs


def _client_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else None


_module: Any = None
#: Set by ``contextledger serve`` (``server.run``): the process is the service's own, so
#: litellm may be set up for it. An app mounted in someone else's process leaves their
#: litellm as it finds it.
own_process = False


async def _litellm() -> Any:
    """litellm, imported off the loop the first time (~2 s), set up for the service when
    the process is its own."""
    global _module
    if _module is None:
        from contextledger._litellm import import_litellm

        litellm = await asyncio.to_thread(import_litellm)
        if own_process:
            service_setup(litellm)
        _module = litellm
    return _module


def _no_cost(**_: Any) -> None:
    return None


def service_setup(litellm: Any) -> None:
    """Switch off litellm's per-completion cost calculation in the service process.

    litellm prices every completion twice (the response's hidden params, then its
    success log) from its model cost map: ~1.5-2 ms of CPU a call here (py-spy under
    bench/service.py), the largest piece of the proxy's overhead. The service never
    reads a cost, and ``litellm.response_cost_calculator`` is the module attribute
    both steps look up at call time; ``None`` is litellm's own "cost unknown", which
    also skips its zero-cost diagnostic. Only the service (our own process) does this:
    the library leaves a shared litellm as it finds it.
    """
    litellm.response_cost_calculator = _no_cost


#: What the client is told when the upstream's own words are not passed on: a 401/403
#: concerns the operator's key, a 5xx or a timeout the operator's infrastructure.
_UPSTREAM_SAYS = {
    401: "the upstream refused the service's credentials",
    403: "the upstream refused the service's credentials",
    408: "the upstream did not answer in time",
    429: "the upstream is limiting requests; retry later",
}
_ADDRESS = re.compile(
    r"[a-z][a-z0-9+.-]*://\S+"  # URLs
    r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"  # IPv4, with a port
    r"|\[[0-9a-f:]+\](?::\d+)?"  # [IPv6]:port
    r"|\b[a-z0-9.-]+:\d{2,5}\b",  # host:port
    re.IGNORECASE,
)
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+:\s*)?(?:\w+Exception\s*-\s*)?")


def upstream_detail(status: int, message: str) -> str:
    """The upstream's message as the client may see it: for a 4xx that is about the
    request (a context too long, a bad parameter), its first line without addresses or
    litellm's prefixes; otherwise a generic line. The whole message goes to the log."""
    if status in _UPSTREAM_SAYS:
        return _UPSTREAM_SAYS[status]
    if status >= 500:
        return f"the upstream failed ({status})"
    start = message.find("{")
    if start >= 0:  # litellm quotes the upstream's JSON body: its own message, if any
        try:
            error = json.loads(message[start:]).get("error")
        except (ValueError, AttributeError):
            error = None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]
        elif isinstance(error, str):
            message = error
    line = (message.strip().replace("\\n", "\n").splitlines() or [""])[0]
    line = _ADDRESS.sub("<address>", _LITELLM_PREFIX.sub("", line)).strip()
    return line[:300] or f"the upstream refused the request ({status})"


def _upstream_problem(exc: Exception) -> Problem:
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) and 400 <= status < 600 else 502
    raw = str(getattr(exc, "message", None) or exc)
    log.warning("upstream_error", status=status, error=raw[:4000], kind=type(exc).__name__)
    message = upstream_detail(status, raw)
    return Problem(
        status,
        "UPSTREAM_ERROR",
        message,
        error={"message": message, "type": "upstream_error", "code": str(status)},
    )


#: The fields the document describes one by one; the other parameters by name only.
_NAMED = frozenset({"model", "messages", "user", "stream", "stream_options"})
#: The route reads and checks its own body (http/lane.py calls it directly): what it
#: takes is declared for the OpenAPI document only, and FastAPI parses nothing.
DOCUMENTED: dict[str, Any] = {
    "parameters": [
        {
            "name": "X-Session-Id",
            "in": "header",
            "required": False,
            "description": "The session whose memory the request uses (else the body's 'user').",
            "schema": {"type": "string", "minLength": 1},
        }
    ],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "title": "ChatCompletionRequest",
                    "description": "OpenAI's chat completion request. Its other "
                    "parameters (" + ", ".join(sorted(upstream.PARAMETERS - _NAMED)) + ") "
                    "go to the upstream as they are; any other field (litellm's api_base, "
                    "api_key, mock_response, ...) is refused (422 UNSUPPORTED_PARAMETER), "
                    "unless the operator allows it (proxy_parameters).",
                    "type": "object",
                    "required": ["model", "messages"],
                    "additionalProperties": False,
                    "patternProperties": {
                        "^(" + "|".join(sorted(upstream.PARAMETERS - _NAMED)) + ")$": {}
                    },
                    "properties": {
                        "model": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 200,
                            "description": "A model this service is configured for: a "
                            "model_map name, or (with an upstream_api_base) a plain name or one "
                            "with the upstream's provider prefix, or a fallback's name "
                            "(422 MODEL_NOT_ALLOWED otherwise).",
                        },
                        "messages": {
                            "type": "array",
                            "minItems": 1,
                            "description": "The whole history, resent each call: only what "
                            "the session does not hold yet is appended, and the upstream "
                            "gets the session's budgeted view instead.",
                            "items": {
                                "type": "object",
                                "required": ["role"],
                                "additionalProperties": True,
                                "properties": {
                                    "role": {"type": "string", "enum": sorted(ROLES)},
                                    "content": {
                                        "anyOf": [
                                            {"type": "string"},
                                            {"type": "array", "items": {"type": "object"}},
                                            {"type": "null"},
                                        ]
                                    },
                                    "name": {"type": "string"},
                                    "tool_calls": {"type": "array", "items": {"type": "object"}},
                                    "tool_call_id": {"type": "string"},
                                },
                            },
                        },
                        "user": {
                            "type": "string",
                            "description": "Names the session when X-Session-Id is absent.",
                        },
                        "stream": {"type": "boolean"},
                        "stream_options": {"type": "object"},
                    },
                }
            }
        },
    },
}


@router.post("/v1/chat/completions", response_model=None, openapi_extra=DOCUMENTED)
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, with the session's memory in between.

    The session is named by the ``X-Session-Id`` header or the body's ``user``.
    """
    settings: Settings = request.app.state.settings
    tenants: Tenants = request.app.state.tenants
    metrics = request.app.state.metrics
    tenant = await tenant_for(request, bearer_is_ours=not settings.pass_client_key)
    try:
        body, plain = loads(await request.body())
    except (ValueError, RecursionError):  # nested past the parsers' depth: not a 500
        raise Problem(400, "INVALID_REQUEST", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise Problem(422, "INVALID_REQUEST", "the body must be a JSON object")
    model, sent = body.get("model"), body.get("messages")
    refused = upstream.check_parameters(settings, body)
    if refused:  # checked before anything is appended or sent
        raise Problem(
            422,
            "UNSUPPORTED_PARAMETER",
            f"the proxy does not forward {', '.join(map(repr, refused))}: send only OpenAI "
            "chat-completion parameters",
            fields=refused,
        )
    if not isinstance(model, str) or not model or len(model) > 200:
        raise Problem(422, "INVALID_REQUEST", "'model' must be a non-empty string")
    try:
        target_model = upstream.target_model(settings, model)
    except upstream.ModelNotAllowed:
        raise Problem(
            422,
            "MODEL_NOT_ALLOWED",
            f"model {model!r} is not one this service is configured for (its operator"
            " names the upstream and its models: --upstream-api-base, --model-map,"
            " --fallbacks)",
            field="model",
        ) from None
    if not isinstance(sent, list) or not sent or not all(isinstance(m, dict) for m in sent):
        raise Problem(422, "INVALID_REQUEST", "'messages' must be a non-empty list of objects")
    session_id = request.headers.get("x-session-id") or body.get("user")
    if not isinstance(session_id, str) or not session_id:
        raise Problem(
            422, "MISSING_SESSION", "name the session with X-Session-Id (or the 'user' field)"
        )
    if "/" in session_id:  # one path segment of every session route, or unreachable
        raise Problem(422, "INVALID_SESSION_ID", "a session id cannot contain '/'")
    started = time.perf_counter()
    session = await _session(tenants, tenant, session_id, model, sent)
    budget = settings.proxy_token_budget
    for reread in range(MAX_REREADS + 1):
        k, stored, head = await _common_prefix(session, sent)
        retry = k == len(sent) and k < stored
        if retry:  # a resend of an earlier request: its reply is recorded already
            outgoing = await _view_as_sent(session, k, budget, model)
            break
        try:
            last = await _record(session, sent, k, stored, head, metrics)
        except _Behind:  # another process wrote the session: compare with what it holds
            if reread == MAX_REREADS:
                raise
            _prefixes.pop(session, None)
            await session.refresh()
            continue
        outgoing = await session.get_messages_for_request(
            token_budget=budget, provider=Provider(model)
        )
        if last is not None:
            _sent[session] = _Sent(last, budget, model, outgoing)
        break
    # The branch now holds exactly what was sent (appended to, or rewritten to it): the
    # reply's place is right after, where the client's resend will carry it.
    position = len(sent) if not retry else -1
    key = upstream.upstream_key(settings, _client_key(request))
    extra = {k: v for k, v in body.items() if k not in OWN_FIELDS}
    stream = bool(body.get("stream"))
    if _stdlog.isEnabledFor(logging.DEBUG):
        log.debug(
            "proxy_forward",
            session_id=session_id,
            appended=0 if retry else len(sent) - k,
            sent=len(outgoing),
            overhead_ms=round((time.perf_counter() - started) * 1000, 2),
        )
    record = _Recorder(
        tenants,
        tenant,
        session_id,
        session,
        position,
        metrics,
        target_model,
        upstream.label_names(settings, target_model),
    )
    target = upstream.relay_target(settings, target_model, key)
    skip = 0
    if target is not None:
        try:
            return await _relayed(
                request.app.state.relay, target, extra, outgoing, stream, record, plain
            )
        except upstream.UpstreamError as exc:
            if not settings.fallbacks:
                raise _upstream_problem(exc) from exc
            log.info("proxy_fallback", model=target_model, status=exc.status_code)
            skip = 1  # litellm from the first fallback on, as it would go
    litellm = await _litellm()
    # litellm may rewrite the messages it is given; this process keeps them (``_sent``)
    outgoing = copy.deepcopy(outgoing)
    kwargs = _litellm_kwargs(settings, upstream.routes(settings, target_model, key)[skip:])
    if extra.get("tools"):
        # litellm 1.106.2 routes any request with tools through its MCP bridge, which
        # imports the optional `mcp` package; plain function tools need none of it.
        extra["_skip_mcp_handler"] = True
    if stream:
        return await _stream(litellm, kwargs, extra, outgoing, record)
    try:
        response = await litellm.acompletion(messages=outgoing, **kwargs, **extra)
    except Exception as exc:
        raise _upstream_problem(exc) from exc
    data = response.model_dump(exclude_none=True)
    choices = data.get("choices") or []
    if choices:
        record(essence(choices[0].get("message") or {}))
    record.count(data.get("usage"), data.get("model"))
    return JSONResponse(data)


async def _relayed(
    relay: upstream.Relay,
    target: upstream.Target,
    extra: dict[str, Any],
    outgoing: list[dict[str, Any]],
    stream: bool,
    record: _Recorder,
    plain: bool,
) -> Response:
    """The request relayed to an OpenAI-compatible upstream (``upstream.Relay``): the
    client's own fields, the budgeted view as ``messages``, the upstream's model name.
    ``plain``: orjson read the client's body (``_encode``). Raises ``UpstreamError`` when
    no answer came (after the retries)."""
    payload = {"model": target.model, "messages": outgoing, **extra}
    if stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}  # counted, as litellm asks
        response = await relay.open_stream(target, _encode(payload, plain))
        return StreamingResponse(_relay_stream(response, record), media_type="text/event-stream")
    raw = await relay.complete(target, _encode(payload, plain))
    try:
        data = json.loads(raw)
    except ValueError:
        raise upstream.UpstreamError(502, "the upstream's answer is not JSON") from None
    if not isinstance(data, dict):
        raise upstream.UpstreamError(502, "the upstream's answer is not a JSON object")
    choices = data.get("choices")
    if choices and isinstance(choices, list) and isinstance(choices[0], Mapping):
        record(essence(choices[0].get("message") or {}))
    record.count(data.get("usage"), data.get("model"))
    return Response(raw, media_type="application/json")  # the upstream's JSON as it came


#: What came from JSON has no cycles: not checking for them is ~20% of the encoding.
_encoder = json.JSONEncoder(check_circular=False, separators=(",", ":"))


def _encode(payload: dict[str, Any], plain: bool) -> bytes:
    """The relayed request's body: by orjson when it read the client's (the view is
    as long as the history it keeps: 0.03 against 0.47 ms for 400 messages in ``json``,
    which grew the proxy's overhead with the session), else by ``json``, which writes
    back what only it reads (a NaN the client sent goes on as NaN). orjson refuses
    little else (an integer past 64 bits): ``json`` then."""
    if plain:
        try:
            return orjson.dumps(payload)
        except orjson.JSONEncodeError:
            pass
    return _encoder.encode(payload).encode()


async def _relay_stream(response: ClientResponse, record: _Recorder) -> AsyncIterator[bytes]:
    """The upstream's events passed on as they arrive, the reply assembled from them
    and recorded once the stream is through, before its ``[DONE]``; a stream cut short ends in an
    OpenAI-style error event, and records nothing."""
    built = upstream.Assembler()
    done = b"data: [DONE]\n\n"  # held back until the reply is recorded (below)
    try:
        async for event, data in upstream.events(response):
            if data == b"[DONE]":
                done = event
                continue
            if data is not None:
                try:
                    chunk = json.loads(data)
                except ValueError:
                    chunk = None
                if isinstance(chunk, dict):
                    if "error" in chunk:  # the upstream's own error event: passed on
                        yield event
                        return
                    built.add(chunk)
            yield event
    except Exception as exc:  # the upstream failed mid-stream: tell the client, OpenAI-style
        problem = _upstream_problem(upstream.stream_failure(exc))
        yield f"data: {json.dumps({'error': problem.extra['error']})}\n\n".encode()
        return
    finally:
        response.release()  # its connection is reused when read through, else closed
    # Recorded (deferred: Tenants.defer) before the client sees the end, so its next
    # request through this process, sent the moment the stream ends, waits for it.
    message = built.message()
    if message is not None:
        record(essence(message))
    record.count(built.usage, built.model)
    yield done


@dataclass(slots=True)
class _Recorder:
    """Records a reply in the session at ``position`` (``-1``: a retry's, already
    recorded), deferred past the response (``Tenants.defer``), and counts its usage."""

    tenants: Tenants
    tenant: str
    session_id: str
    session: Session
    position: int
    metrics: Metrics
    model: str  # the model asked for: the usage's label when the answer names none
    labels: frozenset[str] = frozenset()  # the models that may label usage (configured)

    def count(self, usage: Any, answered_by: Any) -> None:
        """Count the reply's tokens: by kind (``contextledger_proxy_tokens``) and by
        tenant and model that answered (``contextledger_proxy_usage_tokens``), so use
        can be billed or capped per tenant. (Per session, the ledger would be the place;
        a message carries no metadata to hold it.)"""
        if not isinstance(usage, Mapping):
            return
        # the label set stays bounded: the model asked for, or one the operator configured
        # (a fallback that answered); never a name the upstream made up
        model = answered_by if answered_by in self.labels else self.model
        for kind in ("prompt", "completion"):
            value = usage.get(kind + "_tokens")
            if isinstance(value, int) and value > 0:
                self.metrics.proxy_tokens.labels(kind).inc(value)
                self.metrics.proxy_usage.labels(self.tenant, model[:MODEL_LABEL_MAX], kind).inc(
                    value
                )

    def __call__(self, reply: dict[str, Any]) -> None:
        if self.position < 0 or (reply.get("content") is None and not reply.get("tool_calls")):
            return

        async def write() -> None:
            before = self.session.head
            seq = await _append_at(self.session, reply, self.position, None)
            _extend(self.session, before, seq, reply, as_sent=False)
            if self.session.head != before:  # (not a resend another process recorded first)
                self.metrics.appends.inc()

        self.tenants.defer(self.tenant, self.session_id, write)


MODEL_LABEL_MAX = 200  # as long as the request's model may be


async def _stream(
    litellm: Any,
    kwargs: dict[str, Any],
    extra: dict[str, Any],
    outgoing: list[dict[str, Any]],
    record: _Recorder,
) -> Response:
    try:
        upstream = await litellm.acompletion(
            messages=outgoing,
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
            **extra,
        )
    except Exception as exc:
        raise _upstream_problem(exc) from exc

    async def relay() -> AsyncIterator[str]:
        chunks: list[Any] = []
        try:
            async for chunk in upstream:
                chunks.append(chunk)
                yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"
        except Exception as exc:  # the upstream failed mid-stream: tell the client, OpenAI-style
            problem = _upstream_problem(exc)
            yield f"data: {json.dumps({'error': problem.extra['error']})}\n\n"
            return
        built = litellm.stream_chunk_builder(chunks, messages=outgoing) if chunks else None
        if built is not None:  # recorded before the end is sent (see _relay_stream)
            data = built.model_dump(exclude_none=True)
            choices = data.get("choices") or []
            if choices:
                record(essence(choices[0].get("message") or {}))
            record.count(data.get("usage"), data.get("model"))
        yield "data: [DONE]\n\n"

    return StreamingResponse(relay(), media_type="text/event-stream")
