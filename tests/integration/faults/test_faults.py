"""Faults on a throwaway PostgreSQL of our own (never the shared one): every failure is a
typed ContextLedgerError with a code; nothing lost or duplicated; every session verifies."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from contextledger import Ledger
from contextledger.errors import ContextLedgerError, LedgerRefused, LedgerUnavailable
from contextledger.store.dsn import asyncpg_dsn
from tests.integration.faults.support import admin as _admin


async def _append_until_done(session: Any, i: int, failures: list[ContextLedgerError]) -> int:
    """The writer's loop under an outage: retry with the same idempotency key."""
    for _ in range(200):
        try:
            seq: int = await session.add_message(
                {"role": "user", "content": f"m{i}"}, idempotency_key=f"k{i}"
            )
            return seq
        except ContextLedgerError as exc:
            assert exc.code
            failures.append(exc)
            await asyncio.sleep(0.05)
    raise AssertionError("the server never came back")


async def test_server_stop_and_restart_mid_load(server: Any, scratch: str) -> None:
    failures: list[ContextLedgerError] = []
    async with Ledger.open(scratch) as ledger:
        session = await ledger.session("w")
        seqs = [await _append_until_done(session, i, failures) for i in range(20)]
        server.stop()
        down: list[ContextLedgerError] = []
        with pytest.raises(LedgerUnavailable) as info:
            await session.add_message(
                {"role": "user", "content": "while down"}, idempotency_key="d"
            )
        down.append(info.value)
        assert info.value.code in {"CONNECTION_LOST", "CONNECTION_REFUSED", "SERVER_STOPPING"}
        with pytest.raises(LedgerUnavailable):
            await Ledger.open(scratch, migrate=True)
        server.start()
        seqs += [await _append_until_done(session, i, failures) for i in range(20, 40)]
        # the append refused while down is retried with its key: written once
        await _append_until_done(session, 999, failures)
        assert (await ledger.verify("w")).ok
        contents = [e.payload.message["content"] async for e in ledger.store.read_events("w", 2)]
    assert contents[:40] == [f"m{i}" for i in range(40)]
    assert len(contents) == len(set(contents))
    assert all(isinstance(f, LedgerUnavailable) for f in failures)


async def test_statement_timeout_is_refused_typed(scratch: str) -> None:
    async with Ledger.open(scratch) as ledger:
        session = await ledger.session("t")
        await _admin(scratch, "ALTER ROLE postgres SET statement_timeout = '300ms'")
        blocker = await asyncpg.connect(asyncpg_dsn(scratch))
        try:
            async with Ledger.open(scratch) as fresh:  # new connections get the setting
                s2 = await fresh.session("t")
                tx = blocker.transaction()
                await tx.start()
                await blocker.execute(
                    "SELECT 1 FROM contextledger.sessions WHERE session_id = 't' FOR UPDATE"
                )
                with pytest.raises(LedgerRefused) as info:
                    await s2.add_message({"role": "user", "content": "blocked"})
                assert info.value.code == "STATEMENT_TIMEOUT"
                await tx.rollback()
        finally:
            await blocker.close()
            await _admin(scratch, "ALTER ROLE postgres RESET statement_timeout")
        assert await session.add_message({"role": "user", "content": "after"}) == 2
        assert (await ledger.verify("t")).ok


async def test_read_only_database_is_refused_typed(scratch: str) -> None:
    async with Ledger.open(scratch) as ledger:
        await ledger.session("r")
    db = scratch.split("@/")[1].split("?")[0]
    await _admin(scratch, f'ALTER DATABASE "{db}" SET default_transaction_read_only = on')
    async with Ledger.open(scratch) as ledger:
        session = await ledger.session("r", create=False)
        with pytest.raises(LedgerRefused) as info:
            await session.add_message({"role": "user", "content": "x"})
        assert info.value.code == "READ_ONLY"
        with pytest.raises(LedgerRefused) as info:
            await ledger.session("new")
        assert info.value.code == "READ_ONLY"
        assert (await ledger.verify("r")).ok
        assert (await ledger.store.session_info("r")).head == 1


async def test_revoked_insert_is_permission_denied(scratch: str) -> None:
    await _admin(
        scratch,
        "DROP ROLE IF EXISTS cl_noinsert",
        "CREATE ROLE cl_noinsert LOGIN",
        "GRANT USAGE ON SCHEMA contextledger TO cl_noinsert",
        "GRANT SELECT, UPDATE ON ALL TABLES IN SCHEMA contextledger TO cl_noinsert",
        "GRANT INSERT ON contextledger.sessions TO cl_noinsert",
    )
    try:
        dsn = scratch.replace("postgres@", "cl_noinsert@")
        async with Ledger.open(dsn) as ledger:
            with pytest.raises(LedgerRefused) as info:
                await ledger.session("p")
            assert info.value.code == "PERMISSION_DENIED"
            assert await ledger.sessions() == []
    finally:
        await _admin(
            scratch,
            "REVOKE ALL ON ALL TABLES IN SCHEMA contextledger FROM cl_noinsert",
            "REVOKE ALL ON SCHEMA contextledger FROM cl_noinsert",
            "DROP ROLE cl_noinsert",
        )


async def test_cancelled_appends_lose_and_duplicate_nothing(scratch: str) -> None:
    async with Ledger.open(scratch) as ledger:
        session = await ledger.session("c")
        written: set[str] = set()
        for i in range(60):
            task = asyncio.ensure_future(
                session.add_message({"role": "user", "content": f"c{i}"}, idempotency_key=f"c{i}")
            )
            await asyncio.sleep(0.0005 * (i % 5))
            task.cancel()
            try:
                await task
                written.add(f"c{i}")
            except asyncio.CancelledError:
                pass
            await session.refresh()
        for i in range(60):  # the retry with the key: each exactly once
            await session.add_message({"role": "user", "content": f"c{i}"}, idempotency_key=f"c{i}")
        contents = [e.payload.message["content"] async for e in ledger.store.read_events("c", 2)]
        assert sorted(contents) == sorted(f"c{i}" for i in range(60))
        assert written <= set(contents)
        assert (await ledger.verify("c")).ok
