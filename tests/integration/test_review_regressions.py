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
