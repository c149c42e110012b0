"""Issue 26, the medium findings: /metrics behind its own token with bounded labels,
database failures as a generic 503 (details in the log only), upstream errors without
the operator's addresses, event streams that end when their key is revoked and are
capped per tenant, DSN passwords redacted in every spelling. Real HTTP, real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest
import structlog

from contextledger.http.keys import revoke_key
from contextledger.http.settings import Settings
from contextledger.store.dsn import asyncpg_dsn, redact
from tests.fakellm import FakeLLM, Reply, completion_body, openai_error
from tests.integration.service_support import new_key, proxy_service, running_service

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


# -- /metrics -------------------------------------------------------------------------------


async def test_metrics_need_their_token_when_one_is_set(pg_dsn: str) -> None:
    settings = Settings(dsn=pg_dsn, migrate=False, metrics_token="scrape-me")
    async with running_service(settings) as svc:
        assert (await svc.client.get("/metrics")).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await svc.client.get("/metrics", headers=wrong)).status_code == 401
        right = {"Authorization": "Bearer scrape-me"}
        r = await svc.client.get("/metrics", headers=right)
        assert r.status_code == 200 and "contextledger_appends" in r.text


async def test_metrics_beyond_loopback_need_a_token(pg_dsn: str) -> None:
    await new_key(pg_dsn, "alpha")  # a key exists: the service may bind beyond loopback
    async with running_service(Settings(dsn=pg_dsn, migrate=False, host="0.0.0.0")) as svc:
        r = await svc.client.get("/metrics")
        assert r.status_code == 403 and r.json()["code"] == "METRICS_TOKEN_REQUIRED"
        assert "alpha" not in r.text


async def test_usage_labels_name_only_configured_models(pg_dsn: str, fake: FakeLLM) -> None:
    def made_up(req: object) -> Reply:  # an upstream that names any model it likes
        return Reply(body=completion_body("made-up-model-12345", "fine"))

    fake.script("m", [made_up])
    async with proxy_service(pg_dsn, fake, True) as svc:
        r = await svc.client.post("/v1/chat/completions", json=CHAT, headers={"X-Session-Id": "s"})
        assert r.status_code == 200
        metrics = (await svc.client.get("/metrics")).text
    usage = [line for line in metrics.splitlines() if line.startswith("contextledger_proxy_usage")]
    assert usage and not [line for line in usage if "made-up" in line]
    assert any('model="hosted_vllm/m"' in line for line in usage)


# -- database failures ---------------------------------------------------------------------


async def test_a_database_failure_is_a_generic_503(pg_dsn: str) -> None:
    key = await new_key(pg_dsn, "late")
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
        try:  # the schema moves under the service: a tenant opened now finds it wrong
            dbname = await conn.fetchval("SELECT current_database()")
            await conn.execute("UPDATE contextledger.alembic_version SET version_num = '0001'")
            with structlog.testing.capture_logs() as logs:
                r = await svc.client.get("/v1/sessions", headers={"Authorization": f"Bearer {key}"})
        finally:
            await conn.execute(
                "UPDATE contextledger.alembic_version SET version_num = $1",
                svc.app.state.tenants._head,
            )
            await conn.close()
    assert r.status_code == 503, r.text
    body = r.text
    for secret in (dbname, "contextledger_service", "postgresql://", "host=", "port="):
        assert secret not in body
    assert r.json()["code"] == "MIGRATION_REQUIRED"
    [logged] = [e for e in logs if e.get("event") == "database_failure"]
    assert dbname in logged["error"]  # the operator's log says where and why


# -- upstream errors -----------------------------------------------------------------------


@pytest.mark.parametrize("relay", [True, False], ids=["relay", "litellm"])
async def test_upstream_errors_do_not_carry_internal_addresses(
    pg_dsn: str, fake: FakeLLM, relay: bool
) -> None:
    fake.script(
        "m",
        [
            openai_error(
                400,
                "maximum context length exceeded at http://10.9.8.7:8000/v1 (vllm-7:8000)\n"
                'Traceback (most recent call last):\n  File "/srv/app.py"',
                type_="invalid_request_error",
            ),
            openai_error(500, "worker 10.9.8.7:9000 crashed: KeyError", type_="server_error"),
        ],
    )
    async with proxy_service(pg_dsn, fake, relay) as svc:
        first = await svc.client.post(
            "/v1/chat/completions", json=CHAT, headers={"X-Session-Id": "a"}
        )
        second = await svc.client.post(
            "/v1/chat/completions", json=CHAT, headers={"X-Session-Id": "b"}
        )
    assert first.status_code == 400 and second.status_code == 500
    for r in (first, second):
        text = r.text
        assert "10.9.8.7" not in text and "vllm-7" not in text and "Traceback" not in text
        assert "/srv/app.py" not in text
    assert "maximum context length exceeded" in first.json()["detail"]
    assert second.json()["detail"] == "the upstream failed (500)"


# -- event streams -------------------------------------------------------------------------


async def test_a_stream_ends_when_its_key_is_revoked(pg_dsn: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        from contextledger.http.keys import create_key

        key_id, key = await create_key(conn, "alpha")
    finally:
        await conn.close()
    h = {"Authorization": f"Bearer {key}"}
    settings = Settings(dsn=pg_dsn, migrate=False, key_cache_seconds=0.2)
    async with running_service(settings) as svc:
        await svc.client.post("/v1/sessions", json={"session_id": "s"}, headers=h)
        async with svc.client.stream(
            "GET", "/v1/sessions/s/events/stream", headers=h, timeout=30
        ) as stream:
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("id: 1")
            conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
            try:
                assert await revoke_key(conn, key_id)
            finally:
                await conn.close()
            rest: list[str] = []
            async with asyncio.timeout(15):  # the check runs every 5 s
                async for line in lines:
                    rest.append(line)
    errors = [json.loads(line[6:]) for line in rest if line.startswith("data: ")]
    assert errors and errors[-1]["code"] == "UNAUTHORIZED"


async def test_streams_are_capped_per_tenant(pg_dsn: str) -> None:
    a, b = await new_key(pg_dsn, "alpha"), await new_key(pg_dsn, "beta")
    settings = Settings(dsn=pg_dsn, migrate=False, sse_tails_per_tenant=2)
    async with running_service(settings) as svc:
        c = svc.client
        for key in (a, b):
            await c.post(
                "/v1/sessions", json={"session_id": "s"}, headers={"Authorization": f"Bearer {key}"}
            )
        ha = {"Authorization": f"Bearer {a}"}
        url = "/v1/sessions/s/events/stream"
        async with c.stream("GET", url, headers=ha) as one, c.stream("GET", url, headers=ha) as two:
            assert one.status_code == two.status_code == 200
            third = await c.get(url, headers=ha)
            assert third.status_code == 429 and third.json()["code"] == "TOO_MANY_STREAMS"
            async with c.stream("GET", url, headers={"Authorization": f"Bearer {b}"}) as other:
                assert other.status_code == 200  # another tenant's cap is its own
        async with asyncio.timeout(10):  # closed streams free their places
            while True:
                async with c.stream("GET", url, headers=ha) as again:
                    if again.status_code == 200:
                        break
                await asyncio.sleep(0.3)


# -- DSN redaction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:hunter2@db:5432/app",
        "postgresql://u@db/app?sslmode=require&password=hunter2",
        "postgresql://u@db/app?PASSWORD=hunter2&x=1",
        "host=db user=u password=hunter2 dbname=app",
        "host=db password = 'hun ter2' dbname=app",
        "postgresql://u@db/app?sslpassword=hunter2",
    ],
)
def test_a_dsn_password_is_redacted_in_every_spelling(dsn: str) -> None:
    out = redact(dsn)
    assert "hunter2" not in out and "hun ter2" not in out
    assert "***" in out


async def test_the_session_cache_is_bounded_in_bytes(pg_dsn: str) -> None:
    """Sessions past the byte bound leave the cache least recently used first; the bound
    holds however many sessions a client opens, and the newest stays."""
    cap = 400 * 1024
    async with running_service(Settings(dsn=pg_dsn, migrate=False, session_cache_bytes=cap)) as svc:
        c = svc.client
        tenants = svc.app.state.tenants
        text = "the harbor crane lifts 1,204 crates each Tuesday " * 20
        for i in range(8):
            await c.post("/v1/sessions", json={"session_id": f"b{i}", "model": "gpt-4o"})
            for _ in range(20):
                r = await c.post(
                    f"/v1/sessions/b{i}/messages",
                    json={"message": {"role": "user", "content": text}},
                )
                assert r.status_code == 201, r.text
            assert tenants.cached_bytes <= cap
        assert tenants.cached("local", "b7")
        assert not tenants.cached("local", "b0")
        # an evicted session is opened again from the ledger, whole
        r = await c.get("/v1/sessions/b0")
        assert r.status_code == 200 and r.json()["head"] == 21
