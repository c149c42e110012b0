"""Issue 26, the HTTP surface: what a web page elsewhere, a rebinding DNS name, an
oversized or odd body, or a config naming an endpoint can make the service do. Over
real HTTP against a real PostgreSQL; a tests/fakellm.py server plays the attacker's URL.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from contextledger.http.settings import Settings
from tests.fakellm import FakeLLM, ok, running_fake_llm
from tests.integration.service_support import Running, new_key, proxy_service, running_service

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def attacker() -> Iterator[FakeLLM]:
    with running_fake_llm() as server:
        yield server


@pytest_asyncio.fixture
async def local(pg_dsn: str, fake: FakeLLM) -> AsyncIterator[Running]:
    """Local mode (no key yet), proxying to ``fake``."""
    async with proxy_service(pg_dsn, fake, True) as svc:
        yield svc


async def exists(svc: Running, session: str) -> bool:
    return (await svc.client.get(f"/v1/sessions/{session}")).status_code == 200


# -- media type ---------------------------------------------------------------------------


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None])
async def test_a_proxy_body_that_is_not_json_typed_is_refused(
    local: Running, fake: FakeLLM, ctype: str | None
) -> None:
    import json

    headers = {"X-Session-Id": "s"}
    if ctype:
        headers["Content-Type"] = ctype
    r = await local.client.post(
        "/v1/chat/completions", content=json.dumps(CHAT).encode(), headers=headers
    )
    assert r.status_code == 415, r.text
    assert r.json()["code"] == "UNSUPPORTED_MEDIA_TYPE"
    assert not await exists(local, "s")
    assert fake.calls() == []


async def test_rest_writes_need_json_too(local: Running) -> None:
    r = await local.client.post(
        "/v1/sessions", content=b'{"session_id": "s"}', headers={"Content-Type": "text/plain"}
    )
    assert r.status_code == 415
    assert (await local.client.post("/v1/sessions", json={"session_id": "s"})).status_code == 201
    r = await local.client.post(
        "/v1/sessions/s/messages",
        content=b'{"message": {"role": "user", "content": "x"}}',
        headers={"Content-Type": "text/plain"},
    )
    assert r.status_code == 415
    assert (await local.client.get("/v1/sessions/s")).json()["head"] == 1


# -- cross-site ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
    ids=["origin", "null-origin", "fetch-cross-site", "fetch-same-site"],
)
async def test_a_cross_site_write_is_refused(
    local: Running, fake: FakeLLM, headers: dict[str, str]
) -> None:
    r = await local.client.post(
        "/v1/chat/completions", json=CHAT, headers={"X-Session-Id": "s", **headers}
    )
    assert r.status_code == 403 and r.json()["code"] == "CROSS_SITE"
    r = await local.client.post("/v1/sessions", json={"session_id": "t"}, headers=headers)
    assert r.status_code == 403
    r = await local.client.delete("/v1/sessions/t", params={"reason": "x"}, headers=headers)
    assert r.status_code == 403
    assert not await exists(local, "s") and not await exists(local, "t")
    assert fake.calls() == []


async def test_a_same_origin_write_passes(local: Running, fake: FakeLLM) -> None:
    fake.script("m", [ok("fine")])
    origin = local.url  # http://127.0.0.1:<port>: the page the audit UI serves
    r = await local.client.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={"X-Session-Id": "s", "Origin": origin, "Sec-Fetch-Site": "same-origin"},
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "10.0.0.1"])
async def test_local_mode_refuses_a_foreign_host(local: Running, host: str) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1."""
    r = await local.client.post("/v1/sessions", json={"session_id": "s"}, headers={"Host": host})
    assert r.status_code == 403 and r.json()["code"] == "HOST_NOT_ALLOWED"
    r = await local.client.get("/v1/sessions", headers={"Host": host})
    assert r.status_code == 403
    assert not await exists(local, "s")
    r = await local.client.get("/v1/sessions", headers={"Host": "localhost:1234"})
    assert r.status_code == 200


async def test_an_allowed_host_is_served(pg_dsn: str) -> None:
    settings = Settings(dsn=pg_dsn, migrate=False, allowed_hosts=("ledger.internal",))
    async with running_service(settings) as svc:
        r = await svc.client.get("/v1/sessions", headers={"Host": "ledger.internal:8765"})
        assert r.status_code == 200
        # a reverse proxy that rewrites Host: the page's origin is the allowed name
        r = await svc.client.post(
            "/v1/sessions",
            json={"session_id": "s"},
            headers={"Origin": "https://ledger.internal"},
        )
        assert r.status_code == 201


async def test_the_audit_forms_refuse_another_sites_post(pg_dsn: str) -> None:
    key = await new_key(pg_dsn, "acme")
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        form = {"key": key, "next": "/"}
        for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {}):
            r = await svc.client.post("/audit/sign-in", data=form, headers=headers)
            assert r.status_code == 403, headers
            assert "set-cookie" not in r.headers
            r = await svc.client.post("/audit/sign-out", headers=headers)
            assert r.status_code == 403
        r = await svc.client.post("/audit/sign-in", data=form, headers={"Origin": svc.url})
        assert r.status_code == 303 and "cl_key=" in r.headers["set-cookie"]


async def test_html_pages_carry_the_security_headers(pg_dsn: str) -> None:
    await new_key(pg_dsn, "acme")
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        r = await svc.client.get("/")  # the sign-in page
        assert r.headers["content-type"].startswith("text/html")
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "same-origin"


# -- size, nesting, session ids -------------------------------------------------------------


async def test_an_oversized_body_is_refused_before_the_key(pg_dsn: str) -> None:
    await new_key(pg_dsn, "acme")  # keys required: no key would be a 401
    settings = Settings(dsn=pg_dsn, migrate=False, max_body_bytes=10_000)
    big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 20_000 + b'"}]}'
    async with running_service(settings) as svc:
        for path in ("/v1/chat/completions", "/v1/sessions/s/messages", "/v1/sessions"):
            r = await svc.client.post(
                path, content=big, headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 413, path
            assert r.json()["code"] == "BODY_TOO_LARGE"

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted
                for i in range(0, len(big), 4096):
                    yield big[i : i + 4096]

            r = await svc.client.post(
                path, content=chunks(), headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 413, path
        r = await svc.client.post("/v1/sessions", json={"session_id": "s"})
        assert r.status_code == 401  # small enough: now the key is asked for


def nested(depth: int) -> bytes:
    return b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"


async def test_deeply_nested_json_is_a_400_not_a_500(local: Running) -> None:
    body = nested(30_000)  # far under the cap: refused for its depth
    for path in ("/v1/chat/completions", "/v1/sessions/s/messages", "/v1/sessions"):
        r = await local.client.post(
            path, content=body, headers={"Content-Type": "application/json", "X-Session-Id": "s"}
        )
        assert r.status_code in (400, 422), (path, r.status_code, r.text)
        assert r.status_code != 500


@pytest.mark.parametrize("sid", ["a/b", "../x", "/"])
async def test_a_slash_in_a_session_id_is_refused(local: Running, fake: FakeLLM, sid: str) -> None:
    r = await local.client.post("/v1/sessions", json={"session_id": sid})
    assert r.status_code == 422
    r = await local.client.post("/v1/chat/completions", json=CHAT, headers={"X-Session-Id": sid})
    assert r.status_code == 422 and r.json()["code"] == "INVALID_SESSION_ID"
    assert (await local.client.get("/v1/sessions")).json()["items"] == []
    assert fake.calls() == []


# -- configs from HTTP ----------------------------------------------------------------------


def summarizer_model(**fields: str) -> dict[str, Any]:
    return {"summarizer": {"models": [{"model": "openai/x", **fields}]}}


def embedding(**fields: str) -> dict[str, Any]:
    return {"recall": {"embedding_model": "openai/e", **fields}}


@pytest.mark.parametrize(
    ("key", "build"),
    [
        ("summarizer.models[0].api_base", lambda url: summarizer_model(api_base=url)),
        ("summarizer.models[0].api_key", lambda url: summarizer_model(api_key="k")),
        ("recall.embedding_api_base", lambda url: embedding(embedding_api_base=url)),
        ("recall.embedding_api_key", lambda url: embedding(embedding_api_key="k")),
    ],
)
async def test_a_posted_config_cannot_name_an_endpoint_or_a_key(
    local: Running, attacker: FakeLLM, key: str, build: Any
) -> None:
    config = build(attacker.base_url)
    r = await local.client.post("/v1/sessions", json={"session_id": "s", "config": config})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID_CONFIG" and r.json()["key"] == key
    assert not await exists(local, "s")
    assert attacker.calls() == []


async def test_the_operator_may_allow_an_endpoint(pg_dsn: str, attacker: FakeLLM) -> None:
    settings = Settings(dsn=pg_dsn, migrate=False, config_api_bases=(attacker.base_url + "/",))
    config = {"summarizer": {"models": [{"model": "openai/x", "api_base": attacker.base_url}]}}
    async with running_service(settings) as svc:
        r = await svc.client.post("/v1/sessions", json={"session_id": "s", "config": config})
        assert r.status_code == 201, r.text
        other = {"summarizer": {"models": [{"model": "openai/x", "api_base": "http://10.1.1.1"}]}}
        r = await svc.client.post("/v1/sessions", json={"session_id": "t", "config": other})
        assert r.status_code == 422


async def test_a_plain_json_client_still_works(local: Running) -> None:
    """No Origin, no Sec-Fetch-*: what SDKs and curl send."""
    r = await local.client.post("/v1/sessions", json={"session_id": "plain"})
    assert r.status_code == 201
    r = await local.client.delete("/v1/sessions/plain", params={"reason": "done"})
    assert r.status_code == 200, r.text
    assert not await exists(local, "plain")


# -- the append lane (http/append_lane.py): the same refusals on its path -------------------


async def test_the_append_lanes_path_keeps_every_refusal(local: Running) -> None:
    """``POST /v1/sessions/{id}/messages`` with a JSON body is answered in front of the
    middleware stack: each refusal above holds there too, nothing is written, and the
    lane answers none of them itself (the usual append at the end shows it is live)."""
    lane = local.app.append_lane  # type: ignore[attr-defined]
    c = local.client
    assert (await c.post("/v1/sessions", json={"session_id": "s"})).status_code == 201
    body = {"message": {"role": "user", "content": "x"}}
    path = "/v1/sessions/s/messages"
    refused: list[tuple[dict[str, str], int, str]] = [
        ({"Origin": "http://evil.example"}, 403, "CROSS_SITE"),
        ({"Origin": "null"}, 403, "CROSS_SITE"),
        ({"Sec-Fetch-Site": "cross-site"}, 403, "CROSS_SITE"),
        ({"Sec-Fetch-Site": "same-site"}, 403, "CROSS_SITE"),
        ({"Host": "evil.example"}, 403, "HOST_NOT_ALLOWED"),
        ({"Content-Type": "text/plain"}, 415, "UNSUPPORTED_MEDIA_TYPE"),
    ]
    before = lane.answered
    for headers, status, code in refused:
        r = await c.post(path, json=body, headers=headers)
        assert (r.status_code, r.json()["code"]) == (status, code), headers
    cap = local.app.state.settings.max_body_bytes
    r = await c.post(path, content=b" " * cap + b"{}", headers=JSON_TYPE)
    assert r.status_code == 413 and r.json()["code"] == "BODY_TOO_LARGE"
    assert lane.answered == before
    assert (await c.get("/v1/sessions/s")).json()["head"] == 1
    r = await c.post(path, json=body)
    assert r.status_code == 201 and lane.answered == before + 1


async def test_the_append_lanes_path_asks_for_the_key_first(pg_dsn: str) -> None:
    """With keys, the lane answers a usual append without a valid key with a 401 before
    a byte of its body is read (so a body that is not JSON gets no parse error), and one
    with another tenant's key finds no session: the route's problems, from the lane."""
    own = await new_key(pg_dsn, "local")
    other = await new_key(pg_dsn, "acme")
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        lane = svc.app.append_lane  # type: ignore[attr-defined]
        c, path = svc.client, "/v1/sessions/s/messages"
        mine = {"X-ContextLedger-Key": own}
        assert (await c.post("/v1/sessions", json={"session_id": "s"}, headers=mine)).is_success
        body = {"message": {"role": "user", "content": "x"}}
        before = lane.answered
        for headers, content in (
            ({}, json.dumps(body).encode()),
            ({"Authorization": "Bearer cl_wrong"}, json.dumps(body).encode()),
            ({}, b"{not json"),  # the key before the body: no parse error
        ):
            r = await c.post(path, content=content, headers={**JSON_TYPE, **headers})
            assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.headers["content-type"] == "application/problem+json"
        assert lane.answered == before + 3
        r = await c.post(path, json=body, headers={"Authorization": f"Bearer {other}"})
        assert r.status_code == 404 and r.json()["code"] == "SESSION_NOT_FOUND"  # not acme's
        r = await c.post(path, json=body, headers=mine)
        assert r.status_code == 201 and r.json() == {"seqs": [2], "head": 2}
        assert lane.answered == before + 5
        assert (await c.get("/v1/sessions/s", headers=mine)).json()["head"] == 2


JSON_TYPE = {"Content-Type": "application/json"}


async def test_every_state_changing_api_route_asks_for_the_key_before_its_body(
    pg_dsn: str,
) -> None:
    """Once keys exist, a POST or DELETE under /v1/ without a valid key is a 401 before its
    body is parsed (FastAPI parses a route's body before the route's key
    dependency: an anonymous client got a JSON parse, up to the body cap, and a 422);
    with the key, the route parses and answers as before."""
    own = await new_key(pg_dsn, "local")
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        c, mine = svc.client, {"X-ContextLedger-Key": own}
        assert (await c.post("/v1/sessions", json={"session_id": "k"}, headers=mine)).is_success
        for method, path in (
            ("POST", "/v1/sessions"),
            ("POST", "/v1/sessions/k/checkpoints"),
            ("POST", "/v1/sessions/k/rollback"),
            ("POST", "/v1/sessions/k/compact"),
            ("POST", "/v1/sessions/k/fork"),
            ("POST", "/v1/chat/completions"),
            ("DELETE", "/v1/sessions/k"),
        ):
            for headers in ({}, {"Authorization": "Bearer cl_wrong"}):
                r = await c.request(
                    method, path, content=b"{not json", headers={**JSON_TYPE, **headers}
                )
                assert (r.status_code, r.json()["code"]) == (401, "UNAUTHORIZED"), path
                assert r.headers["www-authenticate"] == "Bearer"
        r = await c.post("/v1/sessions", content=b"{not json", headers={**JSON_TYPE, **mine})
        assert r.status_code == 422  # with the key, the route's own parse error
        assert (await c.get("/v1/sessions/k", headers=mine)).json()["head"] == 1


async def test_with_the_clients_own_bearer_the_proxy_asks_for_its_key_header_first(
    pg_dsn: str,
) -> None:
    """Under ``pass_client_key`` the bearer is the client's upstream key, not ours: a proxy
    call needs ``X-ContextLedger-Key`` before its body is read (a bearer alone is refused),
    and with it goes on to the route."""
    own = await new_key(pg_dsn, "local")
    settings = Settings(dsn=pg_dsn, migrate=False, pass_client_key=True)
    async with running_service(settings) as svc:
        c = svc.client
        bearer = {"Authorization": f"Bearer {own}"}  # even our own key, sent as the bearer
        r = await c.post(
            "/v1/chat/completions", content=b"{not json", headers={**JSON_TYPE, **bearer}
        )
        assert (r.status_code, r.json()["code"]) == (401, "UNAUTHORIZED")
        r = await c.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={**JSON_TYPE, **bearer, "X-ContextLedger-Key": own},
        )
        assert r.status_code not in (401, 403)  # past the key: the route's own answer
