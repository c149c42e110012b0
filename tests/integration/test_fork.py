"""Forks (copy-on-write) through the public API, on both stores (PostgreSQL and memory://)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger import (
    CheckpointNotFound,
    InvalidArgument,
    Ledger,
    SeqOutOfRange,
    Session,
    SessionExists,
    SessionHasForks,
    SessionNotFound,
)
from contextledger.core.events import SessionForked
from contextledger.core.projection import fold
from contextledger.store.dsn import asyncpg_dsn
from contextledger.store.sealing import KeyRing
from tests.integration.conftest import dsn_for
from tests.integration.test_projection_property import apply_op, op
from tests.integration.test_recall import FACT, QUESTION, chatter, recall_blocks

_ids = itertools.count()


def rows(items: Any) -> list[tuple[Any, ...]]:
    return [(i.ref, i.ord, i.kind, dict(i.message), i.tokens, i.critical) for i in items]


async def events_of(session: Session) -> list[Any]:
    return [e async for e in session.events()]


async def talk(session: Session, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        role = "user" if i % 2 == 0 else "assistant"
        await session.add_message({"role": role, "content": f"turn {i} of {session.session_id}"})


async def test_a_fork_at_the_head_stands_on_the_parent(ledger: Ledger) -> None:
    parent = await ledger.session("p", model="gpt-4o")
    await talk(parent, 6)
    fork = await parent.fork("f")
    seq = parent.head
    assert fork.head == seq + 1 and fork.parent == ("p", seq)
    assert await fork.view() == await parent.view_at(seq) == await parent.view()
    assert rows(await fork.view_items()) == rows(await parent.view_items())
    assert await fork.get_messages() == await parent.get_messages()
    assert fork.model == "gpt-4o"
    events = await events_of(fork)
    # seqs 1..seq are the parent's own events (nothing copied), then the pointer event
    assert [e.session_id for e in events] == ["p"] * seq + ["f"]
    assert events[:seq] == await events_of(parent)
    forked = events[-1].payload
    assert isinstance(forked, SessionForked)
    assert (forked.parent_session_id, forked.parent_seq) == ("p", seq)
    assert forked.parent_hash == events[seq - 1].hash
    assert (await fork.verify()).ok and (await parent.verify()).ok
    assert await ledger.forks("p") == ["f"]


async def test_the_parent_and_the_fork_go_on_apart(ledger: Ledger) -> None:
    parent = await ledger.session("apart")
    await talk(parent, 4)
    before = await parent.view()
    fork = await ledger.fork("apart", "apart-2")
    await talk(parent, 3, start=100)
    await parent.checkpoint("later")
    await parent.compact("truncate", token_budget=20)
    await talk(fork, 2, start=200)
    fork_view = await fork.view()
    assert fork_view[:4] == before and len(fork_view) == 6
    assert "turn 200 of apart-2" in str(fork_view) and "turn 100" not in str(fork_view)
    assert "turn 200" not in str(await parent.get_messages())
    reopened = await ledger.session("apart-2", create=False)
    assert await reopened.view() == fork_view
    assert await reopened.get_messages() == fork_view
    for s in (parent, fork):
        events = await events_of(s)
        assert rows(await s.view_items()) == rows(fold(events).view)
        assert (await s.verify()).ok
        assert all(r.ok for r in await ledger.rebuild(s.session_id))


async def test_a_fork_at_a_checkpoint_label_seq_or_object(ledger: Ledger) -> None:
    parent = await ledger.session("cp")
    await talk(parent, 3)
    mark = await parent.checkpoint("mark")
    await talk(parent, 3, start=10)
    await parent.compact("truncate", token_budget=15)  # the parent's rows move on
    await parent.rollback(2)
    for n, at in enumerate(["mark", mark, mark.seq, 2]):
        seq = at if isinstance(at, int) else mark.seq
        fork = await parent.fork(f"cp-{n}", at)
        assert fork.parent == ("cp", seq)
        assert await fork.view() == await parent.view_at(seq)
        assert await fork.get_messages() == [
            dict(i.message) for i in fold((await events_of(parent))[:seq]).branch
        ]
        assert (await fork.verify()).ok
        await fork.add_message({"role": "user", "content": f"fork {n} goes on"})
        assert (await fork.view())[-1]["content"] == f"fork {n} goes on"
        assert all(r.ok for r in await ledger.rebuild(fork.session_id))


async def test_replay_and_rollback_across_the_fork_point(ledger: Ledger) -> None:
    parent = await ledger.session("replay")
    await talk(parent, 4)
    await parent.checkpoint("before")
    await talk(parent, 2, start=10)
    fork = await parent.fork("replay-f")
    seq = fork.parent[1] if fork.parent else 0
    await talk(fork, 3, start=20)
    for k in range(1, seq + 1):
        assert await fork.view_at(k) == await parent.view_at(k)
        assert await fork.request_at(k, token_budget=10_000) == await parent.request_at(
            k, token_budget=10_000
        )
    assert await fork.view_at(seq + 1) == await parent.view_at(seq)
    # the parent's checkpoint is one of the fork's: a rollback crosses the fork point
    assert "before" in [c.label for c in await fork.checkpoints()]
    await fork.rollback("before")
    assert await fork.view() == await parent.view_at(5)
    assert (await fork.verify()).ok
    assert all(r.ok for r in await ledger.rebuild("replay-f"))
    await talk(fork, 1, start=30)
    assert (await fork.view())[-1]["content"] == "turn 30 of replay-f"


async def test_a_fork_of_a_fork(ledger: Ledger) -> None:
    a = await ledger.session("a")
    await talk(a, 3)
    b = await a.fork("b")
    await talk(b, 3, start=10)
    c = await b.fork("c")
    await talk(c, 2, start=20)
    assert [e.session_id for e in await events_of(c)] == ["a"] * 4 + ["b"] * 4 + ["c"] * 3
    assert (await c.view())[:6] == await b.view()
    assert (await c.verify()).ok
    assert all(r.ok for r in await ledger.rebuild("c"))
    # a fork at a seq the parent itself stands on is a fork of the ancestor holding it
    d = await c.fork("d", 2)
    assert d.parent == ("a", 2)
    assert await d.view() == await a.view_at(2)
    assert await ledger.forks("a") == ["b", "d"] and await ledger.forks("b") == ["c"]


async def test_recall_in_a_fork_finds_the_parent_prefix(ledger: Ledger) -> None:
    """A fact said before the fork point, left out of the fork's request, comes back from
    the parent's events; a fact the parent learnt after the fork does not."""
    parent = await ledger.session("rp", config={"token_counter": "chars"})
    await parent.add_message({"role": "user", "content": FACT})
    await parent.add_message({"role": "assistant", "content": "Noted."})
    await chatter(parent, 10)
    fork = await parent.fork("rp-fork")
    await parent.add_message({"role": "user", "content": "orchard-api staging now uses 29999"})
    await chatter(fork, 30, start=100)
    await fork.add_message({"role": "user", "content": QUESTION})
    request = await fork.get_messages_for_request(token_budget=2000)
    blocks = recall_blocks(request)
    assert len(blocks) == 1 and "18443" in blocks[0] and "29999" not in str(request)
    assert await fork.request_at(fork.head, token_budget=2000) == request


async def test_recall_in_a_fork_brings_a_tool_unit_whole(ledger: Ledger) -> None:
    """A match in the fork's own part that is a tool call comes with its result (the
    unit's messages read from the session of the lineage holding each: the fork's own
    part once recursed into itself without end)."""
    parent = await ledger.session("rt", config={"token_counter": "chars"})
    await parent.add_message({"role": "user", "content": "hello"})
    fork = await parent.fork("rt-fork")
    call = {"id": "c1", "type": "function"}
    call["function"] = {"name": "lookup", "arguments": '{"q": "orchard gateway port"}'}
    await fork.add_message({"role": "assistant", "content": None, "tool_calls": [call]})
    await fork.add_message({"role": "tool", "tool_call_id": "c1", "content": "port 18443"})
    await chatter(fork, 40)
    await fork.add_message({"role": "user", "content": "which orchard gateway port?"})
    request = await fork.get_messages_for_request(token_budget=2000)
    blocks = recall_blocks(request)
    assert len(blocks) == 1 and "lookup" in blocks[0] and "18443" in blocks[0]
    assert await fork.request_at(fork.head, token_budget=2000) == request


async def test_a_parent_with_forks_is_not_purged(ledger: Ledger) -> None:
    parent = await ledger.session("old")
    await talk(parent, 2)
    await parent.fork("old-1")
    await parent.fork("old-2")
    with pytest.raises(SessionHasForks) as refused:
        await ledger.store.purge("old", "retention")  # type: ignore[attr-defined]
    assert refused.value.details["forks"] == ["old-1", "old-2"]
    assert (await parent.verify()).ok  # nothing went
    await ledger.store.purge("old-1", "retention")  # type: ignore[attr-defined]
    await ledger.store.purge("old-2", "retention")  # type: ignore[attr-defined]
    assert await ledger.forks("old") == []
    await ledger.store.purge("old", "retention")  # type: ignore[attr-defined]
    with pytest.raises(SessionNotFound):
        await ledger.session("old", create=False)


async def test_bad_forks_are_refused_and_write_nothing(ledger: Ledger) -> None:
    parent = await ledger.session("src")
    await talk(parent, 2)
    await ledger.session("taken")
    with pytest.raises(SessionExists):
        await parent.fork("taken")
    with pytest.raises(InvalidArgument):
        await parent.fork("f1", 99)
    with pytest.raises(InvalidArgument):
        await parent.fork("f1", 0)
    with pytest.raises(CheckpointNotFound):
        await parent.fork("f1", "no such label")
    with pytest.raises(InvalidArgument):
        await parent.fork("", None)
    with pytest.raises(InvalidArgument):
        await ledger.fork("src", "f1", metadata="not a dict")  # type: ignore[arg-type]
    with pytest.raises(SessionNotFound):
        await ledger.fork("nobody", "f1")
    with pytest.raises(SeqOutOfRange):
        await ledger.store.fork_session(
            "f1", "src", 7, created_at=parent._state.info.created_at, metadata={}
        )
    with pytest.raises(SessionNotFound):
        await ledger.session("f1", create=False)
    assert await ledger.forks("src") == []
    assert parent.head == (await ledger.session("src")).head == 3


async def test_a_tampered_parent_prefix_fails_the_forks_verify(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    parent = await pg_ledger.session("t")
    await talk(parent, 4)
    fork = await parent.fork("t-f")
    await talk(fork, 2, start=10)
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        async with conn.transaction():
            await conn.execute("ALTER TABLE contextledger.events DISABLE TRIGGER USER")
            await conn.execute(
                "UPDATE contextledger.events SET data = jsonb_set(data, '{message,content}',"
                " '\"forged\"') WHERE session_id = 't' AND seq = 3"
            )
            await conn.execute("ALTER TABLE contextledger.events ENABLE TRIGGER USER")
    finally:
        await conn.close()
    report = await fork.verify()
    assert not report.ok and report.first_bad_seq == 3
    assert not (await parent.verify()).ok


async def apply_ops(session: Session, ops: list[Any]) -> None:
    for step in ops:
        await apply_op(session, step)


async def check(ledger: Ledger, session: Session) -> None:
    events = await events_of(session)
    assert [e.seq for e in events] == list(range(1, session.head + 1))
    folded = fold(events)
    assert rows(await session.view_items()) == rows(folded.view)
    assert await session.get_messages() == [dict(i.message) for i in folded.branch]
    assert await session.get_token_count() == folded.view_tokens
    assert (await session.verify()).ok
    assert all(r.ok for r in await ledger.rebuild(session.session_id))


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    before=st.lists(op, max_size=12),
    at=st.floats(0, 1),
    parent_after=st.lists(op, max_size=8),
    fork_after=st.lists(op, max_size=8),
)
async def test_a_fork_is_the_parent_as_of_its_seq_whatever_happens_after(
    ledger: Ledger, before: list[Any], at: float, parent_after: list[Any], fork_after: list[Any]
) -> None:
    n = next(_ids)
    parent = await ledger.session(f"prop-{n}")
    await apply_ops(parent, before)
    seq = 1 + int(at * (parent.head - 1))
    expected = rows(fold((await events_of(parent))[:seq]).view)
    fork = await parent.fork(f"prop-{n}-fork", seq)
    assert rows(await fork.view_items()) == expected
    await apply_ops(parent, parent_after)
    assert rows(fold((await events_of(fork))[: seq + 1]).view) == expected
    await apply_ops(fork, fork_after)
    assert rows(fold((await events_of(fork))[: seq + 1]).view) == expected
    for s in (parent, fork):
        await check(ledger, s)


async def test_migration_0012_downgrades_only_without_forks(pg_dsn: str) -> None:
    from alembic import command

    from contextledger.store.migrate import alembic_config, upgrade

    async with Ledger.open(pg_dsn) as ledger:
        parent = await ledger.session("m")
        await talk(parent, 2)
        await parent.fork("m-fork")
    with pytest.raises(Exception, match="forks exist"):
        await asyncio.to_thread(command.downgrade, alembic_config(pg_dsn), "0011")
    async with Ledger.open(pg_dsn) as ledger:
        await ledger.store.purge("m-fork", "test")  # type: ignore[attr-defined]
    await asyncio.to_thread(command.downgrade, alembic_config(pg_dsn), "0011")
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        columns = await conn.fetchval(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema ="
            " 'contextledger' AND table_name = 'sessions' AND column_name LIKE 'parent%'"
        )
        assert columns == 0
        assert await conn.fetchval("SELECT to_regclass('contextledger.sessions_forks')") is None
    finally:
        await conn.close()
    await upgrade(pg_dsn)
    async with Ledger.open(pg_dsn) as ledger:
        again = await ledger.fork("m", "m-fork-2")
        assert again.parent == ("m", 3) and (await again.verify()).ok


@pytest_asyncio.fixture(params=["postgres", "memory"])
async def sealed(request: pytest.FixtureRequest) -> AsyncIterator[Ledger]:
    """Both stores with a key-encryption key: every session sealed under its own key."""
    dsn = "memory://"
    if request.param == "postgres":
        dsn = dsn_for(request.getfixturevalue("postgresql"))
    async with Ledger.open(dsn, keyring=KeyRing(bytes(range(32)))) as led:
        yield led


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    before=st.lists(op, max_size=10),
    at=st.floats(0, 1),
    fork_after=st.lists(op, max_size=6),
    again=st.floats(0, 1),
    grand_after=st.lists(op, max_size=4),
)
async def test_a_sealed_lineage_reads_as_its_events_fold(
    sealed: Ledger,
    before: list[Any],
    at: float,
    fork_after: list[Any],
    again: float,
    grand_after: list[Any],
) -> None:
    """Sealed: each part of a lineage opened with its owner's key, whatever the ops (a
    replacement's parts, summaries, rollbacks) and wherever the forks stand."""
    n = next(_ids)
    parent = await sealed.session(f"sealed-{n}")
    await apply_ops(parent, before)
    seq = 1 + int(at * (parent.head - 1))
    fork = await parent.fork(f"sealed-{n}-f", seq)
    assert rows(await fork.view_items()) == rows(fold((await events_of(parent))[:seq]).view)
    await apply_ops(fork, fork_after)
    grand = await fork.fork(f"sealed-{n}-f-f", 1 + int(again * (fork.head - 1)))
    await apply_ops(grand, grand_after)
    for s in (parent, fork, grand):
        await check(sealed, s)


async def test_a_fork_purged_and_made_again_elsewhere_reads_as_it_is_now(pg_dsn: str) -> None:
    """This process remembers a fork's ancestry; another purges the fork and makes a plain
    session under its id: this process's view read is the new session's, not the new
    events stitched onto the old parent's prefix."""
    async with Ledger.open(pg_dsn) as one, Ledger.open(pg_dsn) as two:
        parent = await one.session("lp")
        await parent.add_message({"role": "user", "content": "the parent's text"})
        await one.fork("lp", "lx")
        assert "the parent's text" in str(await one.store.read_view("lx"))
        assert await two.store.purge("lx", "test") == 3  # type: ignore[attr-defined]
        again = await two.session("lx")
        await again.add_message({"role": "user", "content": "a new lx"})
        view = await one.store.read_view("lx")
        assert [i.message["content"] for i in view] == ["a new lx"]
