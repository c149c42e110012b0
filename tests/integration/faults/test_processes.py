"""Faults that need other processes or the server's own limits: writers in child
processes across a restart, a writer killed with SIGKILL mid-batch, connection slots
used up. Every failure a caller sees is typed; nothing lost, duplicated or half-written."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from typing import Any

import asyncpg
import pytest

from contextledger import Ledger
from contextledger.errors import ContextLedgerError, LedgerUnavailable
from contextledger.store.dsn import asyncpg_dsn
from tests.integration.faults.support import admin

#: A writer in its own process: appends ``count`` messages with idempotency keys,
#: retrying each until it lands; reports typed failures by code and untyped ones by class.
WRITER = textwrap.dedent(
    """
    import asyncio, json, sys
    from contextledger import Ledger
    from contextledger.errors import ContextLedgerError

    async def main(dsn, sid, count, batch):
        typed, untyped = {}, []
        async with Ledger.open(dsn) as ledger:
            session = await ledger.session(sid)
            print("ready", flush=True)
            for i in range(count):
                for _ in range(600):
                    try:
                        if batch:
                            await session.add_messages(
                                [{"role": "user", "content": f"{sid}-{i}-{j}"} for j in range(3)]
                            )
                        else:
                            await session.add_message(
                                {"role": "user", "content": f"{sid}-{i}"},
                                idempotency_key=f"{sid}-{i}",
                            )
                        break
                    except ContextLedgerError as exc:
                        typed[exc.code] = typed.get(exc.code, 0) + 1
                        await asyncio.sleep(0.02)
                        await session.refresh() if exc.code == "CONCURRENCY_CONFLICT" else None
                    except Exception as exc:
                        untyped.append(type(exc).__name__)
                        await asyncio.sleep(0.02)
                print("wrote", i, flush=True)
                await asyncio.sleep(0.005)  # still mid-run when the server goes down
        print(json.dumps({"typed": typed, "untyped": untyped}), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "batch"))
    """
)


async def _spawn(dsn: str, sid: str, count: int, mode: str = "keys") -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WRITER,
        dsn,
        sid,
        str(count),
        mode,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )


async def _line(proc: asyncio.subprocess.Process, prefix: str) -> str:
    assert proc.stdout is not None
    while True:
        raw = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not raw:
            err = await proc.stderr.read() if proc.stderr else b""
            raise AssertionError(f"writer ended early: {err.decode()[-2000:]}")
        line = raw.decode().strip()
        if line.startswith(prefix):
            return line


async def _report(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    line = await _line(proc, "{")
    await asyncio.wait_for(proc.wait(), 60)
    assert proc.returncode == 0
    report: dict[str, Any] = json.loads(line)
    return report


async def _contents(ledger: Ledger, sid: str) -> list[str]:
    return [
        e.payload.message["content"]
        async for e in ledger.store.read_events(sid, 2)
        if hasattr(e.payload, "message")
    ]


async def test_writers_in_other_processes_ride_out_a_restart(server: Any, scratch: str) -> None:
    # 400 paced appends each (~3 s): the server goes down after the 10th whatever the
    # machine's speed (with 80 unpaced ones a writer could finish before the stop)
    writers = [await _spawn(scratch, f"p{n}", 400) for n in range(3)]
    for proc in writers:
        await _line(proc, "wrote 10")  # every writer is mid-run
    await asyncio.to_thread(server.stop)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(server.start)
    reports = [await _report(proc) for proc in writers]
    assert [r["untyped"] for r in reports] == [[], [], []]
    codes = {code for r in reports for code in r["typed"]}
    assert codes, "the restart was not seen by any writer"
    assert codes <= {
        "CONNECTION_LOST",
        "CONNECTION_REFUSED",
        "SERVER_STARTING",
        "SERVER_STOPPING",
        "POOL_CLOSED",
        "TOO_MANY_CONNECTIONS",
    }
    async with Ledger.open(scratch) as ledger:
        for n in range(3):
            sid = f"p{n}"
            assert await _contents(ledger, sid) == [f"{sid}-{i}" for i in range(400)]
            assert (await ledger.verify(sid)).ok


async def test_a_writer_killed_mid_batch_leaves_whole_batches_and_a_sound_chain(
    scratch: str,
) -> None:
    proc = await _spawn(scratch, "k", 100_000, "batch")
    await _line(proc, "wrote 60")
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    async with Ledger.open(scratch) as ledger:
        assert (await ledger.verify("k")).ok
        contents = await _contents(ledger, "k")
        info = await ledger.store.session_info("k")
        assert info.head == len(contents) + 1  # the config event, then only messages
        batches = len(contents) // 3
        assert batches > 60
        # all or nothing: each batch is three messages in order, never a part of one
        assert contents == [f"k-{i}-{j}" for i in range(batches) for j in range(3)]
        session = await ledger.session("k", create=False)  # and the session goes on
        assert await session.add_message({"role": "user", "content": "after"}) == info.head + 1
        assert (await ledger.verify("k")).ok


async def test_used_up_connection_slots_are_typed_and_retryable(scratch: str) -> None:
    await admin(
        scratch,
        "DROP ROLE IF EXISTS cl_limited",
        "CREATE ROLE cl_limited LOGIN CONNECTION LIMIT 2",
        "GRANT USAGE ON SCHEMA contextledger TO cl_limited",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA contextledger TO cl_limited",
        "GRANT USAGE ON ALL SEQUENCES IN SCHEMA contextledger TO cl_limited",
    )
    dsn = scratch.replace("postgres@", "cl_limited@")
    blocker = await asyncpg.connect(asyncpg_dsn(dsn))  # one of the two slots
    try:
        async with Ledger.open(dsn, pool_size=20) as ledger:  # the other one
            results = await asyncio.gather(
                *(ledger.session(f"s{i}") for i in range(60)), return_exceptions=True
            )
            failed = [r for r in results if isinstance(r, BaseException)]
            assert failed, "the pool never needed another connection"
            assert all(isinstance(f, LedgerUnavailable) for f in failed), failed
            assert {f.code for f in failed if isinstance(f, ContextLedgerError)} == {
                "TOO_MANY_CONNECTIONS"
            }
            assert all(f.is_retryable for f in failed if isinstance(f, ContextLedgerError))
            with pytest.raises(LedgerUnavailable) as info:
                await Ledger.open(dsn)
            assert info.value.code == "TOO_MANY_CONNECTIONS"
        await blocker.close()  # a slot frees up: the failed sessions can be opened now
        async with Ledger.open(dsn) as ledger:
            for i in range(60):
                await ledger.session(f"s{i}")
    finally:
        await blocker.close()
        # every session is whole: its config event and nothing half-written
        async with Ledger.open(scratch) as owner:
            infos = await owner.sessions()
            assert sorted(i.session_id for i in infos) == sorted(f"s{i}" for i in range(60))
            for info in infos:
                assert info.head == 1
                assert (await owner.verify(info.session_id)).ok
        await admin(
            scratch,
            "REVOKE ALL ON ALL TABLES IN SCHEMA contextledger FROM cl_limited",
            "REVOKE ALL ON ALL SEQUENCES IN SCHEMA contextledger FROM cl_limited",
            "REVOKE ALL ON SCHEMA contextledger FROM cl_limited",
            "DROP ROLE cl_limited",
        )


async def test_a_search_without_a_free_slot_runs_on_the_pools_own_connection(
    scratch: str,
) -> None:
    """Live searches have connections of their own (one statement each); when the server
    has no slot left for one, the search runs on a connection the ledger already holds."""
    await admin(
        scratch,
        "DROP ROLE IF EXISTS cl_one_slot",
        "CREATE ROLE cl_one_slot LOGIN CONNECTION LIMIT 1",
        "GRANT contextledger_service TO cl_one_slot",
    )
    dsn = scratch.replace("postgres@", "cl_one_slot@")
    fact = "Heads up: the orchard-api gateway binds to 18443 on staging."
    try:
        async with (
            asyncio.timeout(60),  # a pool of one once left reads waiting forever
            Ledger.open(dsn, pool_size=1, role="contextledger_service") as ledger,
        ):
            session = await ledger.session("one", config={"token_counter": "chars"})
            await session.add_message({"role": "user", "content": fact})
            for i in range(40):
                await session.add_message({"role": "user", "content": f"step {i}: tidy " * 8})
                await session.add_message({"role": "assistant", "content": f"done {i} " * 8})
            await session.add_message({"role": "user", "content": "orchard-api port?"})
            request = await session.get_messages_for_request(token_budget=1500)
        assert "18443" in str(request)  # recalled, though its own pool could not connect
        assert fact not in str(request[:2])  # not merely carried at the front
    finally:
        await admin(scratch, "DROP ROLE cl_one_slot")
