"""Per turn on Citus against one server, paired: bench/turns.py's turns on both at once.

    .venv/bin/python bench/citus_turns.py --citus DSN --one DSN [--lengths 100,1000]

``--citus``: an empty database on a Citus coordinator (``ops/citus bench`` makes it);
``--one``: an empty database on a plain server with the same settings (the baseline).
For each configuration (``--configs``, bench/turns.py's) one session on each runs the
same turns (append a user and an assistant message, build the next request), one turn
on each in alternation, the first side alternating too: on a machine shared with other
work (``ops/citus`` runs every node on one), two runs one after the other saw a 4x
different load (the raw floor at 2.7 and 9.8 ms), so their ratio said more about the
load than about Citus. The figure at a length L is the median of the ``--window`` turns
ending at L on each side, and their ratio. Writes ``bench/results/citus_turns[-LABEL].json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import asyncpg

from contextledger import Ledger, Session

try:
    from bench.results import write as write_results
    from bench.turns import CONFIGS, MODEL, analyze_due, configs, messages
except ImportError:  # run as a script: bench/ itself is sys.path[0]
    from results import write as write_results  # type: ignore[no-redef]
    from turns import CONFIGS, MODEL, analyze_due, configs, messages  # type: ignore[no-redef]

SIDES = ("one", "citus")


async def analyze(dsn: str) -> None:
    """Statistics refreshed outside the timed part, as bench/turns.py does."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def turn(
    session: Session, budget: int | None, user: dict[str, Any], assistant: dict[str, Any]
) -> float:
    start = time.perf_counter()
    await session.add_message(user)
    await session.add_message(assistant)
    await session.get_messages_for_request(budget)
    return time.perf_counter() - start


async def paired(
    dsns: dict[str, str], name: str, lengths: list[int], window: int
) -> dict[str, dict[int, float]]:
    """ms per turn (median of ``window``) at each length, per side."""
    config, budget = CONFIGS[name]
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    out: dict[str, dict[int, float]] = {side: {} for side in SIDES}
    async with Ledger.open(dsns["one"]) as one, Ledger.open(dsns["citus"]) as citus:
        ledgers = {"one": one, "citus": citus}
        sessions = {
            side: await ledgers[side].session(f"bench-{name}", model=MODEL, config=config)
            for side in SIDES
        }
        for n, (user, assistant) in enumerate(messages(max(lengths)), start=1):
            if analyze_due(n):
                await asyncio.gather(*(analyze(dsns[side]) for side in SIDES))
            for side in SIDES if n % 2 else reversed(SIDES):
                times[side].append(await turn(sessions[side], budget, user, assistant))
            if n in lengths:
                for side in SIDES:
                    out[side][n] = statistics.median(times[side][-window:]) * 1000
                print(
                    f"  {name:<13} {n:>6} turns  one {out['one'][n]:8.2f} ms"
                    f"  citus {out['citus'][n]:8.2f} ms",
                    file=sys.stderr,
                )
    return out


async def main_async(args: argparse.Namespace) -> None:
    dsns = {"one": args.one, "citus": args.citus}
    for side in SIDES:  # the schema (on Citus, 0014 distributes it)
        async with Ledger.open(dsns[side], migrate=True):
            pass
    runs = {name: await paired(dsns, name, args.lengths, args.window) for name in args.configs}
    head = "| path | " + " | ".join(
        f"one server @{n:,} | Citus @{n:,} | Citus / one @{n:,}" for n in args.lengths
    )
    lines = [head + " |", "|---|" + "---:|---:|---:|" * len(args.lengths)]
    for name, r in runs.items():
        cells = [
            f"{r['one'][n]:.2f} | {r['citus'][n]:.2f} | {r['citus'][n] / r['one'][n]:.1f}x"
            for n in args.lengths
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    print(
        f"\nbench/citus_turns.py: ms per turn, median of the {args.window} turns ending at"
        " each length, one turn on each side in alternation\n"
    )
    print("\n".join(lines))
    name = "citus_turns" if args.label is None else f"citus_turns-{args.label}"
    figures = {
        "lengths": args.lengths,
        "window": args.window,
        "label": args.label,
        "ms_median": {config: {side: r[side] for side in SIDES} for config, r in runs.items()},
    }
    print(f"\nfigures: {write_results(name, figures)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--citus", required=True, help="an empty database on the coordinator")
    parser.add_argument("--one", required=True, help="an empty database on the plain server")
    parser.add_argument("--lengths", default="100,1000")
    parser.add_argument("--configs", default="none,max6000+auto")
    parser.add_argument("--window", type=int, default=50, help="turns per median")
    parser.add_argument("--label", help="e.g. the Citus version, jit-on")
    args = parser.parse_args(argv)
    args.lengths = sorted(int(x) for x in args.lengths.split(","))
    args.configs = configs(parser, args.configs)
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
