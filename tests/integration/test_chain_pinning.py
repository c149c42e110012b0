"""Appends are pinned to the chain the handle knew; rollback only to a real checkpoint."""

from __future__ import annotations

import asyncpg
import pytest

from contextledger import Ledger
from contextledger.errors import CheckpointNotFound, SessionNotFound
from contextledger.store.base import Checkpoint
from contextledger.store.dsn import asyncpg_dsn


@pytest.mark.parametrize("same_ledger", [True, False])
async def test_stale_handle_cannot_write_onto_a_recreated_session(
    pg_dsn: str, same_ledger: bool
) -> None:
    async with Ledger.open(pg_dsn) as ledger, Ledger.open(pg_dsn) as other:
        stale = await ledger.session("s")
        for i in range(4):
            await stale.add_message({"role": "user", "content": f"m{i}"})
        # purge through the audited SQL function and re-create the same id
        conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
        try:
            await conn.fetchval("SELECT contextledger.purge_session($1, $2)", "s", "test")
        finally:
            await conn.close()
        again = await (ledger if same_ledger else other).session("s")
        await again.add_message({"role": "user", "content": "new chain"})
        with pytest.raises(SessionNotFound):
            await stale.add_message({"role": "user", "content": "from the stale handle"})
        with pytest.raises(SessionNotFound):
            await stale.checkpoint("cold path too")
        report = await other.verify("s")
        assert report.ok
        assert [e.seq async for e in other.store.read_events("s")] == [1, 2]
        # a handle that refreshed writes normally
        await stale.refresh()
        assert await stale.add_message({"role": "user", "content": "after refresh"}) == 3


async def test_a_second_handle_still_appends_after_the_first_wrote(ledger: Ledger) -> None:
    a = await ledger.session("s")
    b = await ledger.session("s")
    assert await a.add_message({"role": "user", "content": "a"}) == 2
    assert await b.add_message({"role": "user", "content": "b"}) == 3  # the chain grew: fine
    assert await a.add_message({"role": "user", "content": "a2"}) == 4
    assert (await ledger.verify("s")).ok


async def test_rollback_needs_a_checkpoint_that_exists(ledger: Ledger) -> None:
    s = await ledger.session("s")
    cp = await s.checkpoint("good")
    await s.add_message({"role": "user", "content": "after"})
    for forged in (
        Checkpoint(cp.seq, "other label", cp.created_at),
        Checkpoint(cp.seq + 1, "good", cp.created_at),
        Checkpoint(999, None, cp.created_at),
    ):
        with pytest.raises(CheckpointNotFound):
            await s.rollback(forged)
    head = s.head
    await s.rollback(cp)
    assert s.head == head + 1
    assert [m["content"] for m in await s.get_messages()] == []
