"""``OwnedLedger``: how every adapter gets its ledger (given, or opened once and closed)."""

from __future__ import annotations

import pytest

from contextledger import InvalidArgument, Ledger, OwnedLedger


@pytest.mark.parametrize(("ledger", "dsn"), [(None, None), ("both", "memory://")])
async def test_exactly_one_of_ledger_or_dsn(ledger: object, dsn: str | None) -> None:
    given = await Ledger.open("memory://") if ledger else None
    with pytest.raises(InvalidArgument, match="exactly one of ledger= or dsn="):
        OwnedLedger(given, dsn)

    class FrameworkError(Exception):
        pass

    with pytest.raises(FrameworkError):
        OwnedLedger(given, dsn, error=FrameworkError)


async def test_a_given_ledger_is_never_closed_here() -> None:
    async with Ledger.open("memory://") as ledger:
        source = OwnedLedger(ledger)
        assert await source.get() is ledger and not source.owned
        await source.close()
        session = await ledger.session("still-open")
        assert await session.add_message({"role": "user", "content": "x"}) == 2
