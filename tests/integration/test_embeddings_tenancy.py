"""Hybrid recall's embeddings under tenancy (migration 0019): each tenant's own, held by
row-level security like every table, removed with a purged or erased session; an
earlier table (keyed by session id alone) brought to that shape by the migration."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from contextledger import Ledger
from contextledger.core.recall import Recalled
from contextledger.store.dsn import asyncpg_dsn, with_user
from contextledger.store.sealing import KeyRing
from tests.fakellm import FakeLLM
from tests.integration.test_recall import chatter, hybrid, recall_blocks

ROLE = "contextledger_service"
COUNT = "SELECT tenant_id, count(*) FROM contextledger.event_embeddings GROUP BY 1 ORDER BY 1"


async def _rows(dsn: str) -> dict[str, int]:
    """Embeddings per tenant, as a superuser sees them (row-level security aside)."""
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        return {r[0]: r[1] for r in await conn.fetch(COUNT)}
    finally:
        await conn.close()


async def test_each_tenant_embeds_and_finds_its_own_session_of_an_id(
    pg_dsn: str, fake: FakeLLM
) -> None:
    async with Ledger.open(pg_dsn) as owner:  # the owner makes the table, if it can
        vectors = await owner.store.vectors_available()
    service = with_user(asyncpg_dsn(pg_dsn), ROLE)
    for tenant, port in (("alpha", 18443), ("beta", 27001)):
        async with Ledger.open(service, tenant=tenant) as ledger:
            recall = hybrid(fake)
            session = await ledger.session("s", config={"token_counter": "chars", "recall": recall})
            await session.add_message({"role": "user", "content": f"It was at {port}."})
            await chatter(session, 20)
            await session.add_message({"role": "user", "content": f"{tenant}: so where was it?"})
            sent = await session.get_messages_for_request(token_budget=2000)
            # found by its own tenant's embedding (the question shares no word with it)
            assert any(str(port) in b for b in recall_blocks(sent)) == vectors
            assert (f"It was at {port}." in fake.embedded) == vectors
    if not vectors:  # PostgreSQL 15 here: no pgvector, no table, nothing embedded
        assert fake.embedded == []
        return
    assert await _rows(pg_dsn) == {"alpha": 42, "beta": 42}
    conn = await asyncpg.connect(service, server_settings={"contextledger.tenant": "beta"})
    try:  # TRUNCATE is not held by row-level security: the service role may not
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("TRUNCATE contextledger.event_embeddings")
    finally:
        await conn.close()
    async with Ledger.open(service, tenant="alpha") as alpha:
        await alpha.store.purge("s", "asked")  # type: ignore[attr-defined]
    assert await _rows(pg_dsn) == {"beta": 42}  # alpha's went with its session, beta's stay


async def test_erase_and_purge_work_where_the_embeddings_table_exists(pg_dsn: str) -> None:
    # 0016 scoped the erase's DELETE of embeddings by a tenant column the table did not
    # have: wherever hybrid recall had made the table, every erasure was refused.
    async with Ledger.open(pg_dsn, keyring=KeyRing(bytes(range(32)))) as ledger:
        vectors = await ledger.store.vectors_available()
        sealed = await ledger.session("sealed")
        await sealed.add_message({"role": "user", "content": "private"})
        (receipt,) = await ledger.erase("sealed", reason="asked")
        assert receipt.session_id == "sealed"
    async with Ledger.open(pg_dsn) as ledger:  # (no keyring: a session in clear)
        plain = await ledger.session("plain")
        await plain.add_message({"role": "user", "content": "one"})
        if vectors:
            said = Recalled(2, {"role": "user", "content": "one"})
            await ledger.store.store_embeddings("plain", "m", 2, [(said, [1.0, 0.0])])
            assert await _rows(pg_dsn) == {"local": 1}
        assert await ledger.store.purge("plain", "asked") == 2  # type: ignore[attr-defined]
    if vectors:
        assert await _rows(pg_dsn) == {}


async def test_migration_0019_gives_earlier_embeddings_their_tenant(pg_dsn: str) -> None:
    from alembic import command

    from contextledger.store.migrate import alembic_config

    async with Ledger.open(pg_dsn) as owner:
        if not await owner.store.vectors_available():  # PostgreSQL 15: nothing to migrate
            await asyncio.to_thread(command.downgrade, alembic_config(pg_dsn), "0018")
            await asyncio.to_thread(command.upgrade, alembic_config(pg_dsn), "head")
            conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
            try:
                table = "SELECT to_regclass('contextledger.event_embeddings')"
                assert await conn.fetchval(table) is None
            finally:
                await conn.close()
            return
    service = with_user(asyncpg_dsn(pg_dsn), ROLE)
    for tenant, sid in (("alpha", "one"), ("alpha", "both"), ("beta", "both")):
        async with Ledger.open(service, tenant=tenant) as ledger:
            s = await ledger.session(sid)
            await s.add_message({"role": "user", "content": "text"})
    await asyncio.to_thread(command.downgrade, alembic_config(pg_dsn), "0018")
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:  # the table as 0018 left it: no tenant; rows of one id, of two, of a purged one,
        # and one at an event that is no message (its session's creation, seq 1)
        await conn.executemany(
            "INSERT INTO contextledger.event_embeddings (session_id, model, seq,"
            " available_from, embedding) VALUES ($1, 'm', $2, 2, '[1,0]')",
            [("one", 2), ("both", 2), ("gone", 2), ("one", 1)],
        )
        await asyncio.to_thread(command.upgrade, alembic_config(pg_dsn), "head")
        rows = await conn.fetch(
            "SELECT tenant_id, session_id FROM contextledger.event_embeddings ORDER BY 2"
        )
        assert [tuple(r) for r in rows] == [("alpha", "one")]
        forced = await conn.fetchval(
            "SELECT relforcerowsecurity FROM pg_class"
            " WHERE oid = 'contextledger.event_embeddings'::regclass"
        )
        assert forced
    finally:
        await conn.close()
    async with Ledger.open(service, tenant="alpha") as alpha:  # granted, and alpha's
        assert await alpha.store.vectors_available()
        assert await alpha.store.unembedded("one", "m", upto_seq=5, first=(), limit=5) == []
        await alpha.store.purge("one", "asked")  # type: ignore[attr-defined]
    async with Ledger.open(service, tenant="beta") as beta:  # its "both" is its own again
        found = await beta.store.unembedded("both", "m", upto_seq=5, first=(), limit=5)
        assert [r.seq for r in found] == [2]
    assert await _rows(pg_dsn) == {}
