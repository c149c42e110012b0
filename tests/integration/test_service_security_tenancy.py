"""Issue 26, tenancy that cannot be off: the service refuses to run tenants on a role
that row-level security would not hold, the tenant travels in each transaction (not
as a startup parameter), an unset tenant fails closed, the service role holds only
what it needs. Real PostgreSQL, real HTTP."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from contextledger import Ledger
from contextledger.errors import ConfigError
from contextledger.http.settings import Settings
from contextledger.http.tenancy import Tenants
from contextledger.store.dsn import asyncpg_dsn, with_user
from tests.integration.service_support import new_key, running_service

ROLE = "contextledger_service"
S = "contextledger"


async def refused(settings: Settings) -> ConfigError:
    """The ConfigError the service's start raises (uvicorn turns it into exit 3)."""
    tenants = Tenants(settings)
    try:
        await tenants.start()
    except ConfigError as exc:
        return exc
    finally:
        await tenants.close()
    raise AssertionError("the service started")


async def admin(dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(asyncpg_dsn(dsn))


@pytest.fixture
async def temp_role(pg_dsn: str) -> AsyncIterator[str]:
    name = "cl_t_" + uuid.uuid4().hex[:10]
    yield name
    conn = await admin(pg_dsn)
    try:
        db = await conn.fetchval("SELECT current_database()")
        await conn.execute(f'REVOKE ALL ON DATABASE "{db}" FROM {name}')
        await conn.execute(f"DROP OWNED BY {name}")
        await conn.execute(f"DROP ROLE IF EXISTS {name}")
    except asyncpg.UndefinedObjectError:
        pass
    finally:
        await conn.close()


async def test_a_superuser_service_role_is_refused_at_start(pg_dsn: str) -> None:
    # service_role "" keeps the DSN's own user: the test server's superuser
    await new_key(pg_dsn, "alpha")
    exc = await refused(Settings(dsn=pg_dsn, migrate=False, service_role=""))
    assert "superuser" in str(exc) and exc.details["key"] == "service_role"


async def test_a_bypassrls_role_switched_to_is_refused(pg_dsn: str, temp_role: str) -> None:
    conn = await admin(pg_dsn)
    try:  # NOLOGIN: the service cannot log in as it and switches to it instead
        await conn.execute(f"CREATE ROLE {temp_role} NOLOGIN BYPASSRLS")
        await conn.execute(f"GRANT USAGE ON SCHEMA {S} TO {temp_role}")
        await conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {S} TO {temp_role}")
    finally:
        await conn.close()
    exc = await refused(Settings(dsn=pg_dsn, migrate=False, service_role=temp_role))
    assert "BYPASSRLS" in str(exc)


async def test_a_member_of_the_tables_owner_is_refused(pg_dsn: str, temp_role: str) -> None:
    conn = await admin(pg_dsn)
    try:
        owner = await conn.fetchval(
            f"SELECT tableowner FROM pg_tables WHERE schemaname = '{S}' AND tablename = 'events'"
        )
        await conn.execute(f"CREATE ROLE {temp_role} LOGIN")
        await conn.execute(f'GRANT "{owner}" TO {temp_role}')
    finally:
        await conn.close()
    exc = await refused(Settings(dsn=pg_dsn, migrate=False, service_role=temp_role))
    assert "owner" in str(exc) or "superuser" in str(exc)
    # and the library refuses such a tenant connection however it is opened
    login = with_user(asyncpg_dsn(pg_dsn), temp_role)
    with pytest.raises(ConfigError):
        await Ledger.open(login, tenant="alpha")


async def test_behind_a_pooler_the_tenant_lives_in_each_transaction(pg_dsn: str) -> None:
    """``pgbouncer``: between transactions the connection carries no tenant, so a pooler
    that lends the server connection to someone else lends no tenant with it."""
    await new_key(pg_dsn, "alpha")  # tenants exist: an unset tenant is no longer 'local'
    login = with_user(asyncpg_dsn(pg_dsn), ROLE)
    ledger = await Ledger.open(login, tenant="alpha", pgbouncer=True)
    try:
        session = await ledger.session("s")
        await session.add_message({"role": "user", "content": "x"})
        assert len(await session.get_messages()) == 1
        async with ledger.store._pool.acquire() as conn:  # type: ignore[attr-defined]
            scoped = "SELECT current_setting('contextledger.tenant', true)"
            assert await conn.fetchval(scoped) == "alpha"  # in its own transaction
            raw = conn._con
            scope, raw._scope = raw._scope, None  # the bare connection, between transactions
            try:
                assert await conn.fetchval(scoped) in (None, "")
                with pytest.raises(asyncpg.InsufficientPrivilegeError, match="not set"):
                    await conn.fetchval("SELECT count(*) FROM contextledger.sessions")
            finally:
                raw._scope = scope
    finally:
        await ledger.close()


async def test_the_tenant_is_no_startup_parameter(pg_dsn: str) -> None:
    """Direct: set by ``set_config`` on the new connection (after its role was checked),
    not in the startup packet a pooler would refuse or drop."""
    ledger = await Ledger.open(with_user(asyncpg_dsn(pg_dsn), ROLE), tenant="alpha")
    try:
        async with ledger.store._pool.acquire() as conn:  # type: ignore[attr-defined]
            assert await conn.fetchval("SELECT contextledger.current_tenant()") == "alpha"
            # RESET goes back to what the connection started with: a startup parameter
            # would come back; a set_config made after the start does not
            await conn.execute("RESET contextledger.tenant")
            setting = "SELECT current_setting('contextledger.tenant', true)"
            assert await conn.fetchval(setting) in (None, "")
    finally:
        await ledger.close()


async def test_before_any_key_an_unset_tenant_is_the_local_one(pg_dsn: str) -> None:
    """An application role using the library without tenants (no key exists) keeps the
    local tenant, as before; the first key ends that (below)."""
    conn = await asyncpg.connect(with_user(asyncpg_dsn(pg_dsn), ROLE))
    try:
        assert await conn.fetchval("SELECT contextledger.current_tenant()") == "local"
        await new_key(pg_dsn, "alpha")
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="not set"):
            await conn.fetchval("SELECT contextledger.current_tenant()")
    finally:
        await conn.close()


async def test_an_unset_tenant_fails_closed_for_the_service_role(pg_dsn: str) -> None:
    key = await new_key(pg_dsn, "alpha")
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        h = {"Authorization": f"Bearer {key}"}
        await svc.client.post("/v1/sessions", json={"session_id": "s"}, headers=h)
    # the service role without a tenant: neither the local tenant's rows nor an insert
    conn = await asyncpg.connect(with_user(asyncpg_dsn(pg_dsn), ROLE))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="not set"):
            await conn.fetchval("SELECT count(*) FROM contextledger.sessions")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(
                "INSERT INTO contextledger.sessions (session_id, last_hash) VALUES ('x', 'h')"
            )
        await conn.execute("SELECT set_config('contextledger.tenant', 'alpha', false)")
        assert await conn.fetchval("SELECT count(*) FROM contextledger.sessions") == 1
    finally:
        await conn.close()


async def test_the_service_role_holds_least_privilege_and_rls_is_forced(pg_dsn: str) -> None:
    conn = await admin(pg_dsn)
    try:
        unforced = await conn.fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = $1 AND c.relrowsecurity AND NOT c.relforcerowsecurity",
            S,
        )
        assert unforced == []
        granted = await conn.fetch(
            "SELECT table_name, privilege_type FROM information_schema.role_table_grants"
            " WHERE grantee = $1 AND table_schema = $2",
            ROLE,
            S,
        )
        held = {(r["table_name"], r["privilege_type"]) for r in granted}
        assert not {p for _, p in held} & {"TRUNCATE", "TRIGGER", "REFERENCES"}
        assert ("purges", "DELETE") not in held and ("purges", "UPDATE") not in held
        assert ("purges", "INSERT") in held and ("events", "INSERT") in held
    finally:
        await conn.close()
    service = await asyncpg.connect(
        with_user(asyncpg_dsn(pg_dsn), ROLE),
        server_settings={"contextledger.tenant": "alpha"},
    )
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await service.execute("TRUNCATE contextledger.sessions CASCADE")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await service.execute("DELETE FROM contextledger.purges")
    finally:
        await service.close()


async def test_a_purge_still_works_as_the_service_role(pg_dsn: str) -> None:
    key = await new_key(pg_dsn, "alpha")
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        h = {"Authorization": f"Bearer {key}"}
        await svc.client.post("/v1/sessions", json={"session_id": "s"}, headers=h)
        r = await svc.client.delete("/v1/sessions/s", params={"reason": "asked"}, headers=h)
        assert r.status_code == 200, r.text
        assert (await svc.client.get("/v1/sessions/s", headers=h)).status_code == 404


@pytest.mark.parametrize("conforming", ["on", "off"])
async def test_a_tenant_reads_back_as_itself_whatever_the_string_settings(
    pg_dsn: str, conforming: str
) -> None:
    """The scope statement is text (it rides on asyncpg's BEGIN), so a tenant's name is a
    literal in it: quotes and backslashes must come back as they went in, also where the
    server has ``standard_conforming_strings`` off (there ``\\'`` ended a plain literal and
    the rest of the name ran as SQL)."""
    from contextledger.store.scoped import scope_sql

    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        await conn.execute(f"SET standard_conforming_strings = {conforming}")
        for tenant in ("acme", "o'brien", "a\\", "x\\'); SELECT pg_sleep(0); --", "\\\\'"):
            async with conn.transaction():
                await conn.execute(scope_sql(tenant))
                got = await conn.fetchval("SELECT current_setting('contextledger.tenant')")
            assert got == tenant
    finally:
        await conn.close()
