"""On a real Citus cluster (``ops/citus test``; collected only where
``CONTEXTLEDGER_TEST_CITUS_WORKERS`` names the workers, see conftest.py): the layout
0014 makes, every statement of a session's life single-shard, the start-up check."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from contextledger import ConfigError, Ledger
from contextledger.store.dsn import asyncpg_dsn
from contextledger.store.postgres import APPEND_MESSAGE_CALL, READ_VIEW, PostgresStore
from tests.integration.citus import workers_from_env


async def test_session_tables_are_colocated_and_keys_are_reference(pg_dsn: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        rows = await conn.fetch(
            "SELECT logicalrelid::regclass::text AS t, partmethod::text, colocationid,"
            " column_to_column_name(logicalrelid, partkey) AS col"
            " FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE 'contextledger.%'"
        )
        tables = {r["t"].split(".")[1]: r for r in rows}
        session = {t for t, r in tables.items() if r["partmethod"] == "h"}
        assert {"sessions", "events", "view_items", "branch_items", "purges"} <= session
        assert {tables[t]["col"] for t in session} == {"session_id"}
        assert len({tables[t]["colocationid"] for t in session}) == 1  # co-located
        assert tables["api_keys"]["partmethod"] == "n"  # reference table
        assert "alembic_version" not in tables
        assert await conn.fetchval("SHOW citus.propagate_set_commands") == "local"
    finally:
        await conn.close()


async def _tasks(conn: asyncpg.Connection, sql: str, *args: Any) -> list[str]:
    plan = await conn.fetch("EXPLAIN (COSTS OFF) " + sql, *args)
    return [r[0].strip() for r in plan if "Task Count" in r[0]]


async def test_explain_shows_one_task_for_the_append_and_the_view(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("explained")
        await session.add_message({"role": "user", "content": "hello"})
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        head, last = await conn.fetchrow(
            "SELECT head, last_hash FROM contextledger.sessions WHERE session_id = $1",
            "explained",
        )
        now = datetime.now(UTC)
        row = ("explained", head + 1, 1, '{"message": {}}', 1, now, None, "h", last)
        append = await _tasks(conn, APPEND_MESSAGE_CALL, *row)
        assert append == ["Task Count: 1"]
        assert await _tasks(conn, READ_VIEW, "explained") == ["Task Count: 1"]
    finally:
        await conn.close()


async def test_a_session_s_whole_life_is_single_shard(pg_dsn: str) -> None:
    """With ``citus.multi_task_query_log_level = error`` any statement that needs more
    than one shard fails: a session's appends (one and many), requests with recall,
    checkpoints, a rollback, a compaction and the purge function all run. The store's
    purge first looks for forks standing on the session, which may live on any shard
    (listed in ``tests/portability.py``'s CROSS_SESSION): that runs with the guard off."""
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        name = await conn.fetchval("SELECT current_database()")
        await conn.execute(f'ALTER DATABASE "{name}" SET citus.multi_task_query_log_level = error')
    finally:
        await conn.close()
    async with Ledger.open(pg_dsn) as ledger:
        for sid in ("a", "b", "c"):
            session = await ledger.session(sid)
            await session.add_message({"role": "system", "content": "be brief"})
            for n in range(30):
                await session.add_message({"role": "user", "content": f"the port is {n} ok"})
                await session.add_message({"role": "assistant", "content": f"noted {n}"})
            await session.add_messages(
                [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
            )
            point = await session.checkpoint("here")
            await session.add_message({"role": "user", "content": "which port was 7?"})
            request = await session.get_messages_for_request(token_budget=200)
            assert request
            await session.rollback(point)
            assert (await session.get_messages())[-1]["content"] == "y"
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        async with conn.transaction():  # as the store runs it: SET LOCAL reaches the workers
            assert await conn.fetchval("SELECT contextledger.purge_session('b', 'test')") > 0
    finally:
        await conn.close()
    cross = asyncpg_dsn(pg_dsn) + "&citus.multi_task_query_log_level=off"
    async with Ledger.open(cross) as ledger:
        assert await ledger.store.purge("c", "test") > 0
    with pytest.raises(asyncpg.PostgresError, match="multi-task"):
        conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
        try:  # the guard itself works: a statement over every shard is refused
            await conn.fetchval("SELECT count(*) FROM contextledger.events")
        finally:
            await conn.close()


async def test_start_refuses_a_cluster_without_set_propagation(pg_dsn: str) -> None:
    """The tenant and the purge mark are SET LOCAL: without propagation the workers would
    not see them, so the store refuses to start, naming the setting."""
    dsn = asyncpg_dsn(pg_dsn) + "&citus.propagate_set_commands=none"
    with pytest.raises(ConfigError, match=r"citus\.propagate_set_commands") as caught:
        await PostgresStore.connect(dsn)
    assert caught.value.details["key"] == "citus.propagate_set_commands"
    store = await PostgresStore.connect(asyncpg_dsn(pg_dsn))
    try:
        assert store.citus is not None and store.citus.version.startswith("13.")
    finally:
        await store.close()


async def test_tenants_stay_apart_on_the_workers(pg_dsn: str) -> None:
    """Row-level security runs on the worker holding the shard: the tenant set per
    transaction (SET LOCAL, propagated) reaches it."""
    from contextledger.http.keys import create_key

    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        await create_key(conn, "alpha", "k")
    finally:
        await conn.close()
    from contextledger.store.dsn import with_user

    login = with_user(asyncpg_dsn(pg_dsn), "contextledger_service")
    async with Ledger.open(login, tenant="alpha") as alpha:
        await (await alpha.session("s")).add_message({"role": "user", "content": "alpha's"})
    async with Ledger.open(login, tenant="beta") as beta:
        s = await beta.session("s")  # the same id, another tenant: its own session
        await s.add_message({"role": "user", "content": "beta's"})
        assert [m["content"] for m in await s.get_messages()] == ["beta's"]
    async with Ledger.open(login, tenant="alpha") as alpha:
        got = await (await alpha.session("s")).get_messages()
        assert [m["content"] for m in got] == ["alpha's"]


async def _worker_statements(database: str) -> Counter[str]:
    """Top-level statements each worker ran in ``database`` so far, by text
    (pg_stat_statements, which ``ops/citus`` preloads; read from each worker's
    ``postgres`` database: a worker's Citus database refuses ``CREATE EXTENSION``)."""
    ran: Counter[str] = Counter()
    for host, port in workers_from_env():
        conn = await asyncpg.connect(host=host, port=port, user="postgres", database="postgres")
        try:
            loaded = await conn.fetchval("SHOW shared_preload_libraries")
            assert "pg_stat_statements" in loaded, f"restart with `ops/citus start` ({loaded})"
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            for row in await conn.fetch(
                "SELECT query, calls FROM pg_stat_statements WHERE toplevel AND dbid ="
                " (SELECT oid FROM pg_database WHERE datname = $1)",
                database,
            ):
                ran[row["query"]] += row["calls"]
        finally:
            await conn.close()
    return ran


async def test_a_search_is_one_call_on_the_session_s_worker(pg_dsn: str) -> None:
    """Migration 0018: a search (live, or a replay's) is one call of
    ``contextledger.search_messages``, which Citus sends whole to the worker holding the
    session's shard; the coordinator sends that worker no statement of the search
    itself (on ``event_terms``: its postings, and its catch-up's insert), and the call
    stored the postings it indexed."""
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        database = await conn.fetchval("SELECT current_database()")
    finally:
        await conn.close()
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("searched", config={"token_counter": "chars"})
        await session.add_message({"role": "user", "content": "the gateway port is 18443"})
        for n in range(30):
            await session.add_message({"role": "user", "content": f"tidy module {n} please"})
            await session.add_message({"role": "assistant", "content": f"module {n} done"})
        await session.add_message({"role": "user", "content": "which gateway port again?"})
        before = await _worker_statements(database)
        live = await session.get_messages_for_request(token_budget=200)
        replayed = await session.request_at(session.request_seq, token_budget=200)
        after = await _worker_statements(database)
        head = session.head
    assert replayed == live and "18443" in str(live)  # found, by both searches
    ran = after - before
    calls = {q: n for q, n in ran.items() if "search_messages" in q}
    assert list(calls.values()) == [2], ran
    assert not [q for q in ran if "event_terms" in q], ran
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        indexed = await conn.fetchval(
            "SELECT max(seq) FROM contextledger.event_terms"
            " WHERE session_id = 'searched' AND lexeme = ''"
        )
        assert indexed == head
    finally:
        await conn.close()
