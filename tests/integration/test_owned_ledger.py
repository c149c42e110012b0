"""``OwnedLedger`` on PostgreSQL: racing first uses open one pool, ``close`` closes it."""

from __future__ import annotations

import asyncio

import pytest

from contextledger import LedgerClosed, OwnedLedger


async def test_racing_first_uses_open_one_ledger(pg_dsn: str) -> None:
    source = OwnedLedger(dsn=pg_dsn)
    opened = await asyncio.gather(*(source.get() for _ in range(6)))
    assert len({id(ledger) for ledger in opened}) == 1  # no second pool, none leaked
    assert source.owned and source.target == pg_dsn
    session = await opened[0].session("s")
    await source.close()
    with pytest.raises(LedgerClosed):
        await session.add_message({"role": "user", "content": "after close"})
    again = await source.get()  # a use after close opens a new one
    assert again is not opened[0]
    assert (await again.session("s", create=False)).session_id == "s"
    await source.close()
