"""The audit page: sessions, a session's timeline, and what the model saw at any seq.

Server-rendered HTML (no build step) plus ``static/audit.js``, which only swaps the
request view when the seq picker moves (``GET /v1/sessions/{id}/context?at=``).
Rolled-back stretches are drawn as a side branch; the badge is ``verify()``'s answer.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from contextledger import Event
from contextledger.http.auth import KEY_COOKIE, tenant_for
from contextledger.http.problems import Problem
from contextledger.http.rest import open_session, tenants_of

router = APIRouter(include_in_schema=False)
STATIC = Path(__file__).with_name("static")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{_e(title)} · contextledger</title>"
        '<link rel=stylesheet href="/static/audit.css">'
        '<script defer src="/static/audit.js"></script></head>'
        f'<body><header><a href="/">contextledger</a> audit</header><main>{body}</main>'
        "</body></html>"
    )


def summary_html(text: str) -> str:
    """A summary's markdown made readable and safe: headings bold, ``- `` items as bullets,
    every other line a paragraph. Only those shapes are read; every character of the text
    is escaped, so nothing in a summary (a model wrote it) is ever markup on the page."""
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        heading = re.fullmatch(r"#{1,6}\s+(.*)", line)
        if heading:
            lines.append(f"<p class=h>{_e(heading.group(1))}</p>")
        elif line[:2] in ("- ", "* ", "• "):
            lines.append(f"<p class=bullet>{_e(line[2:].strip())}</p>")
        else:
            lines.append(f"<p>{_e(line)}</p>")
    return f"<div class=summary-text>{''.join(lines)}</div>"


def _text(message: Mapping[str, Any], width: int = 160) -> str:
    """A message's text on one line, cut to ``width`` characters (0: whole)."""
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(str(b.get("text", f"[{b.get('type')}]")) for b in content)
    text = "" if content is None else str(content)
    calls = message.get("tool_calls") or []
    if calls:
        names = ", ".join(str((c.get("function") or {}).get("name")) for c in calls)
        text = f"{text} → calls {names}".strip()
    return text if not width or len(text) <= width else text[: width - 1] + "…"


def _describe(event: Event) -> str:
    data = dict(event.data) if event.data is not None else event.payload.to_data()
    kind = event.type
    if kind == "message.appended":
        message = data.get("message") or {}
        origin = " (synthetic)" if data.get("origin") == "synthetic" else ""
        return f"<b>{_e(message.get('role'))}</b>{origin}: {_e(_text(message))}"
    if kind == "summary.recorded":
        # the summary is the message that stands in the view (SummaryRecorded.message)
        message = data.get("message")
        text = _text(message, width=0) if isinstance(message, Mapping) else json.dumps(message)
        return (
            f"summary of seq {_e(data.get('from_seq'))}-{_e(data.get('to_seq'))} "
            f"({_e(data.get('tokens'))} tokens):{summary_html(text)}"
        )
    if kind == "compaction.applied":
        return (
            f"compaction ({_e(data.get('strategy'))}): {_e(data.get('tokens_before'))} → "
            f"{_e(data.get('tokens_after'))} tokens"
        )
    if kind == "checkpoint.created":
        return f"checkpoint {_e(data.get('label') or '')}"
    if kind == "session.rolled_back":
        return f"rollback to seq {_e(data.get('to_seq'))} {_e(data.get('label') or '')}"
    return _e(kind)


def abandoned(events: Iterable[Event]) -> dict[int, int]:
    """seq → the rollback that left it on a side branch (seq after target, before rollback)."""
    side: dict[int, int] = {}
    for event in events:
        if event.type == "session.rolled_back":
            data = dict(event.data) if event.data is not None else event.payload.to_data()
            target = int(data.get("to_seq") or 0)
            for seq in range(target + 1, event.seq):
                side.setdefault(seq, event.seq)
    return side


def _messages(messages: list[dict[str, Any]]) -> str:
    rows = "".join(
        f'<li class="msg role-{_e(m.get("role"))}"><b>{_e(m.get("role"))}</b> '
        f"<span class=text>{_e(_text(m, 400))}</span></li>"
        for m in messages
    )
    return rows or "<li class=empty>(nothing)</li>"


def _sign_in(next_path: str, error: str = "") -> HTMLResponse:
    """Keys-required mode: the page asks for a key (kept in an HttpOnly cookie)."""
    note = f"<p class=error id=error>{_e(error)}</p>" if error else ""
    page = _page(
        "sign in",
        "<h1>Sign in</h1><p>This service needs an API key (<code>contextledger keys create"
        " TENANT</code>).</p>"
        f'{note}<form id=signin method=post action="/audit/sign-in">'
        f'<input type=hidden name=next value="{_e(next_path)}">'
        "<label>API key <input name=key type=password autocomplete=off required></label> "
        "<button type=submit>Sign in</button></form>",
    )
    page.status_code = 401
    return page


async def _tenant_or_sign_in(request: Request) -> str | HTMLResponse:
    try:
        return await tenant_for(request)
    except Problem as exc:
        if exc.status != 401:
            raise
        return _sign_in(request.url.path)


@router.post("/audit/sign-in", response_model=None)
async def sign_in(
    request: Request, key: Annotated[str, Form(max_length=200)], next: Annotated[str, Form()] = "/"
) -> Response:
    """The key, if valid, goes into an HttpOnly, SameSite=Strict cookie: sent back only by
    this site's own pages, never readable by script, never sent by another site's form."""
    tenants = tenants_of(request)
    tenant = await tenants.keys.tenant_of(key.strip()) if tenants.keys else None
    local = next.startswith("/") and not next.startswith(("//", "/\\")) and "\\" not in next
    target = next if local else "/"  # never another site ("/\\evil" is one to browsers)
    if tenant is None:
        return _sign_in(target, "That key is not valid (or was revoked).")
    done = RedirectResponse(target, status_code=303)
    done.set_cookie(
        KEY_COOKIE,
        key.strip(),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return done


@router.post("/audit/sign-out")
async def sign_out() -> RedirectResponse:
    done = RedirectResponse("/", status_code=303)
    done.delete_cookie(KEY_COOKIE, path="/")
    return done


@router.get("/", response_class=HTMLResponse)
async def sessions_page(request: Request) -> HTMLResponse:
    tenant = await _tenant_or_sign_in(request)
    if isinstance(tenant, HTMLResponse):
        return tenant
    ledger = await tenants_of(request).ledger(tenant)
    rows = "".join(
        f'<tr><td><a href="/audit/sessions/{quote(i.session_id, safe="")}">'
        f"{_e(i.session_id)}</a></td><td>{_e(i.created_at.strftime('%Y-%m-%d %H:%M:%S'))}</td>"
        f"<td>{_e(i.model or '')}</td><td class=num>{i.head}</td>"
        f"<td class=num>{i.view_tokens}</td></tr>"
        for i in await ledger.sessions()
    )
    out = (
        '<form id=signout method=post action="/audit/sign-out"><button>Sign out</button></form>'
        if KEY_COOKIE in request.cookies
        else ""
    )
    body = (
        f"{out}<h1>Sessions <small>tenant {_e(tenant)}</small></h1>"
        "<table id=sessions><thead><tr><th>session</th><th>created</th><th>model</th>"
        "<th>events</th><th>view tokens</th></tr></thead>"
        f"<tbody>{rows or '<tr><td colspan=5>no sessions yet</td></tr>'}</tbody></table>"
    )
    return _page("sessions", body)


@router.get("/audit/sessions/{session_id}", response_class=HTMLResponse)
async def session_page(session_id: str, request: Request) -> HTMLResponse:
    tenant = await _tenant_or_sign_in(request)
    if isinstance(tenant, HTMLResponse):
        return tenant
    session = await open_session(request, tenant, session_id)
    await session.refresh()
    events = [e async for e in session.events()]
    side = abandoned(events)
    report = await session.verify()
    badge = (
        f'<span id=verify class="badge ok">chain verified · {report.events} events</span>'
        if report.ok
        else f'<span id=verify class="badge bad">chain broken at seq {report.first_bad_seq}'
        f": {_e(report.reason or '')}</span>"
    )
    timeline = "".join(
        f'<li class="ev {_e(e.type.replace(".", "-"))}{" side" if e.seq in side else ""}"'
        f' data-seq="{e.seq}"><span class=seq>{e.seq}</span>'
        f"<span class=type>{_e(e.type)}</span><span class=what>{_describe(e)}</span>"
        + (f"<span class=branch>rolled back at {side[e.seq]}</span>" if e.seq in side else "")
        + "</li>"
        for e in events
    )
    head = session.head
    options = "".join(
        f'<option value="{e.seq}"{" selected" if e.seq == head else ""}>'
        f"{e.seq} · {_e(e.type)}</option>"
        for e in events
    )
    seen = await session.request_at(head)
    body = (
        f"<h1 data-session='{_e(session_id)}'>Session {_e(session_id)} {badge}</h1>"
        f"<p>model {_e(session.model or '—')} · head {head} · "
        f"{len(side)} event(s) on rolled-back branches</p>"
        "<div class=cols><section><h2>Timeline</h2>"
        f"<ol id=timeline>{timeline}</ol></section>"
        "<section><h2>What the model saw</h2>"
        f"<label>after seq <select id=seq>{options}</select></label>"
        f"<ol id=request>{_messages(seen)}</ol></section></div>"
    )
    return _page(f"session {session_id}", body)
