"""LangGraph: its Postgres checkpointer against LedgerAgentMemory, one PostgreSQL.

The same one-node chat graph runs ``turns`` times on one thread: each ``ainvoke`` adds a
user message, the node (a deterministic stand-in for the model, no network) reads what
the next request needs and adds an assistant message.

- ``AsyncPostgresSaver`` (langgraph-checkpoint-postgres, LangGraph's persistent saver):
  the graph is compiled with it; each run loads the thread's state and writes
  checkpoints, the model sees every message.
- ``LedgerAgentMemory``: the graph has no checkpointer; the pre-model hook records the
  user message and hands the node the ledger's view fitted to the model's budget, the
  post-model hook records the answer.

Each store gets its own scratch database (``db_bytes``: its tables, indexes, TOAST,
after the run, less the empty schema). All ``turns`` are run for real (storage growth
is the point), so the timing rows are the median and p95 of the last ``WINDOW`` turns.

Run alone: ``.venv/bin/python bench/peers_langgraph.py [--turns 100,1000]`` (starts an
embedded PostgreSQL); ``bench/peers.py`` runs it beside the other frameworks.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

import asyncpg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph

from contextledger import Ledger
from contextledger.adapters.langchain import LedgerAgentMemory

try:
    from bench._pg import embedded_server, scratch_database
except ImportError:  # run as a script: bench/ itself is sys.path[0]
    from _pg import embedded_server, scratch_database  # type: ignore[no-redef]


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


WINDOW = 30
#: The saver stores the whole message list again at every step: quadratic bytes and
#: time (about 120 MB and 75 ms a turn at 1,000 turns, so gigabytes at 5,000). Past
#: this many turns its row is left out (said on stderr); ``PEERS_SAVER_MAX`` moves it.
SAVER_MAX = int(os.environ.get("PEERS_SAVER_MAX", "1000"))
WORDS = ("the", "build", "fails", "in", "config.py", "line", "42", "retry", "fix", "deploy")


def _text(n: int, words: int) -> str:
    return f"{n}: " + " ".join(WORDS[(n * 7 + i) % len(WORDS)] for i in range(words))


class _State(MessagesState):
    llm_input_messages: list[AnyMessage]


def _model(state: dict[str, Any]) -> dict[str, Any]:
    """The stand-in model: reads its input (what a request would carry), answers."""
    seen = state.get("llm_input_messages") or state["messages"]
    return {"messages": [AIMessage(_text(len(seen), 100))]}


def _summary(store: str, turns: int, ms: list[float], size: int) -> dict[str, object]:
    ordered = sorted(ms[-WINDOW:])
    return {
        "framework": "langgraph",
        "store": store,
        "turns": turns,
        "ms_median": statistics.median(ordered),
        "ms_p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "db_bytes": size,
    }


async def _drive(graph: Any, turns: int) -> list[float]:
    config = {"configurable": {"thread_id": "bench"}}
    ms = []
    for n in range(turns):
        t0 = time.perf_counter()
        await graph.ainvoke({"messages": [HumanMessage(_text(n, 40))]}, config)
        ms.append((time.perf_counter() - t0) * 1000)
    return ms


async def run(turns: int, dsn: str) -> list[dict[str, object]]:
    """One row per store at ``turns`` turns (see the module docstring)."""
    rows: list[dict[str, object]] = []
    if turns > SAVER_MAX:
        print(
            f"peers_langgraph: AsyncPostgresSaver not run at {turns} turns (> PEERS_SAVER_MAX="
            f"{SAVER_MAX}): its storage grows quadratically",
            file=sys.stderr,
        )
    else:
        rows.append(await _saver(turns, dsn))
    rows.append(await _ledger(turns, dsn))
    return rows


async def _saver(turns: int, dsn: str) -> dict[str, object]:
    async with scratch_database(dsn, "peers_lg_saver") as db:
        async with AsyncPostgresSaver.from_conn_string(db) as saver:
            await saver.setup()
            base = await db_bytes(db)
            graph = (
                StateGraph(MessagesState)
                .add_node("model", _model)
                .add_edge(START, "model")
                .add_edge("model", END)
                .compile(checkpointer=saver)
            )
            ms = await _drive(graph, turns)
        return _summary("AsyncPostgresSaver", turns, ms, await db_bytes(db) - base)


async def _ledger(turns: int, dsn: str) -> dict[str, object]:
    async with scratch_database(dsn, "peers_lg_ledger") as db:
        async with Ledger.open(db, migrate=True) as ledger:
            base = await db_bytes(db)
            memory = LedgerAgentMemory(ledger=ledger, model="gpt-4o")
            graph = (
                StateGraph(_State)
                .add_node("pre", memory.pre_model_hook)
                .add_node("model", _model)
                .add_node("post", memory.post_model_hook)
                .add_edge(START, "pre")
                .add_edge("pre", "model")
                .add_edge("model", "post")
                .add_edge("post", END)
                .compile()
            )
            ms = await _drive(graph, turns)
        return _summary("LedgerAgentMemory", turns, ms, await db_bytes(db) - base)


async def _main(lengths: list[int]) -> None:
    with embedded_server() as dsn:
        rows: list[dict[str, object]] = []
        for n in lengths:
            rows += await run(n, dsn)
    print(f"{'store':<24} {'turns':>6} {'ms p50':>8} {'ms p95':>8} {'db bytes':>12} {'B/turn':>9}")
    for r in rows:
        per_turn = int(r["db_bytes"]) // int(r["turns"])  # type: ignore[call-overload]
        print(
            f"{r['store']!s:<24} {r['turns']!s:>6} {r['ms_median']:>8.2f} "
            f"{r['ms_p95']:>8.2f} {r['db_bytes']!s:>12} {per_turn:>9}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="100,1000,5000")
    args = parser.parse_args()
    asyncio.run(_main([int(x) for x in args.turns.split(",")]))
