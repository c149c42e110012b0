"""Google ADK: DatabaseSessionService against LedgerSessionService, one PostgreSQL.

A turn is what ADK's ``Runner`` asks of its session service (without the model):
``get_session`` (what the next request is built from), ``append_event`` of the user's
message, ``append_event`` of the model's answer. Each store gets its own scratch
database on the server at ``dsn`` (so ``db_bytes`` is that store's tables, indexes and
TOAST, nothing else). A session is first grown to ``turns - 2 * WINDOW`` turns by
appends alone (each store through its own API; reads would make that quadratic), then
the last ``2 * WINDOW`` turns are timed, alternating two read modes, each a row: ADK's
default (``get_session`` with no config: every event, which is what the Runner does
unless told otherwise) and ``GetSessionConfig(num_recent_events=50)``.

Run alone: ``.venv/bin/python bench/peers_adk.py [--turns 100,1000]`` (starts an
embedded PostgreSQL); ``bench/peers.py`` runs it beside the other frameworks.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import asyncpg
from google.adk.events.event import Event
from google.adk.sessions import BaseSessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.genai import types

from contextledger import Ledger
from contextledger.adapters.adk import LedgerSessionService

try:
    from bench._pg import embedded_server, scratch_database
except ImportError:  # run as a script: bench/ itself is sys.path[0]
    from _pg import embedded_server, scratch_database  # type: ignore[no-redef]

WINDOW = 30
APP, USER = "bench", "u"
WORDS = ("the", "build", "fails", "in", "config.py", "line", "42", "retry", "fix", "deploy")


def _text(n: int, words: int) -> str:
    return " ".join(WORDS[(n * 7 + i) % len(WORDS)] for i in range(words))


def _event(n: int, role: str) -> Event:
    words = 40 if role == "user" else 100
    return Event(
        invocation_id=f"inv-{n}",
        author="user" if role == "user" else "agent",
        content=types.Content(role=role, parts=[types.Part(text=f"{n}: " + _text(n, words))]),
        id=Event.new_id(),
    )


async def db_bytes(dsn: str) -> int:
    """Every user table's total size (heap, indexes, TOAST) in the database at ``dsn``."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE")
        value = await conn.fetchval(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND n.nspname NOT LIKE 'pg_toast%'"
        )
        return int(value)
    finally:
        await conn.close()


async def _loop(service: BaseSessionService, turns: int) -> dict[str, list[float]]:
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    timed = min(turns, 2 * WINDOW)  # the last turns, read modes alternating
    for n in range(turns - timed):  # grow the session: appends only
        await service.append_event(session, _event(n, "user"))
        await service.append_event(session, _event(n, "model"))
    timings: dict[str, list[float]] = {"all events": [], "recent=50": []}
    modes = (("all events", None), ("recent=50", GetSessionConfig(num_recent_events=50)))
    for n in range(turns - timed, turns):
        mode, config = modes[n % 2]
        t0 = time.perf_counter()
        current = await service.get_session(
            app_name=APP, user_id=USER, session_id="s", config=config
        )
        assert current is not None
        await service.append_event(current, _event(n, "user"))
        await service.append_event(current, _event(n, "model"))
        timings[mode].append((time.perf_counter() - t0) * 1000)
    return timings


def _rows(
    store: str, turns: int, timings: dict[str, list[float]], size: int
) -> list[dict[str, Any]]:
    rows = []
    for mode, ms in timings.items():
        ordered = sorted(ms)
        rows.append(
            {
                "framework": "adk",
                "store": f"{store} ({mode})",
                "turns": turns,
                "ms_median": statistics.median(ordered),
                "ms_p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
                "db_bytes": size,
            }
        )
    return rows


def _sqlalchemy_url(dsn: str) -> str:
    return "postgresql+asyncpg://" + dsn.split("://", 1)[1]


async def run(turns: int, dsn: str) -> list[dict[str, object]]:
    """One row per store and read mode at ``turns`` turns (see the module docstring)."""
    rows: list[dict[str, object]] = []
    async with scratch_database(dsn, "peers_adk_db") as db:
        theirs = DatabaseSessionService(db_url=_sqlalchemy_url(db))
        try:
            await theirs.prepare_tables()
            base = await db_bytes(db)  # empty tables and indexes: not the session's
            timings = await _loop(theirs, turns)
        finally:
            await theirs.close()
        rows += _rows("DatabaseSessionService", turns, timings, await db_bytes(db) - base)
    async with scratch_database(dsn, "peers_adk_ledger") as db:
        async with Ledger.open(db, migrate=True) as ledger:
            base = await db_bytes(db)
            timings = await _loop(LedgerSessionService(ledger=ledger, model="gpt-4o"), turns)
        rows += _rows("LedgerSessionService", turns, timings, await db_bytes(db) - base)
    return rows


def _print(rows: list[dict[str, object]]) -> None:
    print(f"{'store':<44} {'turns':>6} {'ms p50':>8} {'ms p95':>8} {'db bytes':>12}")
    for r in rows:
        print(
            f"{r['store']!s:<44} {r['turns']!s:>6} {r['ms_median']:>8.2f} "
            f"{r['ms_p95']:>8.2f} {r['db_bytes']!s:>12}"
        )


async def _main(lengths: list[int]) -> None:
    with embedded_server() as dsn:
        rows: list[dict[str, object]] = []
        for n in lengths:
            rows += await run(n, dsn)
        _print(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="100,1000,5000")
    args = parser.parse_args()
    asyncio.run(_main([int(x) for x in args.turns.split(",")]))
