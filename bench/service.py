"""Service benchmark: appends over HTTP vs the library vs raw asyncpg, and proxy overhead.

    .venv/bin/python bench/service.py [--dsn DSN] [--appends N] [--rounds N]
                                      [--base-service DIR] [--floor] [--proxy-calls N]
                                      [--only appends|proxy] [--workers N] [--pgbouncer]
                                      [--label LABEL]

Without ``--dsn`` it runs on a fresh embedded PostgreSQL in a temporary directory.
The service runs as its own process (``contextledger serve``, as deployed); the
load comes from clients on loopback that share the service's 2 cores here, so their
CPU is taken from the service: the default ``--client wire`` writes HTTP/1.1 on
keep-alive connections itself (~0.05 ms of CPU a request; aiohttp's client took
0.32-0.36 ms, half of what the service spends on an append, and httpx's 3-4 ms).
In the same run, on the same server:

1. Appends at 1, 16 and 64 concurrent clients (one session each): throughput and
   p50/p99 latency for the service (``POST /v1/sessions/{id}/messages``), the
   library called directly (``Session.add_message``), and a raw asyncpg
   single-row INSERT of the same message JSON (the floor). Each row is ``--rounds``
   rounds, the runs of a round in an order that rotates (the machine's load changes
   within minutes: a ratio is taken against the library run of its own round, and the
   medians are reported). With ``--base-service DIR`` a second service runs the code of
   another tree (``DIR/service`` on ``PYTHONPATH``: a ``git worktree`` of main, say),
   interleaved with this one: before and after in the same rounds. With ``--floor``
   the library behind a bare ASGI app on the same server stack (bench/service_floor.py)
   runs as a third side: what the service costs above it is its HTTP layer's.
   Every run records the CPU per append of each process group from ``/proc``
   (bench/proc_cpu.py): each service side (its processes and workers), PgBouncer,
   PostgreSQL (the postmaster and its backends), the load generator (this process: the
   library's own runs too), and the whole machine (other sessions' load included), so
   the report shows where the 2 cores went.
2. Proxy overhead: p50 of ``POST /v1/chat/completions`` through the service minus
   p50 of the same request sent straight to the upstream (tests/fakellm.py,
   answering at once), for a conversation that grows by one turn per call.
3. With ``--retry-messages N``: a session of N messages written by the library, then
   its last request resent through the service (a client retry after an answer it never
   saw) ``--retries`` times: no service process built that request, so each one
   rebuilds the request the first try got (``Session.request_at``). p50 latency.

With ``--pgbouncer`` the service reaches the server through Debian's PgBouncer in
transaction mode, and the report adds what PgBouncer counted per service append and per
proxy call: server round trips (its ``query_count``: each ``Sync`` or simple query) and
transactions.

Report (markdown) to stdout, progress to stderr; the figures to
``bench/results/service[-LABEL].json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx

from contextledger import Ledger
from contextledger.store.dsn import asyncpg_dsn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._pg import embedded_server, install_sigterm_handler  # noqa: E402
from bench.proc_cpu import MACHINE, Groups, parent_of  # noqa: E402
from bench.results import write as write_results  # noqa: E402
from tests.fakellm import running_fake_llm  # noqa: E402

CLIENTS = (1, 16, 64)
MESSAGE = {
    "role": "user",
    "content": "Please summarise the quarterly report in three bullets. " * 6,
}


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_clients(
    clients: int, total: int, one: Callable[[int, int], Awaitable[None]]
) -> tuple[float, list[float]]:
    """``clients`` tasks share ``total`` appends; returns (appends/s, latencies in ms)."""
    per = max(1, total // clients)
    latencies: list[float] = []

    async def client(c: int) -> None:
        for i in range(per):
            t = time.perf_counter()
            await one(c, i)
            latencies.append((time.perf_counter() - t) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return len(latencies) / (time.perf_counter() - started), latencies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(
    dsn: str,
    port: int,
    upstream: str,
    *,
    workers: int = 1,
    pgbouncer: bool = False,
    source: str | None = None,
) -> subprocess.Popen[bytes]:
    """``contextledger serve``, of this tree's code or of ``source``'s (its ``service``
    directory first on ``PYTHONPATH``: the same interpreter and packages, other code)."""
    env = dict(
        os.environ,
        CONTEXTLEDGER_WORKERS=str(workers),
        CONTEXTLEDGER_PGBOUNCER="1" if pgbouncer else "0",
        CONTEXTLEDGER_MIGRATE="0" if pgbouncer else "1",  # migrated here, directly
        CONTEXTLEDGER_DSN=dsn,
        CONTEXTLEDGER_PORT=str(port),
        CONTEXTLEDGER_UPSTREAM_API_BASE=upstream,
        CONTEXTLEDGER_UPSTREAM_API_KEY="bench",
        CONTEXTLEDGER_POOL_SIZE="16",
        CONTEXTLEDGER_LOG_FORMAT="json",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    if source is not None:
        env["PYTHONPATH"] = str(Path(source).resolve() / "service")
    exe = Path(sys.executable).with_name("contextledger")
    return subprocess.Popen(
        [str(exe), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def start_floor(dsn: str, port: int, workers: int, pgbouncer: bool) -> subprocess.Popen[bytes]:
    """``bench/service_floor.py``: the library behind a bare ASGI app on the service's
    server stack (the floor under the service's CPU per append)."""
    cmd = [sys.executable, "-m", "bench.service_floor", dsn, str(port), str(workers)]
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    return subprocess.Popen(
        [*cmd, *(["--pgbouncer"] if pgbouncer else [])],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient() as c:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError("the service exited during startup")
            try:
                if (await c.get(f"{url}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the service did not become ready")


class Wire:
    """A load generator's HTTP/1.1 client: POSTs a JSON body on a keep-alive connection
    (one per concurrent caller, reused) and reads a ``Content-Length`` or chunked
    answer. Idle connections are dropped before uvicorn's 5 s keep-alive closes them."""

    IDLE_S = 3.0

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[tuple[float, Any, Any]]] = {}

    async def post(self, url: str, body: Any, headers: dict[str, str] | None) -> Any:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        data = json.dumps(body).encode()
        head = [
            f"POST {parts.path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Content-Type: application/json",
            f"Content-Length: {len(data)}",
            *(f"{k}: {v}" for k, v in (headers or {}).items()),
        ]
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + data
        idle = self._idle.setdefault((host, port), [])
        now = time.monotonic()
        while idle:
            used, reader, writer = idle.pop()
            if now - used < self.IDLE_S:
                break
            writer.close()
        else:
            reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        version, status_text = lines[0].split()[:2]
        status = int(status_text)
        length, chunked, close = 0, False, version == "HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                chunked = "chunked" in value
            elif name == "connection":
                close = value != "keep-alive"
        if chunked:
            pieces = []
            while size := int((await reader.readline()).split(b";")[0], 16):
                pieces.append(await reader.readexactly(size))
                await reader.readline()
            await reader.readline()
            raw = b"".join(pieces)
        else:
            raw = await reader.readexactly(length)
        if close:
            writer.close()
        else:
            idle.append((time.monotonic(), reader, writer))
        return status, json.loads(raw) if raw else None

    async def close(self) -> None:
        for conns in self._idle.values():
            for _, _, writer in conns:
                writer.close()
        self._idle.clear()


class Http:
    """A minimal POST over our own wire client, aiohttp or httpx: status and JSON body."""

    def __init__(self, kind: str, base: str) -> None:
        self.kind, self.base = kind, base
        self._client: Any = None

    async def __aenter__(self) -> Http:
        if self.kind == "wire":
            self._client = Wire()
        elif self.kind == "httpx":
            limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
            self._client = httpx.AsyncClient(limits=limits, timeout=60)
        else:
            import aiohttp

            # idle pooled connections are dropped before uvicorn's 5 s keep-alive closes
            # them (a request on one it closed failed with ServerDisconnectedError)
            connector = aiohttp.TCPConnector(limit=128, keepalive_timeout=3)
            self._client = aiohttp.ClientSession(connector=connector)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.kind == "wire":
            await self._client.close()
        else:
            await (self._client.aclose() if self.kind == "httpx" else self._client.close())

    async def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        url = path if path.startswith("http") else self.base + path
        if self.kind == "wire":
            return await self._client.post(url, body, headers)
        if self.kind == "httpx":
            r = await self._client.post(url, json=body, headers=headers)
            return r.status_code, r.json()
        async with self._client.post(url, json=body, headers=headers) as r:
            return r.status, await r.json(content_type=None)


Stats = Callable[[], dict[str, int]]


def cpu_seconds(pid: int) -> float:
    """CPU (user + system) the service's processes have used: the server and its
    workers. Per append it says what an append costs there whatever else the machine
    is running (the latencies and rates here do not)."""
    import psutil

    proc = psutil.Process(pid)
    total = 0.0
    for p in (proc, *proc.children(recursive=True)):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def per(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    """PgBouncer's round trips (queries) and transactions per operation between two
    ``SHOW STATS``."""
    return {k: (after[k] - before[k]) / n for k in ("query_count", "xact_count")}


Side = tuple[str, Http]  # a service under load: its name in the report, its client


async def bench_appends(
    dsn: str,
    sides: list[Side],
    total: int,
    rounds: int,
    groups: Groups,
    stats: Stats | None = None,
) -> list[dict[str, Any]]:
    """Per client count, ``rounds`` rounds of: each service side, the library and raw
    asyncpg, ``total`` appends each, the sides and the library in an order that rotates
    from round to round (paired and interleaved: the machine's load changes within
    minutes). Each run records its rate, latencies, the CPU per append of every process
    group (``groups``) and, behind PgBouncer, its round trips per append."""
    rows: list[dict[str, Any]] = []
    raw = await asyncpg.create_pool(asyncpg_dsn(dsn), min_size=1, max_size=64)
    await raw.execute(
        "CREATE TABLE IF NOT EXISTS bench_raw (session_id text, seq bigint, data jsonb,"
        " PRIMARY KEY (session_id, seq))"
    )
    data = json.dumps({"message": MESSAGE, "tokens": 60})
    async with Ledger.open(dsn, pool_size=32) as ledger:
        for n in CLIENTS:
            tag = f"c{n}"
            for name, http in sides:
                for k in range(n):
                    sid = f"{name}-{tag}-{k}"
                    status, _ = await http.post("/v1/sessions", {"session_id": sid})
                    assert status == 201
                    await http.post(f"/v1/sessions/{sid}/messages", {"message": MESSAGE})
            sessions = [await ledger.session(f"lib-{tag}-{k}") for k in range(n)]
            for s in sessions:  # warm the token counter and the connections
                await s.add_message(MESSAGE)

            def via_http(name: str, http: Http, tag: str = tag) -> Callable[[int, int], Any]:
                async def one(c: int, i: int) -> None:
                    status, body = await http.post(
                        f"/v1/sessions/{name}-{tag}-{c}/messages", {"message": MESSAGE}
                    )
                    if status != 201:
                        raise RuntimeError(body)

                return one

            async def via_library(c: int, i: int, sessions: list[Any] = sessions) -> None:
                await sessions[c].add_message(MESSAGE)

            seq = iter(range(1 << 40))

            async def via_raw(c: int, i: int, tag: str = tag, seq: Iterator[int] = seq) -> None:
                await raw.execute(
                    "INSERT INTO bench_raw VALUES ($1, $2, $3::jsonb)",
                    f"{tag}-{c}",
                    next(seq),
                    data,
                )

            runs: dict[str, Callable[[int, int], Any]] = {
                name: via_http(name, http) for name, http in sides
            }
            runs["library"] = via_library
            order = list(runs)
            per_round: list[dict[str, Any]] = []
            for r in range(rounds):
                k = r % len(order)
                results: dict[str, Any] = {}
                for name in [*order[k:], *order[:k], "raw"]:
                    fn = via_raw if name == "raw" else runs[name]
                    progress(f"{n} clients, round {r + 1}/{rounds}: {name}")
                    bouncer_before = stats() if stats is not None and name in dict(sides) else None
                    cpu_before = groups.snapshot()
                    started = time.perf_counter()
                    rate, lat = await run_clients(n, total, fn)
                    wall = time.perf_counter() - started
                    cpu = Groups.per_op(cpu_before, groups.snapshot(), len(lat))
                    results[name] = {"per_s": rate, "lat": lat, "cpu_ms": cpu, "wall_s": wall}
                    if bouncer_before is not None and stats is not None:
                        after = await asyncio.to_thread(stats)
                        results[name]["bouncer"] = per(bouncer_before, after, len(lat))
                per_round.append(results)
            rows.append({"clients": n, "rounds": per_round})
    await raw.close()
    return rows


async def bench_proxy(
    http: Http, upstream: str, calls: int, stats: Stats | None = None, pid: int | None = None
) -> dict[str, Any]:
    direct: list[float] = []
    before: dict[str, int] | None = None
    cpu = 0.0
    proxied: list[float] = []
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(calls + 5):
        history.append({"role": "user", "content": f"Question {i}: what next?"})
        body = {"model": "fast", "messages": history}
        t = time.perf_counter()
        status, _ = await http.post(
            f"{upstream}/chat/completions", body, {"Authorization": "Bearer bench"}
        )
        d = (time.perf_counter() - t) * 1000
        assert status == 200
        t = time.perf_counter()
        status, reply = await http.post(
            "/v1/chat/completions", body, {"X-Session-Id": "proxy-bench"}
        )
        p = (time.perf_counter() - t) * 1000
        assert status == 200, reply
        history.append(reply["choices"][0]["message"])
        if i >= 5:  # the first calls import litellm and warm the caches
            direct.append(d)
            proxied.append(p)
        if i == 4:
            await asyncio.sleep(0.05)  # the last warm-up reply's record lands
            before = await asyncio.to_thread(stats) if stats is not None else None
            cpu = cpu_seconds(pid) if pid is not None else 0.0
    await asyncio.sleep(0.05)
    cpu_ms = (cpu_seconds(pid) - cpu) * 1000 / len(proxied) if pid is not None else None
    bouncer = None
    if before is not None and stats is not None:
        await asyncio.sleep(0.05)
        bouncer = per(before, await asyncio.to_thread(stats), len(proxied))
    half = len(direct) // 2
    return {
        "bouncer": bouncer,
        "service_cpu_ms": cpu_ms,
        "direct_p50": statistics.median(direct),
        "proxy_p50": statistics.median(proxied),
        "overhead_p50": statistics.median(proxied) - statistics.median(direct),
        "overhead_of_medians": statistics.median(
            [p - d for p, d in zip(proxied, direct, strict=True)]
        ),
        # the second half: longer histories to read, and recall searching what the
        # budgeted view leaves out
        "late_overhead_p50": statistics.median(proxied[half:]) - statistics.median(direct[half:]),
        "messages": len(history),
    }


async def bench_retry(http: Http, dsn: str, messages: int, retries: int) -> dict[str, Any]:
    """A retry of the last request of a session of ``messages`` messages, in a process
    that did not build it: p50 of the proxy call (the fake upstream answers at once)."""
    history: list[dict[str, Any]] = []
    for i in range(messages):
        role = "user" if i % 2 == 0 else "assistant"
        history.append({"role": role, "content": f"turn {i}: " + "words of the turn " * 8})
    async with Ledger.open(dsn) as ledger:
        session = await ledger.session("retry-bench")
        for start in range(0, messages, 500):
            await session.add_messages(history[start : start + 500])
    retry = history[:-1]  # the client never saw the last answer
    latencies = []
    for _ in range(retries):
        t = time.perf_counter()
        status, reply = await http.post(
            "/v1/chat/completions",
            {"model": "fast", "messages": retry},
            {"X-Session-Id": "retry-bench"},
        )
        latencies.append((time.perf_counter() - t) * 1000)
        assert status == 200, reply
    return {
        "messages": messages,
        "retries": retries,
        "p50_ms": statistics.median(latencies),
        "max_ms": max(latencies),
    }


def summary(rows: list[dict[str, Any]], sides: list[str]) -> list[dict[str, Any]]:
    """Per client count: each run's median rate, pooled p50/p99, median CPU per append
    by group, and each service side over the library (the median of its per-round
    ratios, each against the library run of the same round)."""
    out = []
    for row in rows:
        rounds = row["rounds"]
        entry: dict[str, Any] = {"clients": row["clients"], "rounds": len(rounds)}
        for name in [*sides, "library", "raw"]:
            runs = [r[name] for r in rounds]
            lat = [x for run in runs for x in run["lat"]]
            groups = runs[0]["cpu_ms"].keys()
            entry[name] = {
                "per_s": statistics.median(run["per_s"] for run in runs),
                "per_s_rounds": [run["per_s"] for run in runs],
                "p50_ms": pct(lat, 0.5),
                "p99_ms": pct(lat, 0.99),
                "cpu_ms_per_append": {
                    g: statistics.median(run["cpu_ms"][g] for run in runs) for g in groups
                },
                "cpu_ms_rounds": [run["cpu_ms"] for run in runs],
                "wall_s_rounds": [run["wall_s"] for run in runs],
            }
            if runs[0].get("bouncer"):
                entry[name]["bouncer_per_append"] = {
                    k: statistics.median(run["bouncer"][k] for run in runs)
                    for k in runs[0]["bouncer"]
                }
        for name in sides:
            ratios = [r[name]["per_s"] / r["library"]["per_s"] for r in rounds]
            entry[name]["over_library_rounds"] = ratios
            entry[name]["over_library"] = statistics.median(ratios)
        out.append(entry)
    return out


def report(
    table: list[dict[str, Any]], sides: list[str], proxy: dict[str, Any] | None, total: int
) -> str:
    out = []
    if table:
        rounds = table[0]["rounds"]
        head = " | ".join(f"{s} | {s} / library | {s} CPU / append | {s} p50 / p99" for s in sides)
        out += [
            f"### Appends ({total} per run; one session per client; median of {rounds}"
            " interleaved rounds, each ratio against the library run of its round)",
            "",
            f"| clients | {head} | library | raw asyncpg | library p50 / p99 |",
            "|---:|" + "---:|" * (4 * len(sides) + 3),
        ]
    for row in table:
        cells = []
        for s in sides:
            side = row[s]
            cells.append(
                f"{side['per_s']:,.0f}/s | **{side['over_library']:.2f}x**"
                f" ({', '.join(f'{x:.2f}' for x in side['over_library_rounds'])})"
                f" | {side['cpu_ms_per_append'][s]:.3f} ms"
                f" | {side['p50_ms']:.2f} / {side['p99_ms']:.2f} ms"
            )
        lib = row["library"]
        out.append(
            f"| {row['clients']} | {' | '.join(cells)} | {lib['per_s']:,.0f}/s"
            f" | {row['raw']['per_s']:,.0f}/s | {lib['p50_ms']:.2f} / {lib['p99_ms']:.2f} ms |"
        )
    if table:
        groups = [g for g in table[0]["library"]["cpu_ms_per_append"] if g not in sides]
        own = "the service side's own processes"
        out += [
            "",
            f"CPU per append by process, ms (median over rounds; 'own' is {own}; "
            f"'{MACHINE}' is every process on the machine, other sessions' included; "
            "'cores' is what our processes kept busy over the run's wall time):",
            "",
            f"| clients | run | own | {' | '.join(groups)} | ours in all | cores |",
            "|---:|---|" + "---:|" * (len(groups) + 3),
        ]
        for row in table:
            for name in [*sides, "library", "raw"]:
                cpu = row[name]["cpu_ms_per_append"]
                mine = cpu.get(name, 0.0)
                others = [cpu[g] for g in groups]
                ours = mine + sum(cpu[g] for g in groups if g != MACHINE)
                rate = row[name]["per_s"]
                out.append(
                    f"| {row['clients']} | {name} | {mine:.3f} | "
                    + " | ".join(f"{x:.3f}" for x in others)
                    + f" | {ours:.3f} | {ours * rate / 1000:.2f} |"
                )
    bounced = [(row, s) for row in table for s in sides if row[s].get("bouncer_per_append")]
    if bounced:
        out += ["", "Through PgBouncer, per service append (its SHOW STATS):", ""]
        out += [
            f"- {row['clients']} clients, {s}: "
            f"{row[s]['bouncer_per_append']['query_count']:.2f} server round trips,"
            f" {row[s]['bouncer_per_append']['xact_count']:.2f} transactions"
            for row, s in bounced
        ]
    if proxy is None:
        return "\n".join(out)
    out += [
        "",
        "### Proxy overhead (model time excluded: same upstream answering at once)",
        "",
        f"direct to upstream p50 {proxy['direct_p50']:.2f} ms · through the proxy p50 "
        f"{proxy['proxy_p50']:.2f} ms · **overhead p50 {proxy['overhead_p50']:.2f} ms** "
        f"(median of per-call differences {proxy['overhead_of_medians']:.2f} ms); "
        f"over the second half of the calls (up to {proxy['messages']:.0f} messages) "
        f"**{proxy['late_overhead_p50']:.2f} ms**; the service's CPU per call "
        f"{proxy['service_cpu_ms'] or 0:.2f} ms",
    ]
    if proxy.get("bouncer"):
        b = proxy["bouncer"]
        out.append(
            f"\nThrough PgBouncer, per proxy call (its reply recorded included): "
            f"{b['query_count']:.2f} server round trips, {b['xact_count']:.2f} transactions"
        )
    return "\n".join(out)


async def postmaster_of(dsn: str) -> int:
    """The PostgreSQL postmaster's pid: the parent of a backend's."""
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        parent = parent_of(int(await conn.fetchval("SELECT pg_backend_pid()")))
    finally:
        await conn.close()
    assert parent is not None, "the server's processes are not visible here"
    return parent


async def main_async(
    args: argparse.Namespace,
    dsn: str,
    service_dsn: str | None = None,
    stats: Stats | None = None,
    bouncer_pid: int | None = None,
) -> None:
    """``service_dsn``: where the service connects (PgBouncer), when not ``dsn``;
    ``stats``: PgBouncer's totals, then, and ``bouncer_pid`` its process."""
    async with Ledger.open(dsn, migrate=True):
        pass
    groups = Groups()
    groups.add("postgres", await postmaster_of(dsn))
    if bouncer_pid is not None:
        groups.add("pgbouncer", bouncer_pid)
    groups.add("client", os.getpid(), tree=False)  # the load generator (and the library)
    code = {"service": None, "base": args.base_service}
    sides = [name for name, source in code.items() if name == "service" or source]
    if args.floor:
        sides.append("floor")
    with running_fake_llm() as fake:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        urls: dict[str, str] = {}
        try:
            for name in sides:
                port = free_port()
                urls[name] = f"http://127.0.0.1:{port}"
                if name == "floor":
                    procs[name] = start_floor(
                        service_dsn or dsn, port, args.workers, service_dsn is not None
                    )
                    continue
                procs[name] = start_service(
                    service_dsn or dsn,
                    port,
                    fake.base_url,
                    workers=args.workers,
                    pgbouncer=service_dsn is not None,
                    source=code[name],
                )
            for name, proc in procs.items():
                await wait_ready(urls[name], proc)
                groups.add(name, proc.pid)
            progress(f"ready: {', '.join(procs)}")
            async with Http(args.client, urls["service"]) as http:
                others = [Http(args.client, urls[name]) for name in sides[1:]]
                for other in others:
                    await other.__aenter__()
                try:
                    rows, proxy, retry = [], None, None
                    if args.only is None or args.only == "appends":
                        rows = await bench_appends(
                            dsn,
                            list(zip(sides, [http, *others], strict=True)),
                            args.appends,
                            args.rounds,
                            groups,
                            stats,
                        )
                    if args.only is None or args.only == "proxy":
                        progress("proxy overhead")
                        proxy = await bench_proxy(
                            http, fake.base_url, args.proxy_calls, stats, procs["service"].pid
                        )
                    if args.retry_messages:
                        progress(f"a retry at {args.retry_messages:,} messages")
                        retry = await bench_retry(http, dsn, args.retry_messages, args.retries)
                finally:
                    for other in others:
                        await other.__aexit__(None, None, None)
        finally:
            for proc in procs.values():
                proc.terminate()
            for proc in procs.values():
                proc.wait(timeout=30)
    table = summary(rows, sides)
    behind = ", through PgBouncer (transaction mode)" if service_dsn else ""
    base = f"; base: the service code of {args.base_service}" if args.base_service else ""
    if args.floor:
        base += "; floor: the library behind a bare ASGI app (bench/service_floor.py)"
    print(
        f"(load from {args.client} clients; {args.workers} service process(es) per side"
        f"{behind}{base}; load average {os.getloadavg()[0]:.1f} at the end)\n"
    )
    print(report(table, sides, proxy, args.appends))
    if retry is not None:
        print(
            f"\n### A retry in a process that did not build the request\n\n"
            f"{retry['messages']:,} messages: p50 {retry['p50_ms']:.1f} ms, slowest "
            f"{retry['max_ms']:.1f} ms ({retry['retries']} retries)"
        )
    name = "service" if args.label is None else f"service-{args.label}"
    doc = {
        "workers": args.workers,
        "pgbouncer": service_dsn is not None,
        "client": args.client,
        "appends_per_run": args.appends,
        "rounds": args.rounds,
        "base_service": args.base_service,
        "floor": args.floor,
        "load_average_at_end": os.getloadavg(),
        "proxy_calls": args.proxy_calls,
        "appends": table,
        "proxy": proxy,
        "retry": retry,
    }
    progress(f"figures: {write_results(name, doc)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="a PostgreSQL server to use (default: a fresh embedded one)")
    parser.add_argument("--appends", type=int, default=2048, help="appends per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per row")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run the library behind a bare ASGI app (bench/service_floor.py), paired",
    )
    parser.add_argument(
        "--base-service",
        metavar="DIR",
        help="also run this tree's service code (DIR/service, e.g. a git worktree of main),"
        " paired and interleaved with this one's",
    )
    parser.add_argument("--proxy-calls", type=int, default=200)
    parser.add_argument("--client", choices=["wire", "aiohttp", "httpx"], default="wire")
    parser.add_argument("--workers", type=int, default=1, help="service processes")
    parser.add_argument("--label", help="figures go to bench/results/service-LABEL.json")
    parser.add_argument(
        "--retry-messages", type=int, default=0, help="also time a retry at this many messages"
    )
    parser.add_argument("--retries", type=int, default=10)
    parser.add_argument(
        "--only",
        choices=["appends", "proxy", "retry"],
        help="run one part only (retry: with --retry-messages)",
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="the service through Debian's pgbouncer in transaction mode (embedded server)",
    )
    args = parser.parse_args()
    install_sigterm_handler()
    if args.pgbouncer:
        with embedded_server() as dsn, behind_pgbouncer(dsn) as (service_dsn, stats, pid):
            asyncio.run(main_async(args, dsn, service_dsn, stats, pid))
    elif args.dsn:
        asyncio.run(main_async(args, args.dsn))
    else:
        with embedded_server() as dsn:
            asyncio.run(main_async(args, dsn))


@contextmanager
def behind_pgbouncer(dsn: str) -> Iterator[tuple[str, Stats, int]]:
    """PgBouncer (tests/integration/pgbouncer.py) in front of the embedded server at
    ``dsn``: the DSN through it, as the same user, its ``SHOW STATS`` totals, its pid."""
    from urllib.parse import parse_qs

    from tests.integration.pgbouncer import running_pgbouncer

    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    host = query.get("host", [parts.hostname or "127.0.0.1"])[0]
    port = int(query.get("port", [parts.port or 5432])[0])
    user = parts.username or "postgres"
    with running_pgbouncer(host, port, [user, "contextledger_service"], pool_size=8) as bouncer:
        pid = int((bouncer.log.parent / "pgbouncer.pid").read_text().strip())
        yield bouncer.dsn(user, parts.path.lstrip("/")), lambda: bouncer.stats(user), pid


if __name__ == "__main__":
    main()
