"""What only a real PostgreSQL can show: concurrency, tampering, crashes, migrations."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from contextledger import (
    ConcurrencyError,
    Ledger,
    MigrationRequired,
)
from contextledger.core.chain import make_event
from contextledger.core.events import MessageAppended
from contextledger.store.dsn import asyncpg_dsn


async def sql(dsn: str, query: str, *args: Any) -> Any:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


async def test_fifty_concurrent_appenders_on_separate_connections(pg_dsn: str) -> None:
    """Five ledger handles (five pools, five caches) race on one session."""
    ledgers = [await Ledger.open(pg_dsn) for _ in range(5)]
    try:
        sessions = [await led.session("race") for led in ledgers]

        async def one(i: int) -> int | None:
            return await sessions[i % 5].add_message({"role": "user", "content": f"m{i}"})

        seqs = await asyncio.gather(*(one(i) for i in range(50)))
        assert sorted(s for s in seqs if s is not None) == list(range(2, 52))
        rows = await sql(
            pg_dsn,
            "SELECT seq FROM contextledger.events WHERE session_id = 'race' ORDER BY seq",
        )
        assert [r[0] for r in rows] == list(range(1, 52))
        report = await ledgers[0].verify("race")
        assert report.ok, report
        assert all(r.ok for r in await ledgers[0].rebuild("race"))
    finally:
        for led in ledgers:
            await led.close()


async def test_twenty_appends_with_same_expected_seq_one_wins(pg_dsn: str) -> None:
    ledgers = [await Ledger.open(pg_dsn) for _ in range(4)]
    try:
        sessions = [await led.session("occ") for led in ledgers]
        head = sessions[0].head

        async def one(i: int) -> str:
            try:
                await sessions[i % 4].add_message(
                    {"role": "user", "content": str(i)}, expected_seq=head
                )
                return "ok"
            except ConcurrencyError:
                return "conflict"

        outcomes = await asyncio.gather(*(one(i) for i in range(20)))
        assert outcomes.count("ok") == 1
        assert outcomes.count("conflict") == 19
        rows = await sql(
            pg_dsn, "SELECT count(*) FROM contextledger.events WHERE session_id = 'occ'"
        )
        assert rows[0][0] == 2
    finally:
        for led in ledgers:
            await led.close()


async def test_appends_to_different_sessions_do_not_block_each_other(pg_dsn: str) -> None:
    """A transaction holding one session's row must not stall another session's append."""
    async with Ledger.open(pg_dsn) as ledger:
        a = await ledger.session("a")
        b = await ledger.session("b")
        blocker = await asyncpg.connect(asyncpg_dsn(pg_dsn))
        try:
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute(
                "SELECT * FROM contextledger.sessions WHERE session_id = 'a' FOR UPDATE"
            )
            seq = await asyncio.wait_for(b.add_message({"role": "user", "content": "free"}), 10)
            assert seq == 2
            pending = asyncio.create_task(a.add_message({"role": "user", "content": "waits"}))
            await asyncio.sleep(0.3)
            assert not pending.done()  # a's append really waits for a's row lock ...
            await tx.rollback()
            assert await asyncio.wait_for(pending, 10) == 2  # ... and then goes through
        finally:
            await blocker.close()


async def test_database_rejects_update_delete_truncate(pg_ledger: Ledger, pg_dsn: str) -> None:
    session = await pg_ledger.session("ro")
    await session.add_message({"role": "user", "content": "keep me"})
    for stmt in (
        "UPDATE contextledger.events SET tokens = 0",
        "DELETE FROM contextledger.events",
        "TRUNCATE contextledger.events CASCADE",
    ):
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await sql(pg_dsn, stmt)
    assert (await pg_ledger.verify("ro")).ok


async def test_tampering_by_superuser_is_caught_by_verify(pg_ledger: Ledger, pg_dsn: str) -> None:
    session = await pg_ledger.session("tamper")
    for i in range(6):
        await session.add_message({"role": "user", "content": f"fact {i}"})
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        async with conn.transaction():
            await conn.execute("ALTER TABLE contextledger.events DISABLE TRIGGER USER")
            await conn.execute(
                "UPDATE contextledger.events SET data = jsonb_set(data, '{message,content}',"
                " '\"fact FORGED\"') WHERE session_id = 'tamper' AND seq = 4"
            )
            await conn.execute("ALTER TABLE contextledger.events ENABLE TRIGGER USER")
    finally:
        await conn.close()
    report = await pg_ledger.verify("tamper")
    assert not report.ok
    assert report.first_bad_seq == 4
    assert "hash" in (report.reason or "")


async def test_rebuild_reports_and_repairs_a_damaged_projection(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    session = await pg_ledger.session("dmg")
    for i in range(4):
        await session.add_message({"role": "user", "content": f"m{i}"})
    await session.record_summary(2, 3, "m0 and m1")
    good = await session.view()
    await sql(pg_dsn, "DELETE FROM contextledger.view_items WHERE session_id = 'dmg' AND seq = 5")
    await sql(
        pg_dsn,
        "UPDATE contextledger.view_items SET tokens = 999 WHERE session_id = 'dmg' AND seq = 4",
    )
    assert await session.view() != good
    [report] = await pg_ledger.rebuild("dmg")
    assert not report.ok and report.repaired
    assert any("view" in d for d in report.differences)
    assert await session.view() == good
    [again] = await pg_ledger.rebuild()
    assert again.ok


async def test_purge_is_the_one_audited_way_out(pg_ledger: Ledger, pg_dsn: str) -> None:
    session = await pg_ledger.session("gdpr")
    await session.add_message({"role": "user", "content": "forget me"})
    with pytest.raises(asyncpg.RaiseError, match="reason"):
        await sql(pg_dsn, "SELECT contextledger.purge_session('gdpr', ' ')")
    store: Any = pg_ledger.store
    assert await store.purge("gdpr", "user request #42") == 2
    assert await pg_ledger.sessions() == []
    rows = await sql(pg_dsn, "SELECT session_id, reason, events FROM contextledger.purges")
    assert [tuple(r) for r in rows] == [("gdpr", "user request #42", 2)]


@pytest.mark.usefixtures("serial_migrations")
async def test_unmigrated_database_gives_a_clear_error(postgresql: Any, pg_dsn: str) -> None:
    postgresql.autocommit = True
    name = f"cl_empty_{uuid.uuid4().hex[:8]}"  # parallel runs on one server: its own
    postgresql.execute(f"CREATE DATABASE {name}")
    empty = pg_dsn.replace(f"/{postgresql.info.dbname}?", f"/{name}?")
    try:
        with pytest.raises(MigrationRequired, match="contextledger migrate"):
            await Ledger.open(empty)
        async with Ledger.open(empty, migrate=True) as ledger:
            session = await ledger.session("fresh")
            assert await session.add_message({"role": "user", "content": "hi"}) == 2
    finally:
        postgresql.execute(f"DROP DATABASE {name} WITH (FORCE)")


async def test_killing_a_writer_mid_append_leaves_no_partial_event(pg_dsn: str) -> None:
    script = textwrap.dedent(f"""
        import asyncio
        from contextledger import Ledger
        async def main():
            ledger = await Ledger.open({pg_dsn!r})
            session = await ledger.session("crash")
            print("ready", flush=True)
            i = 0
            while True:
                i += 1
                await session.add_message({{"role": "user", "content": "x" * 5000 + str(i)}})
                if i % 7 == 0:
                    await session.record_summary(2, session.head, "summary " + str(i))
        asyncio.run(main())
    """)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "CONTEXTLEDGER_LOG_FORMAT": "json"},
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"ready"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = await sql(
                pg_dsn, "SELECT head FROM contextledger.sessions WHERE session_id = 'crash'"
            )
            if rows and rows[0][0] > 60:
                break
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # mid-append, most likely: it appends non-stop
        await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    async with Ledger.open(pg_dsn) as ledger:
        report = await ledger.verify("crash")
        assert report.ok, report
        assert report.events > 60
        [rebuilt] = await ledger.rebuild("crash")
        assert rebuilt.ok, rebuilt.differences
        session = await ledger.session("crash", create=False)
        assert await session.add_message({"role": "user", "content": "after"}) == report.events + 1


async def test_sessions_grow_past_int4_ord_range(pg_ledger: Ledger) -> None:
    """seq * ORD_STRIDE passes 2**31 at seq 2,148: the SQL must compute it in bigint."""
    session = await pg_ledger.session("long")
    for i in range(2_150):
        await session.add_message({"role": "user", "content": str(i)})
    assert session.head == 2_151
    assert (await session.view())[-1] == {"role": "user", "content": "2149"}
    await session.record_summary(2, 2_100, "most of it")
    assert len(await session.view()) == 1 + 51  # summary + seqs 2,101..2,151
    assert (await pg_ledger.verify("long")).ok


async def test_view_rewrites_start_a_new_generation(pg_ledger: Ledger, pg_dsn: str) -> None:
    """Appends write no view rows (the view's tail is read from the events); a summary
    materializes the view under the next generation and moves the watermark."""
    session = await pg_ledger.session("gens")
    for i in range(30):
        await session.add_message({"role": "user", "content": str(i)})
    await session.checkpoint("c")  # no view change: nothing rewritten

    async def stored() -> tuple[list[tuple[int, int]], tuple[int, int]]:
        rows = await sql(
            pg_dsn,
            "SELECT gen, count(*) FROM contextledger.view_items"
            " WHERE session_id = 'gens' GROUP BY gen",
        )
        s = await sql(
            pg_dsn,
            "SELECT view_gen, view_base FROM contextledger.sessions WHERE session_id = 'gens'",
        )
        return [tuple(r) for r in rows], tuple(s[0])

    assert await stored() == ([], (0, 0))
    assert len(await session.view()) == 30
    seq = await session.record_summary(2, 25, "early turns")
    assert await stored() == ([(1, 1 + 6)], (1, seq))
    await session.add_message({"role": "user", "content": "after"})
    assert await stored() == ([(1, 7)], (1, seq))
    assert [m["content"] for m in await session.view()][-2:] == ["29", "after"]
    assert len(await session.get_messages()) == 31


async def test_verify_is_not_fooled_by_a_concurrent_writer(pg_dsn: str) -> None:
    """Regression: verify read events and the session row at different moments."""
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
    """Regression: close() hung while appends were still in flight."""
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


async def test_batches_from_two_processes_do_not_deadlock(pg_dsn: str) -> None:
    """Regression: group-commit batches from two processes locked rows in opposite orders."""
    from contextledger.core.events import MessageAppended

    async with Ledger.open(pg_dsn) as h1, Ledger.open(pg_dsn) as h2:
        ids = [f"d{i:03d}" for i in range(400)]  # enough rows for an index nested loop
        for sid in ids:
            await h1.session(sid)
        await h1.store._pool.execute("ANALYZE contextledger.sessions")  # type: ignore[attr-defined]

        async def row(store: Any, sid: str) -> tuple[Any, ...]:
            info = await store.session_info(sid)
            e = make_event(
                sid,
                info.head + 1,
                MessageAppended({"role": "user", "content": "x"}, 1),
                info.last_hash,
                created_at=datetime.now(UTC),
            )
            assert e.encoded is not None
            return (
                sid,
                e.seq,
                e.version,
                e.encoded.decode(),
                e.tokens,
                e.created_at,
                None,
                e.hash,
                info.last_hash,  # the chain pin: the previous hash
                False,  # nothing lexed (``warm.py``)
                None,
            )

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
            appended = {a: (1, None), b: (1, None)}  # (view tokens, nothing lexed)
            assert appended in (results[0], results[1])


async def test_a_cancelled_queued_append_is_never_written(pg_dsn: str) -> None:
    """Regression: an append cancelled while queued for a batch was still written."""

    async with Ledger.open(pg_dsn) as ledger:
        store: Any = ledger.store
        for sid in ("cx", "cy", "ca"):
            await ledger.session(sid)
        blocker, tx = await _hold(pg_dsn, ["cx", "cy"])

        def msg(text: str) -> list[Any]:
            return [MessageAppended({"role": "user", "content": text}, 1)]

        try:  # two appends stuck on row locks fill the batcher's in-flight slots
            slow = [
                asyncio.ensure_future(store.append(s, msg("slow"), created_at=datetime.now(UTC)))
                for s in ("cx", "cy")
            ]
            await asyncio.sleep(0.1)
            with pytest.raises(TimeoutError):  # queued behind them, then given up on
                await asyncio.wait_for(
                    store.append("ca", msg("hello"), created_at=datetime.now(UTC)), 0.2
                )
            retry = asyncio.ensure_future(
                store.append("ca", msg("hello"), created_at=datetime.now(UTC))
            )
            await asyncio.sleep(0.1)
            await tx.commit()
            await asyncio.gather(*slow)
            assert (await retry).seq == 2
        finally:
            await blocker.close()
        texts = [
            (e.seq, e.payload.message["content"])
            async for e in store.read_events("ca")
            if e.seq > 1
        ]
        assert texts == [(2, "hello")]


async def test_close_answers_queued_appends_and_returns(pg_dsn: str) -> None:
    """Regression: close() left queued appends waiting forever."""

    ledger = await Ledger.open(pg_dsn)
    store: Any = ledger.store
    for sid in ("kx", "ky", "ka", "kb"):
        await ledger.session(sid)
    blocker, tx = await _hold(pg_dsn, ["kx", "ky"])
    msg = [MessageAppended({"role": "user", "content": "m"}, 1)]
    try:
        tasks = [
            asyncio.ensure_future(store.append(s, msg, created_at=datetime.now(UTC)))
            for s in ("kx", "ky", "ka", "kb")
        ]
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


async def _hold(dsn: str, ids: list[str]) -> tuple[Any, Any]:
    import asyncpg

    from contextledger.store.dsn import asyncpg_dsn

    blocker = await asyncpg.connect(asyncpg_dsn(dsn))
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute(
        "SELECT 1 FROM contextledger.sessions WHERE session_id = ANY($1) FOR UPDATE", ids
    )
    return blocker, tx


async def test_a_store_serving_many_sessions_holds_bounded_per_session_state(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chain tips are remembered up to MAX_HEADS (a forgotten one is read again, and the
    append still lands on the chain); a session's write lock lives only while in use."""
    import gc

    from contextledger.store import postgres
    from contextledger.store.postgres import tips

    monkeypatch.setattr(tips, "MAX_HEADS", 8)
    async with Ledger.open(pg_dsn) as ledger:
        store = ledger.store
        assert isinstance(store, postgres.PostgresStore)
        sessions = [await ledger.session(f"many-{i}", create=True) for i in range(20)]
        for s in sessions:
            await s.add_message({"role": "user", "content": "hello"})
        assert len(store._heads) <= 8
        for s in sessions:  # the first twelve were forgotten: their heads are read again
            await s.add_message({"role": "user", "content": "again"})
        for s in sessions:
            assert (await s.verify()).ok and s.head == 3
        gc.collect()
        assert len(store._locks) == 0


async def test_a_dsn_with_libpq_connect_timeout_connects_and_keeps_it(pg_dsn: str) -> None:
    """``connect_timeout`` is libpq's, in DSNs people copy: asyncpg sent it to the server
    as a setting, which refused the connection ("unrecognized configuration parameter");
    now it is asyncpg's connect timeout and the server never sees it."""
    dsn = pg_dsn + ("&" if "?" in pg_dsn else "?") + "connect_timeout=7"
    async with Ledger.open(dsn) as ledger:
        session = await ledger.session("timeout-dsn", create=True)
        assert await session.add_message({"role": "user", "content": "hi"}) == 2
        pool = ledger.store._pool  # type: ignore[attr-defined]
        assert pool._connect_kwargs["timeout"] == 7.0


async def test_every_connection_of_the_store_runs_without_jit(pg_dsn: str) -> None:
    """Where the server has JIT (most distributions' packages), a statement whose estimated
    cost passes ``jit_above_cost`` is compiled first: the recall search's generic plan
    crossed it at ~16,000 turns on PostgreSQL 15, and each search then spent ~480 ms
    compiling ~15 ms of work. The store's connections, both pools, turn it off."""
    plain = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        assert await plain.fetchval("SHOW jit") == "on"  # the server's default
    finally:
        await plain.close()
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("no-jit", create=True)
        await session.add_messages(
            [{"role": "user", "content": f"the gateway answered attempt {i}"} for i in range(40)]
        )
        await session.add_message({"role": "user", "content": "which gateway attempt?"})
        await session.get_messages_for_request(token_budget=200)  # a search: its pool connects
        store: Any = ledger.store
        assert store._search_pool.get_size() >= 1
        for pool in (store._pool, store._search_pool):
            async with pool.acquire() as conn:
                assert await conn.fetchval("SHOW jit") == "off"
