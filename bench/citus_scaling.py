"""Appends on Citus as workers are added: 16 clients over 4 sessions per worker.

    .venv/bin/python bench/citus_scaling.py --one DSN --two DSN [--seconds 20]

``--one``/``--two``: databases on the same coordinator with one and two workers added
(``ops/citus bench`` makes them). Sessions are chosen so that each worker holds 4 (their
shards' placement is read from ``citus_shards``). 16 clients (library, one process) append
messages round-robin over the sessions for ``--seconds``; the floor is the same clients
doing raw asyncpg single-row INSERTs into a table distributed the same way, in the same
run. Prints appends/s, the ratio two/one, and the ratios to the floor; writes
``bench/results/citus_scaling.json``. On a machine with fewer cores than nodes the
workers share the CPU with the coordinator and the clients, so the ratio there says what
the machine allows, not what Citus does (docs/deploy/citus.md).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import asyncpg

from contextledger import Ledger

try:
    from bench.results import write as write_results
except ImportError:  # run as a script
    from results import write as write_results  # type: ignore[no-redef]

CLIENTS = 16
PER_WORKER = 4
FLOOR_TABLE = "citus_scaling_floor"


async def sessions_per_worker(dsn: str, per_worker: int) -> list[str]:
    """Session ids, ``per_worker`` on each worker holding shards of ``sessions``."""
    conn = await asyncpg.connect(dsn)
    try:
        nodes = [
            r[0]
            for r in await conn.fetch(
                "SELECT DISTINCT nodename || ':' || nodeport FROM citus_shards"
                " WHERE table_name = 'contextledger.sessions'::regclass ORDER BY 1"
            )
        ]
        chosen: dict[str, list[str]] = {n: [] for n in nodes}
        n = 0
        while any(len(v) < per_worker for v in chosen.values()):
            sid = f"scale-{n}"
            n += 1
            node = await conn.fetchval(
                "SELECT nodename || ':' || nodeport FROM citus_shards WHERE shardid ="
                " get_shard_id_for_distribution_column('contextledger.sessions', $1::text)",
                sid,
            )
            if len(chosen[node]) < per_worker:
                chosen[node].append(sid)
        return [s for v in chosen.values() for s in v]
    finally:
        await conn.close()


async def library(dsn: str, sessions: list[str], seconds: float) -> float:
    """Appends/s by ``CLIENTS`` clients through the library."""
    async with Ledger.open(dsn, pool_size=CLIENTS + 4) as ledger:
        handles = [await ledger.session(s) for s in sessions]
        for h in handles:
            await h.add_message({"role": "user", "content": "warm"})
        done = 0
        stop = time.perf_counter() + seconds

        async def client(i: int) -> None:
            nonlocal done
            n = 0
            while time.perf_counter() < stop:
                session = handles[(i + n * CLIENTS) % len(handles)]
                await session.add_message({"role": "user", "content": f"client {i} turn {n}"})
                n += 1
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(CLIENTS)))
        return done / (time.perf_counter() - start)


async def floor(dsn: str, sessions: list[str], seconds: float) -> float:
    """Appends/s of raw single-row INSERTs, distributed and co-located the same way."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"DROP TABLE IF EXISTS {FLOOR_TABLE};"
            f" CREATE TABLE {FLOOR_TABLE} (session_id text, n bigint, body jsonb,"
            " PRIMARY KEY (session_id, n));"
            f" SELECT create_distributed_table('{FLOOR_TABLE}', 'session_id',"
            " colocate_with => 'contextledger.sessions')"
        )
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(dsn, min_size=CLIENTS, max_size=CLIENTS)
    done = 0
    stop = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal done
        n = 0
        while time.perf_counter() < stop:
            sid = sessions[(i + n * CLIENTS) % len(sessions)]
            await pool.execute(
                f"INSERT INTO {FLOOR_TABLE} VALUES ($1, $2, $3::jsonb)",
                sid,
                i * 10_000_000 + n,
                '{"role": "user", "content": "x"}',
            )
            n += 1
            done += 1

    try:
        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(CLIENTS)))
        return done / (time.perf_counter() - start)
    finally:
        await pool.close()


async def main_async(args: argparse.Namespace) -> None:
    figures: dict[str, Any] = {"clients": CLIENTS, "sessions_per_worker": PER_WORKER}
    for label, dsn in (("one_worker", args.one), ("two_workers", args.two)):
        sessions = await sessions_per_worker(dsn, PER_WORKER)
        print(f"{label}: {len(sessions)} sessions...", file=sys.stderr)
        lib = await library(dsn, sessions, args.seconds)
        raw = await floor(dsn, sessions, args.seconds)
        figures[label] = {"sessions": len(sessions), "appends_per_s": lib, "floor_per_s": raw}
    one, two = figures["one_worker"], figures["two_workers"]
    figures["ratio_two_to_one"] = two["appends_per_s"] / one["appends_per_s"]
    figures["floor_ratio_two_to_one"] = two["floor_per_s"] / one["floor_per_s"]
    print("| workers | sessions | library appends/s | raw floor appends/s | library/floor |")
    print("|---|---:|---:|---:|---:|")
    for label, n in (("one_worker", 1), ("two_workers", 2)):
        f = figures[label]
        print(
            f"| {n} | {f['sessions']} | {f['appends_per_s']:.0f} | {f['floor_per_s']:.0f} |"
            f" {f['appends_per_s'] / f['floor_per_s']:.2f}x |"
        )
    print(
        f"\ntwo workers / one: library {figures['ratio_two_to_one']:.2f}x, raw floor "
        f"{figures['floor_ratio_two_to_one']:.2f}x ({CLIENTS} clients, {args.seconds:g} s each)"
    )
    if args.label:
        figures["label"] = args.label
    name = f"citus_scaling-{args.label}" if args.label else "citus_scaling"
    print(f"figures: {write_results(name, figures)}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", required=True, help="database with one worker")
    parser.add_argument("--two", required=True, help="database with two workers")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--label", help="figures go to bench/results/citus_scaling-LABEL.json (what was set)"
    )
    asyncio.run(main_async(parser.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
