"""Behind PgBouncer in transaction mode, a tenant connection's lone statement carries its
tenant in front of it, before the same ``Sync`` (``store/scoped.py``,
``store/pipelined.py``): one round trip, one transaction, and nothing left on the server
connection the pooler lends to the next client. Debian's pgbouncer with ONE server
connection, so every client here runs on the same server session in turn."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import asyncpg
import pytest

from contextledger import Ledger
from tests.integration.conftest import PG_HOST, PG_PORT
from tests.integration.pgbouncer import Bouncer, running_pgbouncer
from tests.integration.segments import data_segments
from tests.integration.service_support import inserts_held, new_key, until

ROLE = "contextledger_service"
SETTING = "SELECT current_setting('contextledger.tenant', true)"


async def _names(pg_dsn: str) -> tuple[str, str]:
    from contextledger.store.dsn import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        return await conn.fetchval("SELECT current_user"), await conn.fetchval(
            "SELECT current_database()"
        )
    finally:
        await conn.close()


@contextmanager
def _one_server_connection(superuser: str) -> Iterator[Bouncer]:
    with running_pgbouncer(PG_HOST, PG_PORT, [superuser, ROLE], pool_size=1) as bouncer:
        yield bouncer


@asynccontextmanager
async def _tenant(dsn: str, tenant: str) -> AsyncIterator[Ledger]:
    ledger = await Ledger.open(dsn, migrate=False, pool_size=2, tenant=tenant, pgbouncer=True)
    try:
        yield ledger
    finally:
        await ledger.close()


async def _bare_setting(dsn: str) -> object:
    """The tenant a plain connection through the pooler finds: what the last client left
    on the one server connection."""
    conn = await asyncpg.connect(dsn, statement_cache_size=0)
    try:
        return await conn.fetchval(SETTING)
    finally:
        await conn.close()


async def test_lone_statements_are_scoped_one_round_trip_each(pg_dsn: str) -> None:
    await new_key(pg_dsn, "alpha")  # tenants exist: an unset tenant reads nothing
    await new_key(pg_dsn, "beta")
    superuser, dbname = await _names(pg_dsn)
    with _one_server_connection(superuser) as bouncer:
        dsn = bouncer.dsn(ROLE, dbname)
        async with _tenant(dsn, "alpha") as alpha, _tenant(dsn, "beta") as beta:
            a, b = await alpha.session("same-id"), await beta.session("same-id")
            for i in range(3):  # interleaved on the one server connection
                await asyncio.gather(
                    a.add_message({"role": "user", "content": f"alpha {i}"}),
                    b.add_message({"role": "user", "content": f"beta {i}"}),
                )
            assert [m["content"] for m in await a.get_messages()] == [
                f"alpha {i}" for i in range(3)
            ]
            assert [m["content"] for m in await b.get_messages()] == [f"beta {i}" for i in range(3)]
            assert await _bare_setting(dsn) in (None, "")  # nothing outlived its transaction

            pool = alpha.store._pool  # type: ignore[attr-defined]
            async with pool.acquire() as conn:
                assert await conn.fetchval(SETTING) == "alpha"  # described (and warmed)
                count = "SELECT count(*) FROM contextledger.sessions WHERE session_id = $1"
                assert await conn.fetchval(count, "same-id") == 1  # its own row, not beta's
                before = bouncer.stats(superuser)
                for _ in range(5):
                    assert await conn.fetchval(SETTING) == "alpha"
                    assert await conn.fetchval(count, "same-id") == 1
                after = bouncer.stats(superuser)
                # one round trip and one transaction each: the scope rode with it
                assert after["query_count"] - before["query_count"] == 10
                assert after["xact_count"] - before["xact_count"] == 10
                async with conn.transaction():  # a transaction is scoped at its BEGIN
                    assert await conn.fetchval(SETTING) == "alpha"
            assert await _bare_setting(dsn) in (None, "")


def _sent(conn: asyncpg.Connection) -> int:
    return data_segments(conn._transport.get_extra_info("socket"))[1]


async def _segments_per_run(conn: asyncpg.Connection, query: str, *args: object) -> float:
    """TCP segments sent per run of ``query`` (and its answer checked each time)."""
    first = await conn.fetchval(query, *args)  # described: later runs are one round trip
    before = _sent(conn)
    for _ in range(4):
        assert await conn.fetchval(query, *args) == first
    return (_sent(conn) - before) / 4


async def test_a_statement_leaves_in_one_tcp_segment(pg_dsn: str) -> None:
    """A lone statement's scope, ``Parse`` and ``Bind``/``Execute``/``Sync`` were three
    writes, three segments for the pooler and the server to wake up for; one now, in a
    transaction and on a connection without a tenant too. The socket is released after
    each (a cork left on would hold the next writes back)."""
    await new_key(pg_dsn, "alpha")
    superuser, dbname = await _names(pg_dsn)
    count = "SELECT count(*) FROM contextledger.sessions WHERE session_id = $1"
    with _one_server_connection(superuser) as bouncer:
        dsn = bouncer.dsn(ROLE, dbname)
        async with _tenant(dsn, "alpha") as alpha:
            await alpha.session("one")
            pool = alpha.store._pool  # type: ignore[attr-defined]
            async with pool.acquire() as conn:
                raw = conn._con
                assert await _segments_per_run(raw, SETTING) == 1
                assert await _segments_per_run(raw, count, "one") == 1
                async with raw.transaction():
                    assert await _segments_per_run(raw, count, "one") == 1
                sock = raw._transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
        plain = await Ledger.open(bouncer.dsn(superuser, dbname), pool_size=2, pgbouncer=True)
        try:
            async with plain.store._pool.acquire() as conn:  # type: ignore[attr-defined]
                assert await _segments_per_run(conn._con, count, "one") == 1
        finally:
            await plain.close()


async def test_appends_arriving_meanwhile_share_the_next_statement(pg_dsn: str) -> None:
    """Behind the pooler a process has one append statement in flight: the appends that
    arrive meanwhile go together in the next one. Eight appends to eight sessions, the
    first held in the database until the others have arrived: two statements (with a
    second in flight, it took a lone append: three)."""
    await new_key(pg_dsn, "alpha")
    superuser, dbname = await _names(pg_dsn)
    with _one_server_connection(superuser) as bouncer:
        async with _tenant(bouncer.dsn(ROLE, dbname), "alpha") as alpha:
            sessions = [await alpha.session(f"g{i}") for i in range(8)]
            # heads known and both append statements described: then each is one round trip
            await asyncio.gather(
                *(s.add_message({"role": "user", "content": "first"}) for s in sessions)
            )
            batcher = alpha.store._batcher  # type: ignore[attr-defined]
            before = bouncer.stats(superuser)
            async with inserts_held(pg_dsn):
                sent = [
                    asyncio.create_task(s.add_message({"role": "user", "content": "second"}))
                    for s in sessions
                ]

                async def arrived() -> bool:
                    return len(batcher._queue) + batcher._inflight == len(sent)

                await until(arrived, "every append reached the batcher")
            assert [await t for t in sent] == [3] * len(sent)
            after = bouncer.stats(superuser)
            assert after["query_count"] - before["query_count"] == 2
            assert after["xact_count"] - before["xact_count"] == 2
            for s in sessions:
                assert [m["content"] for m in await s.get_messages()] == ["first", "second"]


async def test_a_statement_that_fails_before_its_sync_closes_the_connection(
    pg_dsn: str,
) -> None:
    """Arguments that do not encode fail after the scope went out and before the
    statement's ``Sync``: the connection is closed (never reused with a scope pending
    on the wire), and the next one is scoped as ever. A server's error ends at the
    ``Sync``: that connection goes on."""
    await new_key(pg_dsn, "alpha")
    superuser, dbname = await _names(pg_dsn)
    with _one_server_connection(superuser) as bouncer:
        dsn = bouncer.dsn(ROLE, dbname)
        async with _tenant(dsn, "alpha") as alpha:
            pool = alpha.store._pool  # type: ignore[attr-defined]
            async with pool.acquire() as conn:
                raw = conn._con
                assert await conn.fetchval("SELECT $1::int + 1", 1) == 2  # described
                # the server's own error: answered through the Sync, the connection goes on
                with pytest.raises(asyncpg.DivisionByZeroError):
                    await conn.fetchval("SELECT 1 / $1::int", 0)
                assert await conn.fetchval(SETTING) == "alpha"
                with pytest.raises(asyncpg.DataError, match="invalid input for query argument"):
                    await conn.fetchval("SELECT $1::int + 1", "not a number")
            assert raw.is_closed()
            assert await _bare_setting(dsn) in (None, "")
            assert await pool.fetchval(SETTING) == "alpha"
            session = await alpha.session("after")
            await session.add_message({"role": "user", "content": "still alpha"})
            assert [m["content"] for m in await session.get_messages()] == ["still alpha"]
