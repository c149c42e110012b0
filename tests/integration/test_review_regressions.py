"""Regressions for defects an independent review reproduced (one test each)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from contextledger import (
    ConcurrencyError,
    InvalidArgument,
    InvalidMessage,
    Ledger,
)
from contextledger.events import GENESIS_HASH, MessageAppended, make_event
from contextledger.ledger.store import verify_chain
from contextledger.units import NO_RESULT_TEXT


async def test_summary_after_set_messages_keeps_the_preserved_tail(ledger: Ledger) -> None:
    """All messages of one messages.replaced event share a seq: the range needs parts."""
    session = await ledger.session("restored", config={
        "summarizer": {"preserve_recent_turns": 2, "min_messages": 3}})
    restored = [{"role": "system", "content": "rules"}]
    for i in range(8):
        restored += [{"role": "user", "content": f"q{i} " + "x " * 40},
                     {"role": "assistant", "content": f"a{i} " + "y " * 40}]
    await session.set_messages(restored)
    saved = await session.compact("summarize")
    view = await session.view()
    assert view[0] == {"role": "system", "content": "rules"}
    assert view[-4:] == restored[-4:]  # the two preserved turns
    assert len(view) == 1 + 1 + 4
    assert saved > 0
    assert all(r.ok for r in await ledger.rebuild("restored"))
    assert await session.view_at(session.head) == view


async def test_verify_is_not_fooled_by_a_concurrent_writer(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as writer_ledger, Ledger.open(pg_dsn) as auditor:
        session = await writer_ledger.session("live")
        stop = asyncio.Event()

        async def write() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                await session.add_message({"role": "user", "content": str(i)})

        task = asyncio.create_task(write())
        try:
            reports = [await auditor.verify("live") for _ in range(30)]
        finally:
            stop.set()
            await task
        assert all(r.ok for r in reports), [r for r in reports if not r.ok][:1]


async def test_close_returns_while_appends_are_in_flight(pg_dsn: str) -> None:
    ledger = await Ledger.open(pg_dsn)
    sessions = [await ledger.session(f"busy-{i}") for i in range(6)]

    async def write(session: Any) -> None:
        for i in range(200):
            try:
                await session.add_message({"role": "user", "content": str(i)})
            except Exception:  # the ledger closes under us: that is the point
                return

    tasks = [asyncio.create_task(write(s)) for s in sessions]
    await asyncio.sleep(0.05)
    await asyncio.wait_for(ledger.close(), 10)
    await asyncio.gather(*tasks)


def test_verify_hashes_with_the_stored_version_not_the_code_version() -> None:
    """A future schema bump must not make every older event look tampered with."""

    class MessageAppendedV2(MessageAppended):
        VERSION: ClassVar[int] = 2

    at = datetime(2026, 11, 21, tzinfo=UTC)
    event = make_event("s", 1, MessageAppended({"role": "user", "content": "hi"}, 3),
                       GENESIS_HASH, created_at=at)
    read_back = replace(event, payload=MessageAppendedV2(**event.payload.__dict__),
                        stored_version=1, data=event.payload.to_data())
    assert read_back.version == 1
    assert verify_chain("s", [read_back], 1, event.hash).ok


async def test_another_writer_answering_a_call_is_not_marked_unanswered(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as one, Ledger.open(pg_dsn) as two:
        a = await one.session("shared")
        await a.add_message({"role": "user", "content": "weather?"})
        await a.add_message({"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "weather", "arguments": "{}"}}]})
        b = await two.session("shared", create=False)
        await b.add_message({"role": "tool", "tool_call_id": "call_1", "content": "sunny"})
        await a.add_message({"role": "assistant", "content": "It is sunny."})
        tools = [m for m in await a.get_messages() if m["role"] == "tool"]
        assert tools == [{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


async def test_a_rejected_append_keeps_the_open_call_for_the_next(ledger: Ledger) -> None:
    session = await ledger.session("open-call")
    await session.add_message({"role": "user", "content": "go"})
    await session.add_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
    with pytest.raises(ConcurrencyError):
        await session.add_message({"role": "user", "content": "x"}, expected_seq=1)
    await session.add_message({"role": "user", "content": "moving on"})
    messages = await session.get_messages()
    assert messages[2]["content"] == NO_RESULT_TEXT and messages[3]["content"] == "moving on"


async def test_session_call_with_a_bad_model_writes_nothing(ledger: Ledger) -> None:
    session = await ledger.session("atomic", config={"keep_recent": 4})
    head = session.head
    with pytest.raises(InvalidArgument):
        await ledger.session("atomic", config={"keep_recent": 8}, model="bad\ud800")
    assert (await ledger.session("atomic")).head == head


async def test_token_counts_beyond_the_column_are_rejected(ledger: Ledger) -> None:
    session = await ledger.session("huge", config={"token_counter": "chars:0.001"})
    with pytest.raises(InvalidMessage) as err:
        await session.add_message({"role": "user", "content": "x" * 2_500_000})
    assert err.value.details["field"] == "tokens"
    assert session.head == 1


async def test_rollback_brings_back_the_counter_of_the_model(ledger: Ledger) -> None:
    session = await ledger.session("counter", model="gpt-4o")
    before = session.counter.name
    cp = await session.checkpoint("before-switch")
    await session.set_model("claude-sonnet-4-20250514")
    assert session.counter.name != before
    await session.rollback(cp)
    assert session.model == "gpt-4o"
    assert session.counter.name == before
    assert (await ledger.session("counter")).counter.name == before


@pytest.mark.parametrize("call", [
    lambda led, s: led.session("meta", metadata=[1]),
    lambda led, s: led.session("\ud800"),
    lambda led, s: s.record_summary(2, 2, "sum", audit=[1]),
    lambda led, s: s.add_message({"role": "user", "content": "n", "n": 10**5000}),
    lambda led, s: s.add_message({"role": "assistant", "content": None,
                                  "tool_calls": [{"id": "c1", "function": 5}]}),
    lambda led, s: s.add_message({"role": "user", "content": "k"}, idempotency_key="\ud800"),
    lambda led, s: s.checkpoint("\ud800"),
    lambda led, s: s.usage(max_tokens="x"),
    lambda led, s: s.usage(model=5),
    lambda led, s: s.view_at(2**70),
])
async def test_bad_arguments_raise_typed_errors_and_write_nothing(
    ledger: Ledger, call: Any
) -> None:
    session = await ledger.session("typed")
    await session.add_message({"role": "user", "content": "one"})
    with pytest.raises((InvalidArgument, InvalidMessage)):
        await call(ledger, session)
    assert [e.seq async for e in session.events()] == [1, 2]


async def test_callers_cannot_rewrite_history_through_returned_views(ledger: Ledger) -> None:
    session = await ledger.session("alias")
    await session.add_message({"role": "user", "content": [{"type": "text", "text": "orig"}]})
    for got in (await session.view(), await session.get_messages()):
        got[0]["content"][0]["text"] = "MUTATED"
    items = await session.view_items()
    items[0].message["content"][0]["text"] = "MUTATED"
    assert (await session.view())[0]["content"][0]["text"] == "orig"
    event = [e async for e in session.events()][-1]
    assert event.payload.message["content"][0]["text"] == "orig"
    assert (await session.verify()).ok


# -- second review: group commit, hot path, canonical encoding ---------------------------


class F(float):
    """A float subclass, as numpy.float64 is."""


async def test_float_subclasses_hash_as_plain_floats(ledger: Ledger) -> None:
    session = await ledger.session("fsub")
    await session.add_message({"role": "user", "content": "score", "score": F(3.0)})
    assert (await session.verify()).ok
    await session.add_message({"role": "user", "content": "w", "weight": 1.0, "n": [2.0]})
    got = (await session.view())[-1]
    assert type(got["weight"]) is float and type(got["n"][0]) is float  # not 1 / 2
    assert (await session.verify()).ok


async def _hold(dsn: str, ids: list[str]) -> tuple[Any, Any]:
    import asyncpg

    from contextledger.ledger.dsn import asyncpg_dsn

    blocker = await asyncpg.connect(asyncpg_dsn(dsn))
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute("SELECT 1 FROM contextledger.sessions WHERE session_id = ANY($1)"
                          " FOR UPDATE", ids)
    return blocker, tx


async def test_batches_from_two_processes_do_not_deadlock(pg_dsn: str) -> None:
    from contextledger.events import MessageAppended, make_event

    async with Ledger.open(pg_dsn) as h1, Ledger.open(pg_dsn) as h2:
        ids = [f"d{i:03d}" for i in range(400)]  # enough rows for an index nested loop
        for sid in ids:
            await h1.session(sid)
        await h1.store._pool.execute("ANALYZE contextledger.sessions")  # type: ignore[attr-defined]

        async def row(store: Any, sid: str) -> tuple[Any, ...]:
            info = await store.session_info(sid)
            e = make_event(sid, info.head + 1, MessageAppended({"role": "user", "content": "x"}, 1),
                           info.last_hash, created_at=datetime.now(UTC))
            assert e.encoded is not None
            return (sid, e.seq, e.version, e.encoded.decode(), e.tokens, e.created_at, None, e.hash)

        for trial in range(3):
            a, b = ids[2 * trial], ids[2 * trial + 1]
            r1 = [await row(h1.store, a), await row(h1.store, b)]
            r2 = [await row(h2.store, b), await row(h2.store, a)]
            blocker, tx = await _hold(pg_dsn, [a, b])
            try:
                f1 = asyncio.ensure_future(h1.store._append_many(r1))  # type: ignore[attr-defined]
                f2 = asyncio.ensure_future(h2.store._append_many(r2))  # type: ignore[attr-defined]
                await asyncio.sleep(0.2)
                await tx.commit()
                results = await asyncio.gather(f1, f2, return_exceptions=True)
            finally:
                await blocker.close()
            assert not any(isinstance(r, BaseException) for r in results), results
            assert results[0] == {a: 1, b: 1} or results[1] == {a: 1, b: 1}


async def test_a_cancelled_queued_append_is_never_written(pg_dsn: str) -> None:
    from contextledger.events import MessageAppended

    async with Ledger.open(pg_dsn) as ledger:
        store: Any = ledger.store
        for sid in ("cx", "cy", "ca"):
            await ledger.session(sid)
        blocker, tx = await _hold(pg_dsn, ["cx", "cy"])

        def msg(text: str) -> list[Any]:
            return [MessageAppended({"role": "user", "content": text}, 1)]

        try:  # two appends stuck on row locks fill the batcher's in-flight slots
            slow = [asyncio.ensure_future(
                store.append(s, msg("slow"), created_at=datetime.now(UTC))) for s in ("cx", "cy")]
            await asyncio.sleep(0.1)
            with pytest.raises(TimeoutError):  # queued behind them, then given up on
                await asyncio.wait_for(store.append("ca", msg("hello"),
                                                    created_at=datetime.now(UTC)), 0.2)
            retry = asyncio.ensure_future(store.append("ca", msg("hello"),
                                                       created_at=datetime.now(UTC)))
            await asyncio.sleep(0.1)
            await tx.commit()
            await asyncio.gather(*slow)
            assert (await retry).seq == 2
        finally:
            await blocker.close()
        texts = [(e.seq, e.payload.message["content"]) async for e in store.read_events("ca")
                 if e.seq > 1]
        assert texts == [(2, "hello")]


async def test_close_answers_queued_appends_and_returns(pg_dsn: str) -> None:
    from contextledger.events import MessageAppended

    ledger = await Ledger.open(pg_dsn)
    store: Any = ledger.store
    for sid in ("kx", "ky", "ka", "kb"):
        await ledger.session(sid)
    blocker, tx = await _hold(pg_dsn, ["kx", "ky"])
    msg = [MessageAppended({"role": "user", "content": "m"}, 1)]
    try:
        tasks = [asyncio.ensure_future(store.append(s, msg, created_at=datetime.now(UTC)))
                 for s in ("kx", "ky", "ka", "kb")]
        await asyncio.sleep(0.1)
        closing = asyncio.ensure_future(ledger.close())
        await asyncio.sleep(0.1)
        await tx.commit()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.wait_for(closing, 10)
    finally:
        await blocker.close()
    assert [r.seq for r in results] == [2, 2, 2, 2]  # type: ignore[union-attr]
    assert store._lent == 0


async def test_request_state_notices_a_view_rewritten_by_another_process(pg_dsn: str) -> None:
    """Turns this process dropped ephemerally must come back when another process rolls
    the view back to a point where they fit again."""
    async with Ledger.open(pg_dsn) as one, Ledger.open(pg_dsn) as two:
        a = await one.session("stale", config={"token_counter": "chars"})
        for i in range(20):
            await a.add_message({"role": "user" if i % 2 == 0 else "assistant",
                                 "content": f"turn {i} " + "word " * 40})
        budget = (await a.get_token_count()) // 2
        first = await a.get_messages_for_request(token_budget=budget)
        assert len(first) < 20  # this process dropped old turns, ephemerally
        b = await two.session("stale", create=False)
        await b.rollback(9)  # seqs 2..9: the first 8 turns, which fit the budget
        sent = await a.get_messages_for_request(token_budget=budget)
        assert sent == await b.view()
        assert len(sent) == 8
