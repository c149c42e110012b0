"""Per-turn cost by session length: contextledger against a raw asyncpg floor.

A turn = append a user message, append an assistant message, build the next
request (``get_messages_for_request``). Each configuration runs ONE session for
real, turn after turn, up to the longest length; the figure at a length L is the
median (and p95) of the ``--window`` turns ending at L. The raw floor (2 INSERTs +
SELECT last 50 on a plain table, asyncpg) runs the same turns in the same run on
the same server; so does a second floor that reads, each turn, as many rows as the
no-config request carried then (the model's window holds ~800 messages at length,
not 50: what serving that much costs without us).

Printed per store (embedded PostgreSQL, ``memory://``) and configuration (no
config; each strategy with a per-request ``token_budget``; the tuned path of the
issue: ``max_tokens`` 6000 + ``auto_compact`` truncate):

* ms per turn at each length and the ratio to the floor at that length;
* growth = ms at the longest length / ms at the shortest;
* fill = request tokens / budget, min and mean over the second half of the run,
  counted on the turns where the history exceeds the budget;
* memory held by the session object (a size walk of what it owns, not the ledger,
  store or counter) at each length (the target compares 20,000 turns with 1,000);
* database bytes per event (events + view, branch and search-vector rows of the session).

Run: ``.venv/bin/python bench/turns.py`` (``--quick``: 100/1,000/2,000 turns;
``--tool-loop 5000``: what a request waits for after a human turn and after a tool's
results, whose recall search started when the call was appended).
Deterministic messages; prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from contextledger import Ledger, Session

try:
    from bench.language import Chatter, Prose
    from bench.results import write as write_results
except ImportError:  # run as a script: bench/ itself is sys.path[0]
    from language import Chatter, Prose  # type: ignore[no-redef]
    from results import write as write_results  # type: ignore[no-redef]

WORDS = (
    "the", "build", "fails", "in", "config.py", "parse_args", "line", "42", "retry",
    "userId", "ok", "check", "value", "fix", "deploy", "cache", "token", "review",
)  # fmt: skip
MODEL = "gpt-4o"
STRATEGY_BUDGET = 24_000

_ANALYZE_AT = frozenset(int(25 * 1.1**k) for k in range(120))


def analyze_due(n: int) -> bool:
    """Statistics are refreshed outside the timed part, on both sides, when a turn count
    is 10% past the last refresh (autovacuum's default rule; left to autovacuum's timing,
    the floor's own "last 50" query ran as a scan and sort of the whole table for long
    stretches: 2.9 ms at 1,000 turns instead of 0.3, so the floor grew 9x over a run)."""
    return n in _ANALYZE_AT


CONFIGS: dict[str, tuple[dict[str, Any] | None, int | None]] = {
    # name: (session config, token_budget passed per request)
    "none": (None, None),
    # the default path without recall's search (what recall costs a turn, by difference)
    "none-recall-off": ({"recall": {"enabled": False}}, None),
    "truncate": ({"compaction_strategy": "truncate"}, STRATEGY_BUDGET),
    "priority": ({"compaction_strategy": "priority"}, STRATEGY_BUDGET),
    "importance": ({"compaction_strategy": "importance"}, STRATEGY_BUDGET),
    "summarize": (
        {"compaction_strategy": "summarize", "summarizer": {"offline_fallback": True}},
        STRATEGY_BUDGET,
    ),
    "max6000+auto": (
        {"max_tokens": 6000, "auto_compact": True, "compaction_strategy": "truncate"},
        None,
    ),
}


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


#: The messages' text: ``natural`` (default) is language-shaped (bench/language.py: a Zipf
#: vocabulary with a long tail, names, numbers, dates), so recall's search does its real
#: work; ``uniform`` is the earlier 18-word vocabulary, every word of it common, on which
#: the search drops every word and never runs (kept to compare with earlier figures);
#: ``sentences`` is small talk (``language.Chatter``), whose common words recur as a
#: conversation's do (more of a query's words are read to the cap and further).
TEXT = "natural"


def messages(n_turns: int, seed: int = 5) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
    rng = random.Random(seed)
    if TEXT == "uniform":
        for n in range(n_turns):
            yield (
                {"role": "user", "content": f"turn {n}: " + _text(rng, rng.randint(20, 70))},
                {"role": "assistant", "content": _text(rng, rng.randint(60, 160))},
            )
        return
    prose: Prose | Chatter = Chatter(seed) if TEXT == "sentences" else Prose(seed)
    for n in range(n_turns):
        yield (
            {"role": "user", "content": f"turn {n}: " + prose.text(rng.randint(20, 70))},
            {"role": "assistant", "content": prose.text(rng.randint(60, 160))},
        )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def held_bytes(obj: Any, skip: Iterable[Any] = ()) -> int:
    """Bytes reachable from ``obj`` (containers, dataclasses, slots), each object once."""
    seen = {id(x) for x in skip}
    total = 0
    stack = [obj]
    while stack:
        cur = stack.pop()
        if id(cur) in seen or isinstance(cur, type):
            continue
        seen.add(id(cur))
        total += sys.getsizeof(cur)
        if isinstance(cur, dict):
            stack.extend(cur.keys())
            stack.extend(cur.values())
        elif isinstance(cur, list | tuple | set | frozenset):
            stack.extend(cur)
        elif hasattr(cur, "items") and hasattr(cur, "keys"):  # mappingproxy and friends
            stack.extend(cur.keys())
            stack.extend(cur.values())
        else:
            if hasattr(cur, "__dict__"):
                stack.append(vars(cur))
            for slot in getattr(type(cur), "__slots__", ()):
                if hasattr(cur, slot):
                    stack.append(getattr(cur, slot))
    return total


def session_bytes(session: Session) -> int:
    shared = [
        session._ledger,
        session._store,
        session.counter,
        session.hooks,
        session._state.config,
        session.pre_compact,
        session.on_fallback,
    ]
    return held_bytes(session, shared)


def index_bytes(session: Session) -> int:
    """Bytes of the session's recall index held by its store in this process (PostgreSQL's
    warm postings, ``memory://``'s index): what a live session costs beside its object."""
    store: Any = session._store
    warm = getattr(store, "_warm", None)
    if warm is not None:
        entry = warm._held.get(session.session_id)
        return held_bytes(entry.postings) if entry is not None else 0
    stream = getattr(store, "_streams", {}).get(session.session_id)
    return held_bytes(stream.search) if stream is not None else 0


@dataclass
class Result:
    ms: dict[int, tuple[float, float]] = field(default_factory=dict)  # L -> (median, p95)
    mem: dict[int, int] = field(default_factory=dict)
    #: the recall index the store holds for the session (``index_bytes``)
    index: dict[int, int] = field(default_factory=dict)
    fill: list[float] = field(default_factory=list)
    bytes_per_event: float | None = None
    stopped: str = ""
    #: messages each request carried, turn by turn (the same-rows floor reads as many)
    carried: list[int] = field(default_factory=list)


async def run_session(
    ledger: Ledger,
    name: str,
    lengths: list[int],
    window: int,
    max_seconds: float,
    analyze: Callable[[], Awaitable[None]] | None = None,
) -> tuple[Result, Session]:
    config, token_budget = CONFIGS[name]
    session = await ledger.session(f"bench-{name}", model=MODEL, config=config)
    budget = session.budget(token_budget).available
    longest = max(lengths)
    times: list[float] = []
    result = Result()
    history = 0
    spent = 0.0
    # The fill counts each request's messages; counted afresh every turn (~800 messages,
    # ~13 ms of tokenizing between two timed turns) it slowed the timed part of the next
    # turns (3.3-3.6 ms against 1.6-2.0 at 15,000-20,000 turns, where the fill is taken):
    # each distinct message is counted once, with the session's own counter (the bench's
    # messages are role + text: the text, whose hash the string keeps, is the key).
    counted: dict[tuple[str, str], int] = {}

    def tokens(message: dict[str, Any]) -> int:
        key = (message["role"], message["content"])
        found = counted.get(key)
        if found is None:
            found = counted[key] = session.counter.count_message(message)
        return found

    for n, (user, assistant) in enumerate(messages(longest), start=1):
        if analyze is not None and analyze_due(n):
            await analyze()
        start = time.perf_counter()
        await session.add_message(user)
        await session.add_message(assistant)
        view = await session.get_messages_for_request(token_budget)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        result.carried.append(len(view))
        spent += elapsed
        history += tokens(user) + tokens(assistant)
        if n > longest // 2 and history > budget:
            result.fill.append(sum(tokens(m) for m in view) / budget)
        if n in lengths:
            last = times[-window:]
            result.ms[n] = (statistics.median(last) * 1000, _pct(last, 0.95) * 1000)
            gc.collect()
            result.mem[n] = session_bytes(session)
            result.index[n] = index_bytes(session)
            print(f"  {name:<13} {n:>6} turns  {result.ms[n][0]:8.2f} ms", file=sys.stderr)
        if spent > max_seconds and n < longest:
            result.stopped = f"stopped after {n} turns ({spent:.0f} s)"
            print(f"  {name}: {result.stopped}", file=sys.stderr)
            break
    return result, session


async def raw_floor(
    dsn: str, lengths: list[int], window: int, rows_per_turn: list[int] | None = None
) -> dict[int, float]:
    """The floor: 2 INSERTs + SELECT the last 50 (``rows_per_turn``: the last as many rows
    as our request carried at that turn, on a table of its own)."""
    table = "bench_raw" if rows_per_turn is None else "bench_raw_same"
    turns = max(lengths) if rows_per_turn is None else min(max(lengths), len(rows_per_turn))
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (id bigserial PRIMARY KEY, session_id text"
            " NOT NULL, role text NOT NULL, content jsonb NOT NULL)"
        )
        await conn.execute(
            f"CREATE INDEX IF NOT EXISTS {table}_session ON {table} (session_id, id)"
        )
        insert = f"INSERT INTO {table} (session_id, role, content) VALUES ($1, $2, $3::jsonb)"
        select = (
            f"SELECT role, content::text FROM {table} WHERE session_id = $1"
            " ORDER BY id DESC LIMIT $2"
        )

        times: list[float] = []
        out: dict[int, float] = {}
        for n, (user, assistant) in enumerate(messages(turns), start=1):
            if analyze_due(n):
                await conn.execute(f"ANALYZE {table}")
            limit = 50 if rows_per_turn is None else rows_per_turn[n - 1]
            start = time.perf_counter()
            await conn.execute(insert, "raw", "user", json.dumps(user))
            await conn.execute(insert, "raw", "assistant", json.dumps(assistant))
            rows = await conn.fetch(select, "raw", limit)
            [json.loads(r[1]) for r in reversed(rows)]
            times.append(time.perf_counter() - start)
            if n in lengths:
                out[n] = statistics.median(times[-window:]) * 1000
        return out
    finally:
        await conn.close()


async def db_bytes_per_event(dsn: str, session_id: str) -> float | None:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT (SELECT coalesce(sum(pg_column_size(e.*)), 0) FROM contextledger.events e"
            "         WHERE e.session_id = $1)"
            "     + (SELECT coalesce(sum(pg_column_size(v.*)), 0) FROM contextledger.view_items v"
            "         WHERE v.session_id = $1)"
            "     + (SELECT coalesce(sum(pg_column_size(b.*)), 0)"
            "          FROM contextledger.branch_items b WHERE b.session_id = $1)"
            "     + (SELECT coalesce(sum(pg_column_size(x.*)), 0)"
            "          FROM contextledger.event_terms x WHERE x.session_id = $1),"
            " (SELECT count(*) FROM contextledger.events WHERE session_id = $1)",
            session_id,
        )
        return float(row[0]) / row[1] if row and row[1] else None
    finally:
        await conn.close()


def table(
    store: str,
    results: dict[str, Result],
    floor: dict[int, float],
    lengths: list[int],
    same: dict[int, float] | None = None,
) -> str:
    lines = [f"### {store}", ""]
    head = "| ms per turn (median) | " + " | ".join(f"@{n:,}" for n in lengths)
    head += " | growth | fill min / mean | memory at each length | recall index | DB bytes/event |"
    lines.append(head)
    lines.append("|---|" + "---:|" * (len(lengths) + 5))
    floor_row = "| raw asyncpg floor (2 INSERTs + SELECT last 50) | "
    floor_row += " | ".join(f"{floor[n]:.2f}" if n in floor else "—" for n in lengths)
    first, last = lengths[0], lengths[-1]
    growth = f"{floor[last] / floor[first]:.2f}" if first in floor and last in floor else "—"
    lines.append(floor_row + f" | {growth} | | | | |")
    if same:
        row = "| raw floor serving the no-config request's rows (2 INSERTs + SELECT last K) | "
        row += " | ".join(f"{same[n]:.2f}" if n in same else "—" for n in lengths)
        g = f"{same[last] / same[first]:.2f}" if first in same and last in same else "—"
        lines.append(row + f" | {g} | | | | |")
    for name, r in results.items():
        cells = []
        for n in lengths:
            if n not in r.ms:
                cells.append("—")
                continue
            med = r.ms[n][0]
            ratio = f" ({med / floor[n]:.1f}x)" if n in floor else ""
            if name == "none" and same and n in same:
                ratio = ratio[:-1] + f"; {med / same[n]:.1f}x K)"
            cells.append(f"{med:.2f}{ratio}")
        g = f"{r.ms[last][0] / r.ms[first][0]:.2f}" if first in r.ms and last in r.ms else "—"
        fill = f"{min(r.fill):.2f} / {statistics.mean(r.fill):.2f}" if r.fill else "—"
        done = [n for n in lengths if n in r.mem]
        mem = " → ".join(f"{r.mem[n] / 1024:.0f}" for n in done) + " KiB" if done else "—"
        held = [n for n in lengths if r.index.get(n)]
        index = " → ".join(f"{r.index[n] / 2**20:.1f}" for n in held) + " MiB" if held else "—"
        bpe = f"{r.bytes_per_event:.0f}" if r.bytes_per_event else "—"
        extra = f" ({r.stopped})" if r.stopped else ""
        lines.append(
            f"| {name}{extra} | "
            + " | ".join(cells)
            + f" | {g} | {fill} | {mem} | {index} | {bpe} |"
        )
    return "\n".join(lines)


async def bench_store(store: str, dsn: str | None, args: argparse.Namespace) -> dict[str, Result]:
    url = "memory://" if store == "memory" else dsn
    results: dict[str, Result] = {}
    async with Ledger.open(url, migrate=store != "memory") as ledger:
        for name in args.configs:
            analyze = None
            if store != "memory" and dsn is not None:

                async def analyze(dsn: str = dsn) -> None:
                    conn = await asyncpg.connect(dsn)
                    try:
                        await conn.execute("ANALYZE")
                    finally:
                        await conn.close()

            result, _ = await run_session(
                ledger, name, args.lengths, args.window, args.max_seconds, analyze
            )
            if store != "memory" and dsn is not None:
                result.bytes_per_event = await db_bytes_per_event(dsn, f"bench-{name}")
            results[name] = result
    return results


async def tool_loop(dsn: str, history: int, loops: int, tool_ms: float) -> str:
    """What a request waits for in an agent's tool loop (no config, PostgreSQL): after a
    human turn the recall search runs in the request; after a tool's results it was started
    when the call was appended, and ran while the tool did (``tool_ms`` of sleep)."""
    async with Ledger.open(dsn, migrate=True) as ledger:
        session = await ledger.session("bench-tool-loop", model=MODEL)
        pairs = [m for pair in messages(history) for m in pair]
        for start in range(0, len(pairs), 1000):
            await session.add_messages(pairs[start : start + 1000])
        await session.get_messages_for_request()  # indexes the history once
        rng = random.Random(7)
        after_turn: list[float] = []
        after_tool: list[float] = []
        for n in range(loops):
            await session.add_message({"role": "user", "content": f"turn {n}: {_text(rng, 30)}"})
            start = time.perf_counter()
            await session.get_messages_for_request()
            after_turn.append(time.perf_counter() - start)
            grep = {"name": "grep", "arguments": json.dumps({"q": _text(rng, 3)})}
            call = {"id": f"c{n}", "type": "function", "function": grep}
            await session.add_message({"role": "assistant", "content": None, "tool_calls": [call]})
            await asyncio.sleep(tool_ms / 1000)
            await session.add_message(
                {"role": "tool", "tool_call_id": f"c{n}", "content": _text(rng, 80)}
            )
            start = time.perf_counter()
            await session.get_messages_for_request()
            after_tool.append(time.perf_counter() - start)
            await session.add_message({"role": "assistant", "content": _text(rng, 40)})
        hits = session._requests.speculation_hits
        return (
            f"### tool loop (PostgreSQL, no config, {history:,} turns of history, tool "
            f"{tool_ms:g} ms)\n\n| request ms (median / p95) | after a human turn | after the "
            f"tool's results |\n|---|---:|---:|\n| no config | "
            f"{statistics.median(after_turn) * 1000:.2f} / {_pct(after_turn, 0.95) * 1000:.2f} | "
            f"{statistics.median(after_tool) * 1000:.2f} / {_pct(after_tool, 0.95) * 1000:.2f} |"
            f"\n\nsearches started at the call and used: {hits} of {loops}"
        )


@contextlib.contextmanager
def _server(dsn: str | None) -> Iterator[str]:
    """The given server (``--dsn``: e.g. a Citus coordinator, ops/citus) or a fresh
    embedded one."""
    if dsn is not None:
        yield dsn
        return
    from bench._pg import embedded_server

    with embedded_server() as embedded:
        yield embedded


async def main_async(args: argparse.Namespace) -> None:
    with _server(args.dsn) as dsn:
        if args.tool_loop:
            print(await tool_loop(dsn, args.tool_loop, 200, args.tool_ms))
            return
        print("raw floor...", file=sys.stderr)
        floor = await raw_floor(dsn, args.lengths, args.window)
        runs = {}
        for store in args.stores:
            print(f"store {store}...", file=sys.stderr)
            runs[store] = await bench_store(store, dsn, args)
        # The no-config request carries the model's window (~800 messages at length), not
        # 50: the same rows read raw say what serving that much costs at the floor.
        same: dict[int, float] | None = None
        carried = next((r["none"].carried for r in runs.values() if "none" in r), None)
        if carried:
            print("raw floor, same rows...", file=sys.stderr)
            same = await raw_floor(dsn, args.lengths, args.window, carried)
        out = [table(st, res, floor, args.lengths, same) for st, res in runs.items()]
    print(
        f"\nbench/turns.py: model {MODEL}, strategies with token_budget {STRATEGY_BUDGET}, "
        f"median of the {args.window} turns ending at each length; "
        "(nx) = ratio to the raw floor at that length (no config: also to the same-rows"
        " floor, K)\n"
    )
    print("\n\n".join(out))
    figures = {
        "text": TEXT,
        "lengths": args.lengths,
        "floor_ms": floor,
        "same_rows_floor_ms": same,
        "runs": {
            store: {
                name: {
                    "ms_median_p95": r.ms,
                    "memory_bytes": r.mem,
                    "index_bytes": r.index,
                    "fill_min": min(r.fill) if r.fill else None,
                    "fill_mean": statistics.mean(r.fill) if r.fill else None,
                    "db_bytes_per_event": r.bytes_per_event,
                    "stopped": r.stopped,
                }
                for name, r in res.items()
            }
            for store, res in runs.items()
        },
    }
    name = "turns" if args.label is None else f"turns-{args.label}"
    print(f"\nfigures: {write_results(name, figures)}", file=sys.stderr)


def trace_to_nowhere() -> None:
    """A real SDK tracer provider whose batch processor hands spans to an exporter that
    drops them: the spans' cost in process, without a collector."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Nowhere(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Nowhere()))
    trace.set_tracer_provider(provider)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100/1,000/2,000 turns")
    parser.add_argument("--lengths", help="comma-separated turn counts")
    parser.add_argument("--stores", default="pg,memory")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument(
        "--text",
        choices=("natural", "sentences", "uniform"),
        default="natural",
        help="the messages' text: Zipf word salad, sentence-shaped small talk, or uniform",
    )
    parser.add_argument("--window", type=int, default=50, help="turns per median")
    parser.add_argument(
        "--max-seconds", type=float, default=900.0, help="stop a configuration after this long"
    )
    parser.add_argument(
        "--tool-loop",
        type=int,
        default=0,
        metavar="TURNS",
        help="instead: request latency in a tool loop after TURNS turns of history",
    )
    parser.add_argument("--tool-ms", type=float, default=5.0, help="the tool's run time")
    parser.add_argument(
        "--otel",
        action="store_true",
        help="with an OpenTelemetry SDK tracer provider (batch processor, spans dropped)",
    )
    parser.add_argument(
        "--dsn", help="an existing, empty database to use (default: a fresh embedded server)"
    )
    parser.add_argument("--label", help="figures go to bench/results/turns-LABEL.json")
    args = parser.parse_args(argv)
    if args.otel:
        trace_to_nowhere()
    global TEXT
    TEXT = args.text
    lengths = args.lengths or ("100,1000,2000" if args.quick else "100,1000,5000,20000")
    args.lengths = sorted(int(x) for x in lengths.split(","))
    args.stores = [s.strip() for s in args.stores.split(",")]
    args.configs = configs(parser, args.configs)
    asyncio.run(main_async(args))
    return 0


def configs(parser: argparse.ArgumentParser, given: str) -> list[str]:
    """``--configs a,b``: the names, each one of ``CONFIGS`` (else a usage error)."""
    names = [c.strip() for c in given.split(",")]
    for c in names:
        if c not in CONFIGS:
            parser.error(f"unknown config {c!r}; one of {', '.join(CONFIGS)}")
    return names


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
