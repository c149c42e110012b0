"""Side by side: each framework's own default store against contextledger's adapter for it.

Every ``bench/peers_<framework>.py`` that exists is run: its ``run(turns, dsn)`` drives
the same turn loop (add a user item, add an assistant item, read what the next request
needs) through the framework's default database store and through our adapter, on ONE
embedded PostgreSQL, in one run. The raw-asyncpg floor (2 INSERTs + SELECT last 50 on
a plain table, as ``bench/turns.py``) is measured in the same run.

Printed per framework and store: per-turn ms (median and p95 of the last 100 turns at
each length), the ratio to the floor, growth (ms at the longest length / ms at the
shortest) and the session's rows in the database.

Run: ``.venv/bin/python bench/peers.py`` (100 / 1,000 / 5,000 turns; ``--turns 100,1000``;
``--quick`` = 100 / 1,000; ``--only openai_agents,adk``). Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WINDOW = 100


def modules(only: list[str] | None) -> list[tuple[str, Any]]:
    found = sorted(p.stem.removeprefix("peers_") for p in HERE.glob("peers_*.py"))
    return [
        (name, importlib.import_module(f"bench.peers_{name}"))
        for name in found
        if not only or name in only
    ]


async def raw_floor(dsn: str, lengths: list[int]) -> dict[int, float]:
    """ms per turn of 2 INSERTs + SELECT last 50 (plain table, raw asyncpg)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS peers_raw (id bigserial PRIMARY KEY, session_id text"
            " NOT NULL, item jsonb NOT NULL)"
        )
        await conn.execute("CREATE INDEX IF NOT EXISTS peers_raw_s ON peers_raw (session_id, id)")
        insert = "INSERT INTO peers_raw (session_id, item) VALUES ($1, $2::jsonb)"
        select = "SELECT item::text FROM peers_raw WHERE session_id = $1 ORDER BY id DESC LIMIT 50"
        out: dict[int, float] = {}
        for length in lengths:
            sid = f"raw-{length}-{time.time_ns()}"
            times: list[float] = []
            for n in range(length):
                user = json.dumps({"role": "user", "content": f"turn {n}: " + "word " * 45})
                reply = json.dumps({"role": "assistant", "content": "word " * 110})
                start = time.perf_counter()
                await conn.execute(insert, sid, user)
                await conn.execute(insert, sid, reply)
                [json.loads(r[0]) for r in reversed(await conn.fetch(select, sid))]
                times.append(time.perf_counter() - start)
            out[length] = statistics.median(times[-WINDOW:]) * 1000
        return out
    finally:
        await conn.close()


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def table(rows: list[dict[str, Any]], floor: dict[int, float], lengths: list[int]) -> str:
    head = "| framework | store | " + " | ".join(
        f"{n:,} turns: ms (p95) [x floor]" for n in lengths
    )
    head += f" | growth {lengths[-1]:,}/{lengths[0]:,} | DB @ {lengths[-1]:,} |"
    lines = [head, "|" + "---|" * (3 + len(lengths) + 1)]
    stores: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        stores.setdefault((str(r["framework"]), str(r["store"])), {})[int(r["turns"])] = r
    for (framework, store), by_len in stores.items():
        cells = []
        for n in lengths:
            r = by_len.get(n)
            cells.append(
                f"{r['ms_median']:.2f} ({r['ms_p95']:.2f}) [{r['ms_median'] / floor[n]:.1f}x]"
                if r
                else "—"
            )
        first, last = by_len.get(lengths[0]), by_len.get(lengths[-1])
        growth = f"{last['ms_median'] / first['ms_median']:.1f}x" if first and last else "—"
        size = _size(float(last["db_bytes"])) if last else "—"
        lines.append(f"| {framework} | {store} | " + " | ".join(cells) + f" | {growth} | {size} |")
    floor_cells = " | ".join(f"{floor[n]:.2f}" for n in lengths)
    lines.append(f"| raw asyncpg | 2 INSERTs + SELECT last 50 | {floor_cells} | "
                 f"{floor[lengths[-1]] / floor[lengths[0]]:.1f}x | — |")  # fmt: skip
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    from bench._pg import embedded_server, install_sigterm_handler

    from contextledger import Ledger

    install_sigterm_handler()
    mods = modules(args.only)
    if not mods:
        raise SystemExit("no bench/peers_*.py module to run")
    with embedded_server() as dsn:
        async with Ledger.open(dsn, migrate=True):
            pass
        print("raw floor...", file=sys.stderr)
        floor = await raw_floor(dsn, args.turns)
        rows: list[dict[str, Any]] = []
        for name, module in mods:
            for turns in args.turns:
                print(f"{name}: {turns} turns...", file=sys.stderr, flush=True)
                started = time.perf_counter()
                got = await module.run(turns, dsn)
                for r in got:
                    print(f"  {r['store']}: {r['ms_median']:.2f} ms", file=sys.stderr)
                print(f"  ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
                rows += got
    print(
        f"\nbench/peers.py: one embedded PostgreSQL, one run; ms per turn = median (p95) of "
        f"the last {WINDOW} turns at each length; [x floor] = ratio to raw asyncpg at that "
        "length; DB = the session's rows (pg_column_size, no indexes)\n"
    )
    print(table(rows, floor, args.turns))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", help="comma-separated turn counts (default 100,1000,5000)")
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 turns")
    parser.add_argument("--only", help="comma-separated frameworks (module suffixes)")
    args = parser.parse_args(argv)
    turns = args.turns or ("100,1000" if args.quick else "100,1000,5000")
    args.turns = sorted(int(x) for x in turns.split(","))
    args.only = [x.strip() for x in args.only.split(",")] if args.only else None
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    raise SystemExit(main())
