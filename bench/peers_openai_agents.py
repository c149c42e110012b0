"""OpenAI Agents SDK: its default database store against ``LedgerSession``, one turn loop.

A turn: ``add_items`` the user's message, ``add_items`` the assistant's reply (a
Responses output message, as the SDK saves it), then ``get_items()`` — what the Runner
reads before the next request. Three stores on the same PostgreSQL:

* ``SQLAlchemySession`` (the SDK's database session; asyncpg driver, tables created
  by the SDK, its default of reading the whole history);
* ``LedgerSession`` reading the whole history (the view);
* ``LedgerSession(token_budget=8000)``: the budget-fitted view, with recall (the
  default: the turns left out are searched for the latest one, in PostgreSQL) and
  without it (``recall.enabled: false``).

``db_bytes`` is the size of the session's rows in every table the store writes
(``pg_column_size``; indexes are not counted for either side).
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

FRAMEWORK = "openai-agents"
WORDS = (
    "the", "build", "fails", "in", "config.py", "parse_args", "line", "42", "retry",
    "userId", "ok", "check", "value", "fix", "deploy", "cache", "token", "review",
)  # fmt: skip
WINDOW = 100  # ms figures: the turns ending at the length


def items(turns: int, seed: int = 5) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Deterministic (user item, assistant item) pairs, as the SDK stores them."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    out = []
    for n in range(turns):
        user = {"role": "user", "content": f"turn {n}: " + text(rng.randint(20, 70))}
        reply = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text(rng.randint(60, 160)),
                         "annotations": []}],
        }  # fmt: skip
        out.append((user, reply))
    return out


async def _loop(session: Any, turns: int) -> tuple[float, float]:
    times: list[float] = []
    for user, reply in items(turns):
        start = time.perf_counter()
        await session.add_items([user])
        await session.add_items([reply])
        history = await session.get_items()
        times.append(time.perf_counter() - start)
        assert history[-1] == reply
    last = sorted(times[-WINDOW:])
    return statistics.median(last) * 1000, last[min(len(last) - 1, int(0.95 * len(last)))] * 1000


async def _row_bytes(dsn: str, queries: list[str], session_id: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return sum([int(await conn.fetchval(q, session_id) or 0) for q in queries])
    finally:
        await conn.close()


SDK_ROWS = [
    "SELECT sum(pg_column_size(t.*)) FROM agent_messages t WHERE session_id = $1",
    "SELECT sum(pg_column_size(t.*)) FROM agent_sessions t WHERE session_id = $1",
]
LEDGER_ROWS = [
    f"SELECT sum(pg_column_size(t.*)) FROM contextledger.{table} t WHERE session_id = $1"
    for table in ("events", "view_items", "branch_items", "sessions")
]


async def run(turns: int, dsn: str) -> list[dict[str, object]]:
    """One row per store: per-turn ms (median, p95 of the last turns) and the DB bytes."""
    from agents.extensions.memory import SQLAlchemySession

    from contextledger import Ledger
    from contextledger.adapters.openai_agents import LedgerSession

    rows: list[dict[str, object]] = []
    tag = uuid.uuid4().hex[:8]

    async def measure(store: str, session: Any, bytes_of: Callable[[], Awaitable[int]]) -> None:
        median, p95 = await _loop(session, turns)
        rows.append(
            {
                "framework": FRAMEWORK,
                "store": store,
                "turns": turns,
                "ms_median": median,
                "ms_p95": p95,
                "db_bytes": await bytes_of(),
            }
        )

    sdk_id = f"sdk-{tag}"
    url = dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
    sdk = SQLAlchemySession.from_url(sdk_id, url=url, create_tables=True)
    try:
        await measure(
            "SQLAlchemySession (SDK default)", sdk, lambda: _row_bytes(dsn, SDK_ROWS, sdk_id)
        )
    finally:
        await sdk._engine.dispose()

    async with Ledger.open(dsn) as ledger:
        for store, budget, config in (
            ("LedgerSession (whole history)", None, None),
            ("LedgerSession (token_budget=8000)", 8000, None),
            ("LedgerSession (token_budget=8000, recall off)", 8000, {"recall": {"enabled": False}}),
        ):
            sid = f"ledger-{len(rows)}-{tag}"
            session = LedgerSession(
                sid, ledger=ledger, token_budget=budget, model="gpt-4o", config=config
            )
            await measure(store, session, lambda sid=sid: _row_bytes(dsn, LEDGER_ROWS, sid))
    return rows
