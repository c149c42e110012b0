"""Needle benchmark: are the facts a question needs in the request view?

Run: ``.venv/bin/python bench/recall.py [--quick] [--stores memory,postgres] [--dsn URL]``.

A seeded, synthetic coding-agent session (default 1,000 turns, ~240k tokens): a
user asks, the assistant answers or calls tools (read_file, run_tests, grep,
set_config, describe_service) whose results are JSON or logs. 60 facts of ten
shapes are planted anywhere in it, stated by the user, by the assistant in prose,
inside tool-call arguments and inside tool-result JSON: ports, dated decisions,
amounts, e-mail addresses, ticket ids, file paths in assistant prose, numbers in a
markdown table, values in tool arguments and results, a vendor named in plain
prose. Ten of them change later (the old value stays in the ledger). Filler turns
mention the same services and words (ports, deploys, owners, tickets) without the
values, so a question matches many turns.

At the end, one question per fact is asked as the latest user message, phrased
differently from the fact (it shares the entity, not the sentence), and the
request view is built within a budget of 10% (and 25%) of the history. A fact
counts as recalled when its current value appears anywhere in the request; "stale
only" counts changed facts whose old value is in the request and the new one is
not. Rows: no config (truncate), priority, importance, summarize (offline
summarizer, auto_compact, a request every 10 turns so rolling summaries are written),
each with recall on (the default) and off; ``memory://`` (BM25) and embedded
PostgreSQL 18 (full-text search). ``ms/request`` is the median time of the question
requests after the first (which on PostgreSQL also indexes the whole history for the
search: nothing searched before it); ``cost`` is that time with recall over the time
without. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from contextledger import Ledger

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

SERVICES = (
    "orchard-api", "quill-indexer", "lantern-cache", "tidepool-worker", "sparrow-auth",
    "comet-gateway", "marlin-queue", "heron-db", "kestrel-search", "puffin-web",
    "otter-billing", "wren-notifier", "falcon-scheduler", "badger-reports", "ibis-export",
    "lynx-metrics", "moth-uploader", "newt-cli", "raven-proxy", "stoat-sync",
)  # fmt: skip
TOPICS = (
    "port", "deploy", "owner", "ticket", "budget", "schema", "region", "latency", "workers",
    "timeout", "decision", "vendor", "contract", "session store", "rate limiter", "config",
    "migration", "health check", "retry policy", "cache", "index", "replica", "rollout",
)  # fmt: skip
VERBS = (
    "refactored", "reviewed", "profiled", "fixed a flaky test in", "added logging to",
    "bumped the dependencies of", "wrote docs for", "looked at the dashboards of",
    "cleaned up the feature flags in", "reran the load test against",
)  # fmt: skip
VENDOR_NAMES = (
    "Bramblewood", "Quarrytech", "Saltmarsh", "Juniper Ridge", "Cobalt Fjord", "Amberlight",
    "Thistledown", "Copperleaf", "Northwind Forge", "Silverbirch",
)  # fmt: skip
VENDOR_KINDS = ("Systems", "Hosting", "Cloud", "Data", "Networks", "Compute")


@dataclass(frozen=True)
class Fact:
    kind: str
    service: str
    value: str
    question: str
    old_value: str | None = None


Messages = list[dict[str, Any]]


def _call(call_id: str, name: str, args: Mapping[str, Any], result: str) -> Messages:
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


class Planter:
    """Makes fact statements and their questions; every value is unique in the session."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()
        self.calls = 0

    def unique(self, make: Callable[[], str]) -> str:
        while True:
            value = make()
            if value not in self.used:
                self.used.add(value)
                return value

    def call_id(self) -> str:
        self.calls += 1
        return f"call_f{self.calls}"

    def statement(self, kind: str, svc: str, value: str) -> Messages:
        r = self.rng
        if kind == "port":
            return [{"role": "user", "content": f"Heads up: {svc} binds to {value} on staging."}]
        if kind == "date":
            return [
                {
                    "role": "assistant",
                    "content": f"Decision logged {value}: we freeze the {svc} schema until the"
                    " audit closes; no new columns before then.",
                }
            ]
        if kind == "amount":
            return [
                {
                    "role": "user",
                    "content": f"Finance approved {value} for the {svc} migration, "
                    "that has to cover the extra replicas too.",
                }
            ]
        if kind == "email":
            result = {"service": svc, "owner": value, "oncall": "rotation-b", "tier": 2}
            return _call(self.call_id(), "describe_service", {"name": svc}, json.dumps(result))
        if kind == "ticket":
            return [
                {
                    "role": "user",
                    "content": f"The login flakiness in {svc} is tracked as {value}; "
                    "link it in the PR.",
                }
            ]
        if kind == "path":
            return [
                {
                    "role": "assistant",
                    "content": f"Done. I moved the rate limiter of {svc} into {value} and left "
                    "a shim at the old import path.",
                }
            ]
        if kind == "arg":
            return _call(
                self.call_id(),
                "set_config",
                {"service": svc, "key": "max_workers", "value": int(value)},
                json.dumps({"ok": True, "applied": True}),
            )
        if kind == "region":
            result = {"cluster": svc, "region": value, "nodes": r.randint(3, 9)}
            return _call(self.call_id(), "describe_service", {"name": svc}, json.dumps(result))
        if kind == "table":
            rows = [f"| {s} | {r.randint(100, 900)} |" for s in r.sample(SERVICES, 3) if s != svc]
            rows.insert(r.randint(0, len(rows)), f"| {svc} | {value} |")
            table = "\n".join(["| service | p99 latency (us) |", "|---|---:|", *rows])
            return [{"role": "assistant", "content": f"Benchmark results:\n\n{table}"}]
        # vendor, in plain prose
        return [
            {
                "role": "user",
                "content": f"FYI legal signed the hosting contract for {svc} with {value} "
                "last week, so we can stop the trial.",
            }
        ]

    def value(self, kind: str) -> str:
        r = self.rng
        makers: dict[str, Callable[[], str]] = {
            "port": lambda: str(r.randint(20000, 64999)),
            "date": lambda: f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
            "amount": lambda: f"${r.randint(11, 99)},{r.randint(100, 999)}",
            "email": lambda: (
                f"{r.choice('abcdefghkmnprst')}{r.randint(100, 999)}"
                f".{r.choice(['okafor', 'lindqvist', 'moreau', 'haddad'])}@fernhill.io"
            ),
            "ticket": lambda: f"OPS-{r.randint(10000, 99999)}",
            "path": lambda: (
                f"src/{r.choice(['core', 'net', 'limits'])}/bucket_{r.randint(100, 999)}.py"
            ),
            "arg": lambda: str(r.randint(1100, 9999)),
            "region": lambda: f"eu-{r.choice(['north', 'central', 'west'])}-{r.randint(10, 99)}",
            "table": lambda: str(r.randint(10000, 99999)),
            "vendor": lambda: f"{r.choice(VENDOR_NAMES)} {r.choice(VENDOR_KINDS)}",
        }
        return self.unique(makers[kind])


QUESTIONS = {
    "port": "I need to point the health check at {svc} in staging, which port is it on?",
    "date": "Remind me when we put the {svc} schema freeze in place?",
    "amount": "How much money do we have for migrating {svc}?",
    "email": "Who is the owner of {svc}? I need their e-mail address.",
    "ticket": "Which ticket do I reference for the {svc} login issue?",
    "path": "Where does the {svc} rate limiter live now?",
    "arg": "How many max workers did we configure for {svc}?",
    "region": "Which region is {svc} running in?",
    "table": "What was the p99 latency of {svc} in the benchmark?",
    "vendor": "Which company hosts {svc} under the contract?",
}
KINDS = tuple(QUESTIONS)


def _grep_line(rng: random.Random, svc: str) -> str:
    where = f"{svc}/{rng.choice(['app', 'lib', 'tests'])}/mod_{rng.randint(1, 40)}.py"
    line, name = rng.randint(1, 400), rng.choice(TOPICS)
    return f"{where}:{line}: {name} = load_{rng.choice(TOPICS).replace(' ', '_')}()"


def _filler(rng: random.Random, n: int, call_base: int) -> Messages:
    """One filler turn: mentions services and topics, never a planted value."""
    svc, topic, verb = rng.choice(SERVICES), rng.choice(TOPICS), rng.choice(VERBS)
    ask = (
        f"Can you look at the {topic} of {svc}? I {verb} it yesterday and the "
        f"{rng.choice(TOPICS)} numbers look off (step {n})."
    )
    out: Messages = [{"role": "user", "content": ask}]
    roll = rng.random()
    if roll < 0.45:
        lines = [_grep_line(rng, svc) for _ in range(rng.randint(6, 16))]
        out += _call(
            f"call_{call_base}",
            rng.choice(["grep", "read_file", "run_tests"]),
            {"pattern": topic, "path": svc},
            "\n".join(lines),
        )
        out.append(
            {
                "role": "assistant",
                "content": f"The {topic} handling in {svc} looks fine; the {rng.choice(TOPICS)} "
                f"path retries {rng.randint(2, 9)} times before giving up. I {verb} the module "
                "and the tests pass again. " * rng.randint(1, 3),
            }
        )
    else:
        out.append(
            {
                "role": "assistant",
                "content": (
                    f"I checked the {topic} of {svc}: nothing changed since the last deploy, "
                    f"the {rng.choice(TOPICS)} is within limits and the {rng.choice(TOPICS)} "
                    f"dashboard is green. Next I will look at {rng.choice(SERVICES)}. "
                )
                * rng.randint(2, 5),
            }
        )
    return out


def build(turns: int, n_facts: int, n_changed: int, seed: int) -> tuple[list[Messages], list[Fact]]:
    """The session's turns and the facts planted in them (current value + old value)."""
    rng = random.Random(seed)
    planter = Planter(rng)
    facts: list[Fact] = []
    plants: dict[int, Messages] = {}
    slots = rng.sample(range(2, int(turns * 0.95)), n_facts + n_changed)
    pairs = [(k, s) for k in KINDS for s in SERVICES]
    rng.shuffle(pairs)
    for i, (kind, svc) in enumerate(pairs[:n_facts]):
        value = planter.value(kind)
        old = None
        at = slots[i]
        if i < n_changed:  # stated once, changed later
            old, value = value, planter.value(kind)
            first, second = sorted((slots[i], slots[n_facts + i]))
            plants.setdefault(first, []).extend(planter.statement(kind, svc, old))
            at = second
        plants.setdefault(at, []).extend(planter.statement(kind, svc, value))
        facts.append(Fact(kind, svc, value, QUESTIONS[kind].format(svc=svc), old))
    out: list[Messages] = []
    for n in range(turns):
        turn = _filler(rng, n, n)
        if n in plants:
            turn = turn[:1] + plants[n] + turn[1:]
        out.append(turn)
    rng.shuffle(facts)
    return out, facts


def _text(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, ensure_ascii=False)


#: summarize: a request every this many turns while the history is built, so rolling
#: summaries are recorded as an agent loop would record them (every turn: same
#: summaries, 10x the run time)
SUMMARIZE_EVERY = 10
CONFIGS: dict[str, dict[str, Any]] = {
    "no config": {},
    "priority": {"compaction_strategy": "priority"},
    "importance": {"compaction_strategy": "importance"},
    "summarize": {"compaction_strategy": "summarize", "auto_compact": True},
}


@dataclass
class Row:
    store: str
    config: str
    budget_pct: int
    recall: bool
    found: int
    stale_only: int
    asked: int
    changed: int
    fill: float
    ms: float  # median of the question requests after the first
    first_ms: float  # the first question request (a search indexes what is new first)


async def measure(
    ledger: Ledger,
    store: str,
    name: str,
    extra: dict[str, Any],
    pct: int,
    recall: bool,
    turns: list[Messages],
    facts: list[Fact],
    history_tokens: int,
) -> Row:
    sid = f"{name}-{pct}-{recall}".replace(" ", "_")
    config = {**extra, "recall": {"enabled": recall}}
    session = await ledger.session(sid, config=config)
    budget = max(1, history_tokens * pct // 100)
    every_turn = extra.get("compaction_strategy") == "summarize"
    await session.add_message({"role": "system", "content": "You are a careful coding agent."})
    for n, turn in enumerate(turns):
        for message in turn:
            await session.add_message(message)
        if every_turn and n % SUMMARIZE_EVERY == 0:
            await session.get_messages_for_request(token_budget=budget)
    found = stale = 0
    fill = 0.0
    times: list[float] = []
    for fact in facts:
        await session.add_message({"role": "user", "content": fact.question})
        t0 = time.perf_counter()
        request = await session.get_messages_for_request(token_budget=budget)
        times.append(time.perf_counter() - t0)
        text = _text(request)
        fill += sum(session.counter.count_message(m) for m in request) / budget
        has_new = fact.value in text
        found += has_new
        if fact.old_value is not None and fact.old_value in text and not has_new:
            stale += 1
        await session.add_message({"role": "assistant", "content": "Let me check that."})
    changed = sum(f.old_value is not None for f in facts)
    return Row(
        store,
        name,
        pct,
        recall,
        found,
        stale,
        len(facts),
        changed,
        fill / len(facts),
        statistics.median(times[1:] or times) * 1000,
        times[0] * 1000,
    )


async def run_store(
    dsn: str, store: str, args: argparse.Namespace, turns: list[Messages], facts: list[Fact]
) -> list[Row]:
    rows: list[Row] = []
    migrate = None if dsn == "memory://" else True
    async with Ledger.open(dsn, migrate=migrate) as ledger:
        probe = await ledger.session("probe")
        history_tokens = sum(probe.counter.count_message(m) for t in turns for m in t)
        print(
            f"# {store}: {len(turns)} turns, {sum(len(t) for t in turns)} messages, "
            f"{history_tokens} tokens of history, {len(facts)} questions",
            flush=True,
        )
        for pct in args.budgets:
            for name, extra in CONFIGS.items():
                if name not in args.configs:
                    continue
                for recall in (True, False):
                    row = await measure(
                        ledger, store, name, extra, pct, recall, turns, facts, history_tokens
                    )
                    rows.append(row)
                    print(_line(row), flush=True)
    return rows


def _line(r: Row) -> str:
    return (
        f"| {r.store} | {r.config} | {r.budget_pct}% | {'on' if r.recall else 'off'} | "
        f"{100 * r.found / r.asked:.0f}% ({r.found}/{r.asked}) | {r.stale_only}/{r.changed} | "
        f"{100 * r.fill:.0f}% | {r.ms:.1f} | {r.first_ms:.0f} |"
    )


HEADER = (
    "| store | config | budget | recall | asked facts in request | stale only | fill | "
    "ms/request | first request, ms |\n|---|---|---:|---|---:|---:|---:|---:|---:|"
)


def summary(rows: list[Row]) -> None:
    print("\n## cost of recall (ms/request with recall / without)")
    for r in rows:
        if not r.recall:
            continue
        off = next(
            o
            for o in rows
            if (o.store, o.config, o.budget_pct, o.recall)
            == (r.store, r.config, r.budget_pct, False)
        )
        print(f"- {r.store} {r.config} {r.budget_pct}%: {r.ms / off.ms if off.ms else 0:.2f}x")


async def main_async(args: argparse.Namespace, pg_dsn: str | None) -> None:
    turns, facts = build(args.turns, args.facts, args.changed, args.seed)
    print(HEADER)
    rows: list[Row] = []
    if "memory" in args.stores:
        rows += await run_store("memory://", "memory", args, turns, facts)
    if pg_dsn is not None:
        if args.dsn:
            async with scratch_database(pg_dsn) as dsn:
                rows += await run_store(dsn, "postgres", args, turns, facts)
        else:
            rows += await run_store(pg_dsn, "postgres", args, turns, facts)
    summary(rows)
    if not args.quick:
        name = (
            "recall"
            if args.configs == list(CONFIGS)
            else "recall-" + "-".join(c.replace(" ", "_") for c in args.configs)
        )
        run = {"turns": args.turns, "facts": args.facts, "changed": args.changed}
        path = write_results(name, {**run, "rows": [asdict(r) for r in rows]})
        print(f"\nfigures: {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 turns, 20 facts, 10%% only")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--facts", type=int, default=60)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--stores", default="memory,postgres")
    parser.add_argument("--dsn", help="an existing PostgreSQL server (a scratch database)")
    parser.add_argument("--budgets", default="10,25")
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help="comma-separated rows, e.g. summarize"
    )
    args = parser.parse_args(argv)
    args.budgets = [int(b) for b in args.budgets.split(",")]
    args.configs = [c.strip() for c in args.configs.split(",")]
    if args.quick:
        args.turns, args.facts, args.changed, args.budgets = 300, 20, 4, [10]
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    install_sigterm_handler()
    if "postgres" not in args.stores:
        asyncio.run(main_async(args, None))
    elif args.dsn:
        asyncio.run(main_async(args, args.dsn))
    else:
        with embedded_server() as dsn:
            asyncio.run(main_async(args, dsn))
    return 0


if __name__ == "__main__":
    sys.exit(main())
