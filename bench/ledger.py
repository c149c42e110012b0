"""Ledger benchmark: append throughput vs the raw asyncpg limit, and view-read latency.

    .venv/bin/python bench/ledger.py [--dsn DSN] [--quick] [--profile]

Without ``--dsn`` it runs against a fresh embedded PostgreSQL in a temporary
directory (stopped and removed afterwards); with ``--dsn`` it creates a scratch
database on that server and drops it afterwards. Everything is measured in one run
on the same server. The report (markdown) goes to stdout, progress to stderr.

1. Append, one session: ``Session.add_message`` one after another vs a single-row
   autocommit ``INSERT`` of the same event JSON (jsonb) plus key columns into a
   plain table over one asyncpg connection. Target: ours/raw >= 0.7.
2. Append, 32 sessions in parallel: 32 tasks on a ledger with ``pool_size=32`` vs 32
   raw connections inserting in parallel.
3. ``Session.view()`` latency for histories of 100 / 10k / 100k events whose view
   holds 50 items (49 messages + 1 summary). Target: p50(100k) / p50(100) <= 1.3.

Ours and raw run interleaved in rounds so that drift (checkpoints, autovacuum,
CPU frequency) hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import logging
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import structlog

import contextledger.store.postgres as pgstore
from contextledger.ledger import Ledger
from contextledger.session import Session
from contextledger.store.sealing import KeyRing

try:
    from bench._pg import embedded_server, install_sigterm_handler, scratch_database
    from bench.results import write as write_results
except ImportError:  # run as a script: bench/ itself is sys.path[0]
    from _pg import (  # type: ignore[no-redef]
        embedded_server,
        install_sigterm_handler,
        scratch_database,
    )
    from results import write as write_results  # type: ignore[no-redef]

PARALLEL = 32
VIEW_KEEP = 49  # messages left in the view after the summary (+ the summary = 50)
N_MESSAGES = 512  # distinct payloads, cycled
WARMUP_APPENDS = 300
RAW_SCHEMA = "bench_raw"
RAW_INSERT = (
    f"INSERT INTO {RAW_SCHEMA}.events (session_id, seq, type, data, tokens,"
    " created_at, hash) VALUES ($1, $2, 'message.appended', $3::jsonb, $4, $5, $6)"
)
FAKE_HASH = "f" * 64
APPEND_MESSAGE: str = pgstore.APPEND_MESSAGE

WORDS = (  # noqa: SIM905
    "the a of to and in is it that for on with as this be are was by at from or an have "
    "not but can will which function value return error request response model context "
    "token summary session ledger append view event database query index commit table "
    "python async await server client cache latency throughput budget message user "
    "assistant tool result file line test build deploy config schema migration payload "
    "should would could please check fix update explain why how what when where next"
).split()


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_messages(n: int, seed: int = 42) -> list[dict[str, Any]]:
    """Realistic chat turns: alternating user/assistant text, 300-500 bytes each."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        target = rng.randint(300, 500)
        words: list[str] = []
        size = 0
        while size < target:
            w = rng.choice(WORDS)
            words.append(w)
            size += len(w) + 1
        text = " ".join(words)[:target].rstrip()
        text = text[0].upper() + text[1:] + "."
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return out


def event_data(message: dict[str, Any]) -> dict[str, Any]:
    """The event JSON the ledger stores for a message (same shape, same size)."""
    return {
        "message": message,
        "critical": False,
        "tokens": len(message["content"]) // 4,
        "counter": "chars:4",
    }


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Timing:
    ops: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# -- raw asyncpg baseline ----------------------------------------------------------------


async def raw_setup(conn: asyncpg.Connection) -> None:
    await conn.execute(f"DROP SCHEMA IF EXISTS {RAW_SCHEMA} CASCADE")
    await conn.execute(f"CREATE SCHEMA {RAW_SCHEMA}")
    await conn.execute(
        f"CREATE TABLE {RAW_SCHEMA}.events (session_id text NOT NULL, seq bigint NOT NULL,"
        " type text NOT NULL, data jsonb NOT NULL, tokens integer NOT NULL,"
        " created_at timestamptz NOT NULL, hash text NOT NULL,"
        " PRIMARY KEY (session_id, seq))"
    )


class RawWriter:
    """One connection appending rows of one session: INSERT per row, autocommit."""

    def __init__(
        self, conn: asyncpg.Connection, session_id: str, datas: list[dict[str, Any]]
    ) -> None:
        self.conn = conn
        self.session_id = session_id
        self.datas = datas
        self.seq = 0

    async def run(self, n: int) -> None:
        conn, sid, datas = self.conn, self.session_id, self.datas
        for _ in range(n):
            self.seq += 1
            data = datas[self.seq % len(datas)]
            await conn.execute(
                RAW_INSERT, sid, self.seq, dumps(data), data["tokens"], datetime.now(UTC), FAKE_HASH
            )


class CteWriter:
    """The DB floor of our schema: the library's own APPEND_MESSAGE statement, sent by raw
    asyncpg with precomputed arguments (no validation, hashing, pool or locks)."""

    def __init__(
        self, conn: asyncpg.Connection, session_id: str, sql: str, datas: list[dict[str, Any]]
    ) -> None:
        self.conn = conn
        self.session_id = session_id
        self.sql = sql
        self.datas = datas
        self.seq = 1  # seq 1 is session.created
        self.last: str | None = None

    async def run(self, n: int) -> None:
        conn, sid, datas, sql = self.conn, self.session_id, self.datas, self.sql
        if self.last is None:  # appends are pinned to the previous hash, as the store's are
            self.last = await conn.fetchval(
                "SELECT last_hash FROM contextledger.sessions WHERE session_id = $1", sid
            )
        for _ in range(n):
            self.seq += 1
            data = datas[self.seq % len(datas)]
            new_hash = f"{self.seq:064x}"
            tokens = await conn.fetchval(
                sql,
                sid,
                self.seq,
                1,
                dumps(data),
                data["tokens"],
                datetime.now(UTC),
                None,
                new_hash,
                self.last,
            )
            if tokens is None:
                raise RuntimeError(f"CTE append to {sid} at seq {self.seq} matched no row")
            self.last = new_hash


class OursWriter:
    def __init__(self, session: Session, messages: list[dict[str, Any]]) -> None:
        self.session = session
        self.messages = messages
        self.i = 0

    async def run(self, n: int) -> None:
        session, messages = self.session, self.messages
        for _ in range(n):
            self.i += 1
            await session.add_message(messages[self.i % len(messages)])


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


# -- 1 + 2: appends ----------------------------------------------------------------------

Writer = OursWriter | CteWriter | RawWriter
#: ours = defaults (token counter "auto": tiktoken); ours-chars = the chars estimator, to
#: show what accurate token counting costs per append; ours-sealed = ours with a KEK:
#: content sealed under the session's data key (AES-256-GCM), what erase needs
KINDS = ("ours", "ours-sealed", "ours-chars", "cte", "raw")
#: An append with encryption on costs at most this much more than one without.
SEALED_TARGET = 1.1


async def writers_for(
    kind: str,
    ledger: Ledger,
    sealed: Ledger,
    conns: list[asyncpg.Connection],
    prefix: str,
    messages: list[dict[str, Any]],
    datas: list[dict[str, Any]],
) -> list[Writer]:
    """One writer per connection (ours: per task), each on its own fresh session."""
    out: list[Writer] = []
    for i, conn in enumerate(conns):
        sid = f"{prefix}-{kind}-{i}"
        if kind == "ours":
            out.append(OursWriter(await ledger.session(sid), messages))
        elif kind == "ours-sealed":
            out.append(OursWriter(await sealed.session(sid), messages))
        elif kind == "ours-chars":
            out.append(
                OursWriter(await ledger.session(sid, config={"token_counter": "chars"}), messages)
            )
        elif kind == "cte":
            await ledger.session(sid)  # the sessions row + session.created event
            out.append(CteWriter(conn, sid, APPEND_MESSAGE, datas))
        else:
            out.append(RawWriter(conn, sid, datas))
    return out


async def bench_append(
    ledger: Ledger,
    sealed: Ledger,
    conns: list[asyncpg.Connection],
    messages: list[dict[str, Any]],
    per_writer: int,
    rounds: int,
    label: str,
) -> dict[str, Timing]:
    """``len(conns)`` writers of each kind run in parallel; kinds take turns per round.

    Every round uses fresh sessions of ``per_writer // rounds`` appends each.
    """
    datas = [event_data(m) for m in messages]
    # Warm-up: pool connections opened, statements prepared, code paths hot.
    for kind in KINDS:
        ws = await writers_for(kind, ledger, sealed, conns, f"{label}-warm", messages, datas)
        await asyncio.gather(*(w.run(max(20, WARMUP_APPENDS // len(conns))) for w in ws))
    timings = {k: Timing() for k in KINDS}
    per = per_writer // rounds
    for r in range(rounds):
        progress(
            f"{label} append round {r + 1}/{rounds}: {len(conns)} writer(s) x {per}"
            f" appends, for each of {', '.join(KINDS)}"
        )
        order = KINDS if r % 2 == 0 else KINDS[::-1]
        for kind in order:
            ws = await writers_for(kind, ledger, sealed, conns, f"{label}-{r}", messages, datas)
            t0 = time.perf_counter()
            await asyncio.gather(*(w.run(per) for w in ws))
            timings[kind].seconds += time.perf_counter() - t0
            timings[kind].ops += per * len(ws)
    return timings


async def profile_appends(ledger: Ledger, messages: list[dict[str, Any]], n: int) -> str:
    progress(f"profiling {n} sequential add_message calls with cProfile")
    sessions = [await ledger.session(f"append-profile-{k}") for k in range(0, n, 1000)]
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for k, session in zip(range(0, n, 1000), sessions, strict=True):
        await OursWriter(session, messages).run(min(1000, n - k))
    prof.disable()
    wall = time.perf_counter() - t0
    buf = io.StringIO()
    buf.write(f"{n} appends in {wall:.2f} s under cProfile ({wall / n * 1e6:.0f} µs/op)\n")
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(45)
    return buf.getvalue()


# -- 3: view reads -----------------------------------------------------------------------


@dataclass
class ViewCase:
    history: int
    session: Session
    view_len: int = 0
    fill_s: float = 0.0
    summary_s: float = 0.0
    before: list[float] | None = None
    after: list[float] | None = None


async def fill_session(ledger: Ledger, messages: list[dict[str, Any]], history: int) -> ViewCase:
    session = await ledger.session(f"view-{history}")
    writer = OursWriter(session, messages)
    t0 = time.perf_counter()
    step = 10_000
    done = 0
    while done < history:
        k = min(step, history - done)
        await writer.run(k)
        done += k
        if history >= 2 * step:
            progress(f"  view-{history}: {done}/{history} appended")
    case = ViewCase(history, session, fill_s=time.perf_counter() - t0)
    # seq 1 is session.created; the messages are seq 2..history+1. Summarize all but
    # the last VIEW_KEEP of them.
    last = history + 1 - VIEW_KEEP
    t0 = time.perf_counter()
    await session.record_summary(
        2,
        last,
        f"Summary of turns 2..{last}: the user and the "
        "assistant discussed the ledger's append path at length.",
    )
    case.summary_s = time.perf_counter() - t0
    view = await session.view()
    case.view_len = len(view)
    if case.view_len != VIEW_KEEP + 1:
        raise SystemExit(
            f"view-{history}: expected {VIEW_KEEP + 1} view items, got {case.view_len}"
        )
    return case


async def measure_reads(cases: list[ViewCase], reads: int, warmup: int) -> list[list[float]]:
    for case in cases:
        for _ in range(warmup):
            await case.session.view()
    samples: list[list[float]] = [[] for _ in cases]
    for _ in range(reads):  # round-robin so drift affects every size alike
        for i, case in enumerate(cases):
            t0 = time.perf_counter()
            await case.session.view()
            samples[i].append(time.perf_counter() - t0)
    return samples


async def explain_buffers(conn: asyncpg.Connection, session_id: str) -> str:
    rows = await conn.fetch(
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT ord, seq, part,"
        " kind, message::text, tokens, critical FROM contextledger.view_items"
        " WHERE session_id = $1 ORDER BY ord",
        session_id,
    )
    lines = [r[0].strip() for r in rows]
    scan = next((ln for ln in lines if "Scan" in ln), lines[0])
    buffers = next((ln for ln in lines if ln.startswith("Buffers")), "")
    return f"{scan}; {buffers}".strip("; ")


# -- main --------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


SERIES = (
    ("as left by record_summary (no VACUUM/ANALYZE yet)", None),
    ("after ANALYZE view_items (dead rows still there)", "ANALYZE contextledger.view_items"),
    ("after VACUUM view_items", "VACUUM contextledger.view_items"),
)


async def run(dsn: str, args: argparse.Namespace) -> None:
    quick: bool = args.quick
    n_single = 1_000 if quick else 5_000
    per_task = 50 if quick else 250
    histories = [100, 2_000, 10_000] if quick else [100, 10_000, 100_000]
    reads = 100 if quick else 200
    rounds = 5
    messages = make_messages(N_MESSAGES)
    sizes = [len(dumps(m).encode()) for m in messages]
    started = time.perf_counter()
    load_before = os.getloadavg()

    raw = await asyncpg.connect(dsn)
    conns: list[asyncpg.Connection] = []
    try:
        server_version = await raw.fetchval("SHOW server_version")
        settings = {
            k: await raw.fetchval(f"SHOW {k}")
            for k in ("synchronous_commit", "fsync", "wal_sync_method", "shared_buffers")
        }
        if settings["synchronous_commit"] != "on":
            progress(f"WARNING: synchronous_commit is {settings['synchronous_commit']!r}")
        await raw_setup(raw)
        progress(f"opening the ledger (migrate=True, pool_size={PARALLEL})")
        async with (
            Ledger.open(dsn, migrate=True, pool_size=PARALLEL, keyring=None) as ledger,
            Ledger.open(dsn, pool_size=PARALLEL, keyring=KeyRing(os.urandom(32))) as sealed,
        ):
            assert not (await (await ledger.session("bench-probe-plain")).refresh()).sealed
            assert (await (await sealed.session("bench-probe-sealed")).refresh()).sealed
            pool_sc = await ledger.store._pool.fetchval(  # type: ignore[attr-defined]
                "SHOW synchronous_commit"
            )

            progress(f"1. single-session append: {n_single} each (ours, CTE floor, raw)")
            single = await bench_append(ledger, sealed, [raw], messages, n_single, rounds, "single")

            progress(f"2. parallel append: {PARALLEL} sessions x {per_task} each")
            conns = [await asyncpg.connect(dsn) for _ in range(PARALLEL)]
            parallel = await bench_append(ledger, sealed, conns, messages, per_task, rounds, "par")
            for c in conns:
                await c.close()
            conns = []

            prof = await profile_appends(ledger, messages, n_single) if args.profile else None

            progress(f"3. view reads: filling sessions of {histories} events")
            cases = [await fill_session(ledger, messages, h) for h in histories]
            for c in cases:
                progress(
                    f"  view-{c.history}: fill {c.fill_s:.1f}s "
                    f"({c.history / c.fill_s:,.0f}/s), record_summary "
                    f"{c.summary_s * 1000:.1f} ms, view length {c.view_len}"
                )
            series: list[tuple[str, list[list[float]], list[str]]] = []
            for title, sql in SERIES:
                if sql:
                    progress(f"  {sql}")
                    await raw.execute(sql)
                plans = [await explain_buffers(raw, c.session.session_id) for c in cases]
                progress(f"  measuring {reads} reads per size, {title}")
                series.append((title, await measure_reads(cases, reads, warmup=20), plans))
    finally:
        for c in conns:
            await c.close()
        await raw.close()
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()

    out: list[str] = []
    p = out.append
    p(f"## contextledger ledger benchmark ({'quick' if quick else 'full'})\n")
    where = f"--dsn {args.dsn_label}" if args.dsn else "embedded, fresh temp dir"
    p(
        f"* PostgreSQL {server_version} ({where});"
        f" synchronous_commit={settings['synchronous_commit']} (ledger pool: {pool_sc}),"
        f" fsync={settings['fsync']}, wal_sync_method={settings['wal_sync_method']},"
        f" shared_buffers={settings['shared_buffers']}"
    )
    p(
        f"* Machine: os.cpu_count()={os.cpu_count()}, {platform.machine()},"
        f" Python {platform.python_version()}, asyncpg {asyncpg.__version__};"
        f" load average {load_before[0]:.2f} at start, {load_after[0]:.2f} at end"
        " (other processes share the machine)"
    )
    p(
        f"* Payload: {N_MESSAGES} distinct user/assistant messages, JSON {min(sizes)}-{max(sizes)}"
        f" B (mean {statistics.mean(sizes):.0f} B). raw = single-row autocommit INSERT of the"
        " same event JSON as jsonb + session_id, seq, type, tokens, created_at, hash (PK"
        " session_id, seq) into a plain table; CTE floor = the library's own APPEND_MESSAGE"
        " statement sent by raw asyncpg with precomputed arguments"
    )
    p(
        f"* Kinds take turns in {rounds} rounds (order alternating), fresh sessions per round;"
        f" warm-up before measuring; total run {elapsed:.0f} s"
    )
    p("")
    p(
        "| append benchmark | ops each | ours ops/s | ours, chars counter | CTE floor ops/s |"
        " raw INSERT ops/s | ours / raw | ours (chars) / raw | CTE floor / raw | target |"
    )
    p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, t in (
        ("1 session, sequential", single),
        (f"{PARALLEL} sessions in parallel", parallel),
    ):
        o, oc, c, r = t["ours"], t["ours-chars"], t["cte"], t["raw"]
        ratio = o.rate / r.rate
        p(
            f"| {label} | {o.ops:,} | {o.rate:,.0f} ({o.seconds / o.ops * 1e6:.0f} µs/op) |"
            f" {oc.rate:,.0f} ({oc.seconds / oc.ops * 1e6:.0f} µs/op) |"
            f" {c.rate:,.0f} ({c.seconds / c.ops * 1e6:.0f} µs/op) |"
            f" {r.rate:,.0f} ({r.seconds / r.ops * 1e6:.0f} µs/op) | **{ratio:.2f}x** |"
            f" {oc.rate / r.rate:.2f}x | {c.rate / r.rate:.2f}x |"
            f" ≥ 0.70x {'PASS' if ratio >= 0.7 else 'FAIL'} |"
        )
    p("")
    p(
        "| append, sealed vs plain | ours ops/s | ours, sealed ops/s | sealed cost / plain"
        " | target |"
    )
    p("|---|---:|---:|---:|---:|")
    figures: dict[str, Any] = {"quick": quick, "server": server_version, "append": {}}
    for label, t in (
        ("1 session, sequential", single),
        (f"{PARALLEL} sessions in parallel", parallel),
    ):
        o, sl = t["ours"], t["ours-sealed"]
        cost = o.rate / sl.rate  # time per sealed append / time per plain append
        p(
            f"| {label} | {o.rate:,.0f} | {sl.rate:,.0f} ({sl.seconds / sl.ops * 1e6:.0f}"
            f" µs/op) | **{cost:.3f}x** | ≤ {SEALED_TARGET}x"
            f" {'PASS' if cost <= SEALED_TARGET else 'FAIL'} |"
        )
        figures["append"][label] = {
            **{k: {"ops": v.ops, "ops_per_s": round(v.rate, 1)} for k, v in t.items()},
            "ours_over_raw": round(o.rate / t["raw"].rate, 3),
            "sealed_cost_over_plain": round(cost, 3),
        }
    p("")
    for title, samples, plans in series:
        p(f"**view() read, {title}**\n")
        p("| history (events) | view items | reads | p50 ms | p95 ms | p50 / p50(smallest) |")
        p("|---:|---:|---:|---:|---:|---:|")
        base = statistics.median(samples[0])
        for c, smp in zip(cases, samples, strict=True):
            med = statistics.median(smp)
            p(
                f"| {c.history + 2:,} | {c.view_len} | {len(smp)} | {ms(med)} |"
                f" {ms(pct(smp, 0.95))} | {med / base:.2f}x |"
            )
        big = statistics.median(samples[-1]) / base
        p(
            f"\nRatio p50(history {cases[-1].history:,}) / p50(history {cases[0].history}):"
            f" **{big:.2f}x** (target ≤ 1.3x: {'PASS' if big <= 1.3 else 'FAIL'})"
        )
        for c, plan in zip(cases, plans, strict=True):
            p(f"* plan, history {c.history:,}: `{plan}`")
        p("")
    p(
        "Setup (history = N messages + session.created + summary): fill via add_message "
        + ", ".join(f"{c.history:,} msgs {c.history / c.fill_s:,.0f}/s" for c in cases)
        + "; record_summary took "
        + ", ".join(f"{c.summary_s * 1000:,.1f} ms ({c.history:,})" for c in cases)
        + "."
    )
    print("\n".join(out), flush=True)
    figures["view_read_p50_ms"] = {
        title: {
            str(c.history): statistics.median(smp) * 1000
            for c, smp in zip(cases, samples, strict=True)
        }
        for title, samples, _ in series
    }
    progress(f"figures: {write_results('ledger-quick' if quick else 'ledger', figures)}")
    if prof:
        print("\n<details><summary>cProfile of sequential add_message</summary>\n\n```")
        print(prof)
        print("```\n</details>", flush=True)


async def run_with_scratch(args: argparse.Namespace) -> None:
    async with scratch_database(args.dsn) as dsn:
        await run(dsn, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn",
        help="an existing PostgreSQL server (a scratch database is "
        "created and dropped); default: a fresh embedded PostgreSQL",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes (~30 s)")
    parser.add_argument(
        "--profile", action="store_true", help="also cProfile a sequential add_message loop"
    )
    args = parser.parse_args(argv)
    args.dsn_label = _redact(args.dsn) if args.dsn else ""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    install_sigterm_handler()
    if args.dsn:
        asyncio.run(run_with_scratch(args))
    else:
        with embedded_server() as dsn:
            asyncio.run(run(dsn, args))
    return 0


def _redact(dsn: str) -> str:
    from contextledger.store.dsn import redact

    return redact(dsn)


if __name__ == "__main__":
    sys.exit(main())
