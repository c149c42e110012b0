"""The lane (``http/lane.py``) answers exactly as the FastAPI routes it stands in for.

The route also takes ``application/<x>+json`` bodies, which the lane leaves to FastAPI:
each request below is sent once as ``application/json`` (the lane's) and once as
``application/contextledger+json`` (the route's) to twin sessions, and the answers must
match, errors included. The append lane (``http/append_lane.py``) answers the usual
``application/json`` append in front of the middleware stack and hands the rest to it:
each case below also says which of the two answered.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog
from starlette.datastructures import Headers

from contextledger.http import proxy
from contextledger.http.lane import accepted
from contextledger.http.settings import Settings
from tests.fakellm import running_fake_llm
from tests.integration.service_support import Running, new_key, running_service

LANE = "application/json"
JSON = {"Content-Type": LANE}
ROUTE = "application/contextledger+json"


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def both(
    svc: Running, session: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[tuple[int, Any, str | None], tuple[int, Any, str | None], list[int]]:
    """The same append to ``<session>-lane`` through the lane and ``<session>-route``
    through FastAPI: (status, body, ETag) of each, the session names made equal, and how
    many of each the append lane answered itself."""
    out = []
    answered = []
    lane = svc.app.append_lane  # type: ignore[attr-defined]
    for kind, ctype in (("lane", LANE), ("route", ROUTE)):
        raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
        before = lane.answered
        r = await svc.client.post(
            f"/v1/sessions/{session}-{kind}/messages",
            content=raw,
            headers={"Content-Type": ctype, **(headers or {})},
        )
        answered.append(lane.answered - before)
        text = r.text.replace(f"{session}-{kind}", session)
        assert r.headers["content-type"] in ("application/json", "application/problem+json")
        out.append((r.status_code, json.loads(text), r.headers.get("etag")))
    return out[0], out[1], answered


async def test_lane_and_route_answer_alike(svc: Running) -> None:
    c = svc.client
    for kind in ("lane", "route"):
        assert (await c.post("/v1/sessions", json={"session_id": f"s-{kind}"})).status_code == 201
    # (body, headers, whether the append lane answers the application/json twin itself)
    cases: list[tuple[Any, dict[str, str], bool]] = [
        ({"message": user("one")}, {}, True),
        ({"messages": [user("two"), {"role": "assistant", "content": "three"}]}, {}, True),
        ({"message": user("four")}, {"Idempotency-Key": "k"}, True),
        ({"message": user("four")}, {"Idempotency-Key": "k"}, True),  # a retry: same seqs
        ({"message": user("other")}, {"Idempotency-Key": "k"}, True),  # 409 conflict
        ({"message": user("stale")}, {"If-Match": '"2"'}, True),  # 409, head in the body
        ({"message": user("fresh")}, {"If-Match": '"5"'}, True),
        ({"message": user("x")}, {"If-Match": "not-a-seq"}, True),  # 422 from parse_if_match
        ({"message": user("x")}, {"Idempotency-Key": "k" * 201}, False),  # header too long
        ({"messages": [user("ok"), {"role": "wizard"}]}, {}, True),  # whole batch rejected
        ({"messages": []}, {}, True),
        ({"message": user("x"), "messages": [user("y")]}, {}, True),
        ({"message": user("x"), "extra": 1}, {}, False),  # the model forbids extra fields
        ({"message": "not an object"}, {}, False),
        (["not", "an", "object"], {}, False),
        (b"{not json", {}, False),
        (b"", {}, False),
        ({"message": user("last"), "critical": True}, {}, True),
    ]
    for body, headers, by_lane in cases:
        lane, route, answered = await both(svc, "s", body, headers)
        assert lane == route, (body, headers)
        assert answered == [int(by_lane), 0], (body, headers)
    lane, route, answered = await both(svc, "missing", {"message": user("x")})
    assert lane == route and lane[0] == 404 and answered == [1, 0]
    branch = [(await c.get(f"/v1/sessions/s-{k}/messages")).json() for k in ("lane", "route")]
    assert branch[0] == branch[1] and len(branch[0]["messages"]) == 6


async def test_lane_reads_a_chunked_body_and_logs_the_route(svc: Running) -> None:
    await svc.client.post("/v1/sessions", json={"session_id": "c"})
    raw = json.dumps({"message": user("in pieces " * 50)}).encode()

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(raw), 64):
            yield raw[i : i + 64]

    append_lane = svc.app.append_lane  # type: ignore[attr-defined]
    before = append_lane.answered
    with structlog.testing.capture_logs() as logs:
        r = await svc.client.post(
            "/v1/sessions/c/messages", content=pieces(), headers={"Content-Type": LANE}
        )
        whole = await svc.client.post("/v1/sessions/c/messages", content=raw, headers=JSON)
    assert r.status_code == 201 and r.json() == {"seqs": [2], "head": 2}
    assert whole.status_code == 201 and whole.json() == {"seqs": [3], "head": 3}
    assert append_lane.answered == before + 1  # the chunked one went through the stack
    assert r.headers["etag"] == '"2"'
    lines = [e for e in logs if e.get("event") == "request"]
    assert len(lines) == 2  # one line each, whichever path answered
    for line in lines:
        assert line["route"] == "/v1/sessions/{session_id}/messages"
        assert line["status"] == 201 and line["tenant"] == "local"
        assert line["method"] == "POST" and line["ms"] > 0
    metrics = (await svc.client.get("/metrics")).text  # counted alike too
    assert (
        'contextledger_http_requests_total{method="POST",'
        'route="/v1/sessions/{session_id}/messages",status="201"} 2.0'
    ) in metrics
    assert "contextledger_appends_total 2.0" in metrics


async def test_lane_needs_a_key_once_keys_exist(svc: Running, pg_dsn: str) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "k"})
    key = await new_key(pg_dsn, "local")
    body = {"message": user("who am I")}
    anonymous = await c.post("/v1/sessions/k/messages", json=body)
    assert anonymous.status_code == 401
    assert anonymous.headers["content-type"] == "application/problem+json"
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert anonymous.json()["code"] == "UNAUTHORIZED"
    signed = await c.post(
        "/v1/sessions/k/messages", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    assert signed.status_code == 201 and signed.json()["head"] == 2


@pytest.mark.parametrize(
    ("ctype", "body", "headers", "taken"),
    [
        ("application/json", b'{"message": {"role": "user", "content": "a"}}', {}, True),
        ("Application/JSON; charset=utf-8", b'{"messages": []}', {}, True),
        (None, b'{"message": {"role": "user", "content": "a"}}', {}, False),
        ("application/x+json", b'{"message": {"role": "user", "content": "a"}}', {}, False),
        ("text/plain", b'{"message": {"role": "user", "content": "a"}}', {}, False),
        ("application/json", b'{"message": {}, "extra": 1}', {}, False),
        ("application/json", b"[]", {}, False),
        ("application/json", b"{", {}, False),
        ("application/json", b"", {}, False),
        ("application/json", b'{"messages": []}', {"if-match": "1" * 41}, False),
        ("application/json", b'{"messages": []}', {"idempotency-key": "k" * 200}, True),
    ],
)
def test_lane_takes_only_what_the_route_accepts_as_is(
    ctype: str | None, body: bytes, headers: dict[str, str], taken: bool
) -> None:
    all_headers = headers | ({"content-type": ctype} if ctype else {})
    assert (accepted(Headers(all_headers), body) is not None) is taken


async def test_proxy_through_the_lane_is_logged_counted_and_problems_stay(
    pg_dsn: str,
) -> None:
    with running_fake_llm() as fake:
        settings = Settings(dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url)
        async with running_service(settings) as svc:
            c = svc.client
            body = {"model": "m", "messages": [user("hello")]}
            with structlog.testing.capture_logs() as logs:
                good = await c.post(
                    "/v1/chat/completions", json=body, headers={"X-Session-Id": "p"}
                )
                not_json = await c.post(
                    "/v1/chat/completions",
                    content=b"{",
                    headers={"X-Session-Id": "p", "Content-Type": "application/json"},
                )
                no_session = await c.post("/v1/chat/completions", json=body)
            assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"]
            assert not_json.status_code == 400 and not_json.json()["code"] == "INVALID_REQUEST"
            assert no_session.status_code == 422
            assert no_session.json()["code"] == "MISSING_SESSION"
            for r in (not_json, no_session):
                assert r.headers["content-type"] == "application/problem+json"
            lines = [e for e in logs if e.get("event") == "request"]
            assert [(e["route"], e["status"]) for e in lines] == [
                ("/v1/chat/completions", 200),
                ("/v1/chat/completions", 400),
                ("/v1/chat/completions", 422),
            ]
            metrics = (await c.get("/metrics")).text
            assert 'route="/v1/chat/completions",status="200"} 1.0' in metrics
            # mounted in a process not its own (this test's), the app leaves litellm's
            # pricing as it found it; ``contextledger serve`` switches it off (below)
            import litellm

            assert proxy.own_process is False
            assert litellm.response_cost_calculator is not proxy._no_cost


def test_the_service_process_prices_nothing() -> None:
    import litellm

    before = litellm.response_cost_calculator
    try:
        proxy.service_setup(litellm)
        assert litellm.response_cost_calculator(response_object=None) is None
    finally:
        litellm.response_cost_calculator = before
