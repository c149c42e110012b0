"""Anchors catch a truncated tail with a rewound session row; rebuild refuses a bad chain."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from contextledger import Ledger
from contextledger.core.chain import Anchor
from contextledger.errors import ChainBroken, InvalidArgument
from contextledger.store.dsn import asyncpg_dsn
from tests.integration.test_cli import run, seed


async def _truncate_and_rewind(dsn: str, session_id: str, keep: int) -> None:
    """What a superuser can do: drop the tail and point the session row at the new end."""
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        async with conn.transaction():
            await conn.execute("ALTER TABLE contextledger.events DISABLE TRIGGER USER")
            await conn.execute(
                "DELETE FROM contextledger.events WHERE session_id = $1 AND seq > $2",
                session_id,
                keep,
            )
            await conn.execute(
                "UPDATE contextledger.sessions s SET head = $2, last_hash = e.hash"
                " FROM contextledger.events e WHERE s.session_id = $1"
                " AND e.session_id = $1 AND e.seq = $2",
                session_id,
                keep,
            )
            await conn.execute("ALTER TABLE contextledger.events ENABLE TRIGGER USER")
    finally:
        await conn.close()


async def test_anchor_catches_truncation_with_a_rewound_row(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        s = await ledger.session("a")
        for i in range(5):
            await s.add_message({"role": "user", "content": f"m{i}"})
        pin = await ledger.anchor("a")
        assert pin == Anchor(6, (await s.refresh()).last_hash)
        assert (await ledger.verify("a", anchor=pin)).ok
        await _truncate_and_rewind(pg_dsn, "a", 4)
        assert (await ledger.verify("a")).ok  # the chain alone cannot tell
        report = await ledger.verify("a", anchor=pin)
        assert not report.ok and report.first_bad_seq == 6
        forged = await ledger.verify("a", anchor=Anchor(3, "0" * 64))
        assert not forged.ok and forged.first_bad_seq == 3


@pytest.mark.parametrize("text", ["", "3", "x:abc", "0:abc", "3:"])
def test_anchor_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(InvalidArgument):
        Anchor.parse(text)


async def test_rebuild_refuses_a_chain_that_does_not_verify(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        s = await ledger.session("r")
        await s.add_message({"role": "user", "content": "x"})
        conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
        try:
            async with conn.transaction():
                await conn.execute("ALTER TABLE contextledger.events DISABLE TRIGGER USER")
                await conn.execute(
                    "UPDATE contextledger.events SET tokens = tokens + 1"
                    " WHERE session_id = 'r' AND seq = 2"
                )
                await conn.execute("ALTER TABLE contextledger.events ENABLE TRIGGER USER")
        finally:
            await conn.close()
        with pytest.raises(ChainBroken) as info:
            await ledger.rebuild("r")
        assert info.value.details["seq"] == 2
        assert len(await ledger.rebuild("r", force=True)) == 1


def test_cli_anchor_verify_and_rebuild(pg_dsn: str) -> None:
    seed(pg_dsn)
    out = run(pg_dsn, "anchor", "cli")
    assert out.returncode == 0, out.stderr
    pin = json.loads(out.stdout)
    assert pin["seq"] == 5 and pin["anchor"] == f"5:{pin['hash']}"
    assert run(pg_dsn, "verify", "cli", "--anchor", pin["anchor"]).returncode == 0
    asyncio.run(_truncate_and_rewind(pg_dsn, "cli", 3))
    assert run(pg_dsn, "verify", "cli").returncode == 0
    bad = run(pg_dsn, "verify", "cli", "--anchor", pin["anchor"])
    assert bad.returncode == 1 and "anchor" in bad.stdout
    assert run(pg_dsn, "verify", "cli", "--anchor", "nonsense").returncode == 2
