"""Tenants: API keys, local mode, and row-level security that holds even when the
application code is bypassed."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
import structlog

from contextledger.errors import ConfigError
from contextledger.http.keys import list_keys, revoke_key
from contextledger.http.server import serve
from contextledger.http.settings import Settings
from contextledger.store.dsn import asyncpg_dsn
from tests.integration.service_support import Running, new_key, running_service

ROLE = "contextledger_service"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def user(text: str) -> dict[str, Any]:
    return {"message": {"role": "user", "content": text}}


async def test_local_mode_until_the_first_key(svc: Running, pg_dsn: str) -> None:
    c = svc.client
    assert (await c.post("/v1/sessions", json={"session_id": "early"})).status_code == 201
    key = await new_key(pg_dsn, "local")
    denied = await c.get("/v1/sessions/early")
    assert denied.status_code == 401 and denied.json()["code"] == "UNAUTHORIZED"
    assert denied.headers["www-authenticate"] == "Bearer"
    assert (await c.get("/v1/sessions/early", headers=auth(key))).status_code == 200
    assert (await c.get("/v1/sessions", headers=auth(key + "x"))).status_code == 401
    forged = auth("cl_000000000000_" + "a" * 43)
    assert (await c.get("/v1/sessions", headers=forged)).status_code == 401


async def test_local_mode_refuses_to_listen_beyond_loopback(pg_dsn: str) -> None:
    with pytest.raises(ConfigError) as info:
        await serve(Settings(dsn=pg_dsn, host="0.0.0.0", migrate=False))
    assert info.value.details["key"] == "host"


async def test_revoked_keys_stop_working(svc: Running, pg_dsn: str) -> None:
    key = await new_key(pg_dsn, "acme")
    assert (await svc.client.get("/v1/sessions", headers=auth(key))).status_code == 200
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        [info] = [k for k in await list_keys(conn) if k.tenant == "acme"]
        stored = await conn.fetchrow(
            "SELECT salt, hash FROM contextledger.api_keys WHERE key_id = $1", info.key_id
        )
        assert key.encode() not in bytes(stored["hash"]) and len(bytes(stored["hash"])) == 32
        assert await revoke_key(conn, info.key_id)
    finally:
        await conn.close()
    assert (await svc.client.get("/v1/sessions", headers=auth(key))).status_code == 401


async def test_a_tenant_cannot_reach_another_tenants_session(svc: Running, pg_dsn: str) -> None:
    c = svc.client
    a, b = auth(await new_key(pg_dsn, "alpha")), auth(await new_key(pg_dsn, "beta"))
    created = await c.post("/v1/sessions", json={"session_id": "plans"}, headers=a)
    assert created.status_code == 201
    await c.post("/v1/sessions/plans/messages", json=user("alpha's secret plan"), headers=a)
    await c.post("/v1/sessions/plans/checkpoints", json={"label": "cp"}, headers=a)
    attempts = [
        ("GET", "/v1/sessions/plans", None),
        ("GET", "/v1/sessions/plans/messages", None),
        ("GET", "/v1/sessions/plans/view", None),
        ("GET", "/v1/sessions/plans/view?at=2", None),
        ("GET", "/v1/sessions/plans/context?at=2", None),
        ("GET", "/v1/sessions/plans/events", None),
        ("GET", "/v1/sessions/plans/verify", None),
        ("GET", "/v1/sessions/plans/checkpoints", None),
        ("POST", "/v1/sessions/plans/messages", user("beta writes")),
        ("POST", "/v1/sessions/plans/rollback", {"to": "cp"}),
        ("POST", "/v1/sessions/plans/compact", {}),
        ("DELETE", "/v1/sessions/plans?reason=x", None),
        ("GET", "/audit/sessions/plans", None),
    ]
    for method, path, body in attempts:
        r = await c.request(method, path, json=body, headers=b)
        assert r.status_code == 404, (method, path, r.status_code)
        assert "secret" not in r.text
    assert (await c.get("/v1/sessions", headers=b)).json()["items"] == []
    assert "plans" not in (await c.get("/", headers=b)).text
    # beta may use the same id: ids are per tenant, and alpha's session is untouched
    same_id = await c.post("/v1/sessions", json={"session_id": "plans"}, headers=b)
    assert same_id.status_code == 201
    await c.post("/v1/sessions/plans/messages", json=user("beta's own"), headers=b)
    mine = (await c.get("/v1/sessions/plans/messages", headers=a)).json()["messages"]
    assert mine == [{"role": "user", "content": "alpha's secret plan"}]
    theirs = (await c.get("/v1/sessions/plans/messages", headers=b)).json()["messages"]
    assert theirs == [{"role": "user", "content": "beta's own"}]
    assert (await c.get("/v1/sessions/plans/verify", headers=a)).json()["ok"] is True


async def _as_service(dsn: str, tenant: str | None) -> asyncpg.Connection:
    settings = {"role": ROLE} | ({"contextledger.tenant": tenant} if tenant else {})
    return await asyncpg.connect(asyncpg_dsn(dsn), server_settings=settings)


async def test_row_level_security_itself_keeps_tenants_apart(svc: Running, pg_dsn: str) -> None:
    a = auth(await new_key(pg_dsn, "alpha"))
    await svc.client.post("/v1/sessions", json={"session_id": "s"}, headers=a)
    await svc.client.post("/v1/sessions/s/messages", json=user("alpha only"), headers=a)
    tables = ("sessions", "events", "view_items", "branch_items", "purges")
    own = await _as_service(pg_dsn, "alpha")
    other = await _as_service(pg_dsn, "beta")
    unset = await _as_service(pg_dsn, None)
    try:
        assert await own.fetchval("SELECT count(*) FROM contextledger.events") == 2
        for table in tables:  # a hand-made query with the wrong setting
            assert await other.fetchval(f"SELECT count(*) FROM contextledger.{table}") == 0
        moved = await other.execute(
            "UPDATE contextledger.sessions SET head = head + 1 WHERE session_id = 's'"
        )
        assert moved == "UPDATE 0"
        for table in tables:  # and with none: refused, not the 'local' tenant (0011)
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="not set"):
                await unset.fetchval(f"SELECT count(*) FROM contextledger.{table}")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # WITH CHECK: no planting rows
            await other.execute(
                "INSERT INTO contextledger.sessions (session_id, last_hash, tenant_id)"
                " VALUES ('s', 'x', 'alpha')"
            )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # and no switching it off
            await other.execute("ALTER TABLE contextledger.sessions DISABLE ROW LEVEL SECURITY")
        role = await own.fetchrow(
            "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        )
        assert (role["rolsuper"], role["rolbypassrls"]) == (False, False)
    finally:
        for conn in (own, other, unset):
            await conn.close()


async def test_tenant_connections_log_in_as_the_service_role(svc: Running, pg_dsn: str) -> None:
    """Logged in as the role (0008), not switched to it from the DSN's superuser: a
    ``RESET ROLE`` in some statement has no superuser to go back to."""
    tenants = svc.app.state.tenants
    assert tenants.logged_in_as_role
    assert (await svc.client.post("/v1/sessions", json={"session_id": "who"})).status_code == 201
    ledger = await tenants.ledger("local")
    async with ledger.store._pool.acquire() as conn:
        await conn.execute("RESET ROLE")
        assert await conn.fetchval("SELECT session_user || '/' || current_user") == (
            f"{ROLE}/{ROLE}"
        )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SET ROLE postgres")
    admin = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        users = await admin.fetch(
            "SELECT DISTINCT usename FROM pg_stat_activity WHERE application_name LIKE"
            " 'contextledger%' AND datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await admin.close()
    assert [r["usename"] for r in users] == [ROLE]


async def test_a_role_that_cannot_log_in_is_switched_to_with_a_warning(pg_dsn: str) -> None:
    admin = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    await admin.execute(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cl_switch_only')"
        f" THEN CREATE ROLE cl_switch_only NOLOGIN IN ROLE {ROLE}; END IF; END $$"
    )
    await admin.close()
    settings = Settings(dsn=pg_dsn, migrate=False, service_role="cl_switch_only")
    with structlog.testing.capture_logs() as logs:
        async with running_service(settings) as running:
            assert not running.app.state.tenants.logged_in_as_role
            made = await running.client.post("/v1/sessions", json={"session_id": "sw"})
            assert made.status_code == 201, made.text
            ledger = await running.app.state.tenants.ledger("local")
            async with ledger.store._pool.acquire() as conn:
                assert await conn.fetchval("SELECT current_user") == "cl_switch_only"
    assert [e["role"] for e in logs if e["event"] == "service_role_switched"] == ["cl_switch_only"]


async def test_a_page_of_sessions_is_read_by_the_index_under_rls(pg_dsn: str) -> None:
    """0009: a tenant's page is a keyset scan of its own index range, not a read of every
    session and a sort (what the listing did before)."""
    conn = await _as_service(pg_dsn, "alpha")
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL enable_seqscan = off")
            plan = await conn.fetchval(
                "EXPLAIN (FORMAT JSON) SELECT session_id FROM contextledger.sessions"
                " WHERE (created_at, session_id) > (now(), 'x')"
                " ORDER BY created_at, session_id LIMIT 10"
            )
    finally:
        await conn.close()
    text = json.dumps(plan)
    assert "sessions_by_creation" in text and '"Sort"' not in text, text
