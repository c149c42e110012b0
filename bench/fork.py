"""Fork benchmark: what a fork costs at 100 and 20,000 events, and reading a fork's view.

A fork writes one session row and one ``session.forked`` event and copies no event:
its cost should not grow with the parent's length. Measured, interleaved in rounds so
drift affects every size alike:

1. ``Ledger.fork`` (the new session opened too) and ``store.fork_session`` alone, at
   the parent's head, per parent length; and ``store.fork_session`` of a parent
   compacted to ``COMPACTED_BUDGET`` tokens, whose materialized view rows the fork takes
   (copied inside the server: O(view), bounded by the budget, not the history);
2. the raw asyncpg floor of that write: one row and one event row inserted in one
   transaction into plain tables (same columns), on one connection;
3. what a copy would cost instead: ``INSERT ... SELECT`` of the parent's event rows
   into a plain table (the anchors' way: LangGraph Platform, Letta, OpenAI's branches);
4. ``view()`` of the fork against ``view()`` of its parent (target: <= 1.3x).

Run: ``.venv/bin/python bench/fork.py [--dsn postgresql://...] [--quick]``; figures
are printed and written to ``bench/results/fork.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pg import embedded_server, install_sigterm_handler, scratch_database
from contextledger import Ledger
from contextledger.appends import utc_now
from results import write

#: The budget the compacted parents are truncated to: their materialized view (~500 rows
#: at length) is what a fork at their head copies (server-side, ``INSERT ... SELECT``).
COMPACTED_BUDGET = 20_000


def progress(msg: str) -> None:
    print(f"[fork] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


RAW = """
CREATE SCHEMA IF NOT EXISTS bench_fork;
CREATE TABLE IF NOT EXISTS bench_fork.sessions (
    session_id text PRIMARY KEY, parent text, parent_seq bigint, head bigint, last_hash text);
CREATE TABLE IF NOT EXISTS bench_fork.events (
    session_id text, seq bigint, type text, version smallint, data jsonb, tokens int,
    created_at timestamptz, hash text, PRIMARY KEY (session_id, seq));
"""


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def fill(ledger: Ledger, name: str, n: int) -> None:
    session = await ledger.session(name)
    batch = 500
    for start in range(0, n, batch):
        await session.add_messages(
            [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"turn {i}: the deploy of service {i % 37} went out with "
                    f"flag {i % 11} set, and the queue drained in {i % 90} seconds.",
                }
                for i in range(start, min(n, start + batch))
            ]
        )


async def run(dsn: str, quick: bool) -> dict[str, Any]:
    sizes = [100, 2_000] if quick else [100, 20_000]
    rounds = 10 if quick else 30
    reads = 30 if quick else 100
    figures: dict[str, Any] = {"sizes": sizes, "rounds": rounds, "load_before": os.getloadavg()}
    raw = await asyncpg.connect(dsn)
    try:
        await raw.execute(RAW)
        async with Ledger.open(dsn, migrate=True, pool_size=4) as ledger:
            store: Any = ledger.store
            for n in sizes:
                progress(f"filling a parent of {n} message events")
                await fill(ledger, f"parent-{n}", n)
                # and one compacted to a budget: its view is materialized (up to
                # COMPACTED_BUDGET tokens of rows), which a fork at its head takes
                await fill(ledger, f"compacted-{n}", n)
                c = await ledger.session(f"compacted-{n}", create=False)
                await c.compact("truncate", token_budget=COMPACTED_BUDGET)
                figures.setdefault("compacted_view_rows", {})[n] = len(await c.view_items())
            samples: dict[str, list[float]] = {}
            created = utc_now()
            for r in range(rounds):  # interleaved: every size sees the same drift
                for n in sizes:
                    parent = f"parent-{n}"
                    samples.setdefault(f"ledger.fork@{n}", []).append(
                        await timed(lambda p=parent, r=r: ledger.fork(p, f"{p}-f{r}"))
                    )
                    samples.setdefault(f"store.fork_session@{n}", []).append(
                        await timed(
                            lambda p=parent, r=r, n=n: store.fork_session(
                                f"{p}-s{r}", p, n + 1, created_at=created, metadata={}
                            )
                        )
                    )
                    comp = f"compacted-{n}"
                    top = (await store.session_info(comp)).head
                    samples.setdefault(f"store.fork_session, compacted parent@{n}", []).append(
                        await timed(
                            lambda c=comp, r=r, t=top: store.fork_session(
                                f"{c}-s{r}", c, t, created_at=created, metadata={}
                            )
                        )
                    )

                    async def floor(n: int = n, r: int = r) -> None:
                        async with raw.transaction():
                            await raw.execute(
                                "INSERT INTO bench_fork.sessions VALUES ($1, $2, $3, $4, $5)",
                                f"raw-{n}-{r}",
                                f"parent-{n}",
                                n + 1,
                                n + 2,
                                "0" * 64,
                            )
                            await raw.execute(
                                "INSERT INTO bench_fork.events VALUES ($1, $2,"
                                " 'session.forked', 1, '{}', 0, now(), $3)",
                                f"raw-{n}-{r}",
                                n + 2,
                                "0" * 64,
                            )

                    samples.setdefault(f"raw floor (1 row + 1 event)@{n}", []).append(
                        await timed(floor)
                    )

                    async def copy(n: int = n, r: int = r) -> None:
                        await raw.execute(
                            "INSERT INTO bench_fork.events SELECT $2, seq, type, version, data,"
                            " tokens, created_at, hash FROM contextledger.events"
                            " WHERE session_id = $1",
                            f"parent-{n}",
                            f"copy-{n}-{r}",
                        )

                    samples.setdefault(f"raw copy of the events@{n}", []).append(await timed(copy))
            progress("reading views: each parent against its fork")
            views: dict[str, list[float]] = {}
            opened = {
                name: await ledger.session(name, create=False)
                for n in sizes
                for name in (f"parent-{n}", f"parent-{n}-f0")
            }
            for _ in range(5):
                for s in opened.values():
                    await s.view()
            for _ in range(reads):
                for name, s in opened.items():
                    views.setdefault(name, []).append(await timed(s.view))
            for n in sizes:
                assert await opened[f"parent-{n}"].view() == await opened[f"parent-{n}-f0"].view()
            ops: dict[str, Any] = {}
            for key, values in samples.items():
                ops[key] = {
                    "p50_ms": ms(statistics.median(values)),
                    "p95_ms": ms(pct(values, 0.95)),
                }
            figures["fork"] = ops
            figures["view_read"] = {
                name: {"p50_ms": ms(statistics.median(v)), "p95_ms": ms(pct(v, 0.95))}
                for name, v in views.items()
            }
            figures["ratios"] = {
                f"fork_over_floor@{n}": round(
                    statistics.median(samples[f"store.fork_session@{n}"])
                    / statistics.median(samples[f"raw floor (1 row + 1 event)@{n}"]),
                    2,
                )
                for n in sizes
            } | {
                f"fork_view_over_parent_view@{n}": round(
                    statistics.median(views[f"parent-{n}-f0"])
                    / statistics.median(views[f"parent-{n}"]),
                    2,
                )
                for n in sizes
            }
            rows = await raw.fetchval(
                "SELECT count(*) FROM contextledger.events WHERE session_id = $1",
                f"parent-{sizes[-1]}-f0",
            )
            figures["event_rows_of_a_fork"] = rows
    finally:
        await raw.close()
    figures["load_after"] = os.getloadavg()
    return figures


def report(figures: dict[str, Any]) -> None:
    print("## fork benchmark\n")
    print("| operation | p50 ms | p95 ms |\n|---|---|---|")
    for key, v in figures["fork"].items():
        print(f"| {key} | {v['p50_ms']} | {v['p95_ms']} |")
    print("\n| view() of | p50 ms | p95 ms |\n|---|---|---|")
    for key, v in figures["view_read"].items():
        print(f"| {key} | {v['p50_ms']} | {v['p95_ms']} |")
    print("\nratios:", figures["ratios"])
    print("event rows stored for a fork of the longest parent:", figures["event_rows_of_a_fork"])
    print("view rows of the compacted parents:", figures.get("compacted_view_rows"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="an existing server (a scratch database is used)")
    parser.add_argument("--quick", action="store_true", help="100 and 2,000 events")
    args = parser.parse_args(argv)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    install_sigterm_handler()

    async def go(dsn: str) -> dict[str, Any]:
        if args.dsn:
            async with scratch_database(dsn, prefix="fork_bench") as scratch:
                return await run(scratch, args.quick)
        return await run(dsn, args.quick)

    if args.dsn:
        figures = asyncio.run(go(args.dsn))
    else:
        with embedded_server() as dsn:
            figures = asyncio.run(go(dsn))
    figures["where"] = "--dsn" if args.dsn else "embedded"
    report(figures)
    if not args.quick:
        print("written:", write("fork", figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
