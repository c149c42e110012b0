"""AppendBatcher: alone runs at once, concurrent ones share a statement, failures are precise."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from contextledger.store.batching import AppendBatcher


class Recorder:
    """Stand-ins for the two statements: they record calls and answer per row."""

    def __init__(self, *, many_error: Exception | None = None, delay: float = 0.01) -> None:
        self.ones: list[tuple[Any, ...]] = []
        self.manys: list[list[tuple[Any, ...]]] = []
        self.many_error = many_error
        self.delay = delay

    async def one(self, row: tuple[Any, ...]) -> Any:
        self.ones.append(row)
        await asyncio.sleep(self.delay)
        if row[1] == "bad":
            raise ValueError(f"row {row[0]} is bad")
        return f"one:{row[0]}"

    async def many(self, rows: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        self.manys.append(list(rows))
        await asyncio.sleep(self.delay)
        if self.many_error is not None or any(r[1] == "bad" for r in rows):
            raise self.many_error or RuntimeError("statement rejected")
        return {r[0]: f"many:{r[0]}" for r in rows}


async def test_an_append_alone_runs_at_once_without_batching() -> None:
    rec = Recorder()
    batcher = AppendBatcher(rec.one, rec.many, max_inflight=2)
    assert await batcher.submit(("a", "ok")) == "one:a"
    assert rec.manys == [] and rec.ones == [("a", "ok")]


async def test_concurrent_appends_share_statements() -> None:
    rec = Recorder()
    batcher = AppendBatcher(rec.one, rec.many, max_inflight=2)
    results = await asyncio.gather(*(batcher.submit((f"s{i}", "ok")) for i in range(20)))
    assert len(rec.ones) + sum(len(b) for b in rec.manys) == 20
    assert len(rec.ones) + len(rec.manys) < 20  # fewer statements than appends
    assert {r.split(":")[1] for r in results} == {f"s{i}" for i in range(20)}
    assert batcher.batches == len(rec.manys) > 0


async def test_a_rejected_batch_lets_every_row_answer_for_itself() -> None:
    rec = Recorder()
    batcher = AppendBatcher(rec.one, rec.many, max_inflight=1)
    first = asyncio.ensure_future(batcher.submit(("s0", "ok")))
    await asyncio.sleep(0)
    rest = [
        asyncio.ensure_future(batcher.submit((f"s{i}", "bad" if i == 2 else "ok")))
        for i in range(1, 4)
    ]
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    assert isinstance(results[2], ValueError) and "s2" in str(results[2])
    assert [r for i, r in enumerate(results) if i != 2] == ["one:s0", "one:s1", "one:s3"]


async def test_a_batch_that_may_have_committed_is_not_retried_row_by_row() -> None:
    lost = ConnectionResetError("reply lost after commit")
    rec = Recorder(many_error=lost)
    batcher = AppendBatcher(
        rec.one,
        rec.many,
        max_inflight=1,
        rolled_back=lambda exc: not isinstance(exc, ConnectionResetError),
    )
    first = asyncio.ensure_future(batcher.submit(("s0", "ok")))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(batcher.submit((f"s{i}", "ok"))) for i in range(1, 4)]
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    assert results[0] == "one:s0"
    assert all(r is lost for r in results[1:])
    assert rec.ones == [("s0", "ok")]  # no row re-run: it may be in the ledger already


async def test_a_cancelled_queued_append_is_never_sent() -> None:
    rec = Recorder(delay=0.05)
    batcher = AppendBatcher(rec.one, rec.many, max_inflight=1)
    first = asyncio.ensure_future(batcher.submit(("s0", "ok")))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(batcher.submit(("s1", "ok")))
    await asyncio.sleep(0)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert await first == "one:s0"
    await batcher.wait_idle()
    sent = rec.ones + [r for b in rec.manys for r in b]
    assert ("s1", "ok") not in sent
