"""The portability lint (tests/portability.py) on the migrated schema and the package's
statements, and proof that each of its rules catches what it is for. Runs everywhere (no
Citus needed): the schema is read from the test server's catalogs, so a session table
added by a later migration is checked the day it lands."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from contextledger import Ledger
from contextledger.store.dsn import asyncpg_dsn
from tests.portability import (
    CROSS_SESSION,
    FOREIGN_WITHOUT_SESSION,
    FUNCTIONS,
    SESSION_TABLES,
    UNIQUE_WITHOUT_SESSION,
    Statement,
    function_problems,
    statement_problems,
    statements,
)

REFERENCE = ["api_keys"]  # migration 0014's REFERENCE_TABLES


async def _session_tables(conn: asyncpg.Connection) -> list[str]:
    return [r[0] for r in await conn.fetch(SESSION_TABLES)]


async def _schema_problems(conn: asyncpg.Connection) -> list[str]:
    tables = await _session_tables(conn)
    rows = await conn.fetch(UNIQUE_WITHOUT_SESSION, tables)
    rows += await conn.fetch(FOREIGN_WITHOUT_SESSION, tables, REFERENCE)
    functions = [(r[0], r[1]) for r in await conn.fetch(FUNCTIONS)]
    return [r[0] for r in rows] + function_problems(functions)


async def test_the_schema_is_distributable(pg_dsn: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        tables = await _session_tables(conn)
        assert {"sessions", "events", "view_items", "branch_items", "purges"} <= set(tables)
        assert await _schema_problems(conn) == []
    finally:
        await conn.close()


async def test_every_statement_names_one_session_and_sets_nothing_for_the_session(
    pg_dsn: str,
) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        tables = set(await _session_tables(conn)) | {"event_embeddings"}  # made at run time
    finally:
        await conn.close()
    found = list(statements())
    assert len(found) > 40  # the extraction reads the store's statements at all
    assert statement_problems(found, tables) == []


def _st(sql: str, module: str = "contextledger.store.postgres") -> Statement:
    return Statement(module, 1, " ".join(sql.split()))


@pytest.mark.parametrize(
    ("sql", "complaint"),
    [
        ("SELECT seq FROM contextledger.events WHERE seq = $1", "without `session_id = $n`"),
        (
            "UPDATE contextledger.sessions SET head = 0 WHERE session_id = ANY($1)",
            "without `session_id = $n`",
        ),
        (
            "INSERT INTO contextledger.view_items (gen, session_id) VALUES ($1, 'x')",
            "without `session_id = $n`",
        ),
        ("SET contextledger.tenant = 'a'", "for the session"),
        ("BEGIN; RESET contextledger.tenant", "for the session"),
        ("SELECT set_config('contextledger.tenant', 'a', false)", "for the session"),
    ],
)
def test_the_statement_rules_catch(sql: str, complaint: str) -> None:
    problems = statement_problems([_st(sql)], {"sessions", "events", "view_items"}, {})
    assert len(problems) == 1 and complaint in problems[0]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT seq FROM contextledger.events WHERE session_id = $1 AND seq = $2",
        "INSERT INTO contextledger.view_items (gen, session_id) VALUES ($1, $2)",
        "BEGIN; SET LOCAL contextledger.tenant = E'a'",
        "SELECT version_num FROM contextledger.alembic_version",
        "SELECT to_regclass('contextledger.sessions') IS NOT NULL",
        "UPDATE contextledger.api_keys SET revoked_at = now() WHERE key_id = $1",
    ],
)
def test_the_statement_rules_pass(sql: str) -> None:
    assert statement_problems([_st(sql)], {"sessions", "events", "view_items"}, {}) == []


def test_a_stale_exception_is_reported() -> None:
    problems = statement_problems([], {"events"}, dict(list(CROSS_SESSION.items())[:1]))
    assert len(problems) == 1 and "no longer exists" in problems[0]


async def test_the_schema_rules_catch(pg_dsn: str) -> None:
    """A later migration's mistakes, made here: each rule reports its own."""
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        await conn.execute("""
            CREATE TABLE contextledger.forks (
                session_id text NOT NULL, parent text NOT NULL, tenant_id text NOT NULL,
                n bigint UNIQUE,
                PRIMARY KEY (session_id, tenant_id),
                FOREIGN KEY (parent, tenant_id)
                    REFERENCES contextledger.sessions (session_id, tenant_id));
            CREATE FUNCTION contextledger.mark(p text) RETURNS void LANGUAGE plpgsql AS
                $$ BEGIN PERFORM set_config('contextledger.purging', p, true); END $$;
            CREATE FUNCTION contextledger.pin() RETURNS void LANGUAGE plpgsql AS
                $$ BEGIN
                   SET plan_cache_mode = force_generic_plan; END $$;
        """)
        problems = await _schema_problems(conn)
    finally:
        await conn.close()
    assert len(problems) == 4, problems
    assert any("forks_n_key" in p for p in problems)  # unique without session_id
    assert any("FOREIGN KEY (parent, tenant_id)" in p for p in problems)  # parent != own
    assert any("mark(text) calls set_config()" in p for p in problems)
    assert any("pin() sets a setting for the session" in p for p in problems)


async def test_0014_on_plain_postgresql_and_back(pg_dsn: str) -> None:
    """Without Citus, 0014 only drops the global unique index and makes the purge mark a
    SET LOCAL (which the trigger still honours: a purge works, a delete does not); its
    downgrade restores 0011's schema, and upgrading again is clean."""
    from alembic import command

    from contextledger.store.migrate import alembic_config, head_revision

    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    purge_src = "SELECT prosrc FROM pg_proc WHERE proname = 'purge_session'"
    position = "SELECT to_regclass('contextledger.events_position')"
    try:
        assert await conn.fetchval(position) is None
        assert "SET LOCAL contextledger.purging" in await conn.fetchval(purge_src)
        async with Ledger.open(pg_dsn) as ledger:
            session = await ledger.session("gone")
            await session.add_message({"role": "user", "content": "x"})
            with pytest.raises(asyncpg.RaiseError, match="append-only"):
                await conn.execute("DELETE FROM contextledger.events WHERE session_id = 'gone'")
            assert await ledger.store.purge("gone", "test") == 2
        assert await conn.fetchval("SELECT count(*) FROM contextledger.events") == 0
        await asyncio.to_thread(command.downgrade, alembic_config(pg_dsn), "0011")
        assert await conn.fetchval(position) is not None
        assert "set_config('contextledger.purging'" in await conn.fetchval(purge_src)
        await asyncio.to_thread(command.upgrade, alembic_config(pg_dsn), "head")
        assert await conn.fetchval(position) is None
        assert await conn.fetchval("SELECT version_num FROM contextledger.alembic_version") == (
            head_revision()
        )
        tenant = "tenant_id = (SELECT contextledger.current_tenant())"  # 0016
        assert tenant in await conn.fetchval(purge_src)
    finally:
        await conn.close()


async def test_the_append_functions_answer_as_the_statements_do(pg_dsn: str) -> None:
    """0014's append functions (what the store calls on Citus), here on plain PostgreSQL:
    a stale head or hash writes nothing and answers NULL; the right one appends and
    answers the new view_tokens, as APPEND_MESSAGE and APPEND_SESSION_MESSAGES do."""
    from datetime import UTC, datetime

    from contextledger.store.postgres.statements import (
        APPEND_MESSAGE_CALL,
        APPEND_SESSION_MESSAGES_CALL,
    )

    async with Ledger.open(pg_dsn) as ledger:
        await (await ledger.session("f")).add_message({"role": "user", "content": "x"})
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    now = datetime.now(UTC)
    try:
        head, last, tokens = await conn.fetchrow(
            "SELECT head, last_hash, view_tokens FROM contextledger.sessions WHERE session_id = 'f'"
        )
        data = '{"message": {"role": "user", "content": "y"}}'
        stale = ("f", head + 1, 1, data, 5, now, None, "h1", "not-the-hash")
        assert await conn.fetchval(APPEND_MESSAGE_CALL, *stale) is None
        assert await conn.fetchval(APPEND_MESSAGE_CALL, "f", head + 1, 1, data, 5, now,
                                   "k1", "h1", last) == tokens + 5  # fmt: skip
        many = ("f", head + 1, [head + 2, head + 3], [1, 1], [data, data], [2, 3], now,
                ["h2", "h3"], "h3", 5, [None, None])  # fmt: skip
        assert await conn.fetchval(APPEND_SESSION_MESSAGES_CALL, *many, "h0") is None
        assert await conn.fetchval(APPEND_SESSION_MESSAGES_CALL, *many, "h1") == tokens + 10
        rows = await conn.fetch(
            "SELECT seq, hash, idempotency_key, tokens FROM contextledger.events"
            " WHERE session_id = 'f' AND seq > $1 ORDER BY seq",
            head,
        )
        assert [tuple(r) for r in rows] == [
            (head + 1, "h1", "k1", 5),
            (head + 2, "h2", None, 2),
            (head + 3, "h3", None, 3),
        ]
        assert (
            await conn.fetchval("SELECT head FROM contextledger.sessions WHERE session_id = 'f'")
            == head + 3
        )
    finally:
        await conn.close()


async def test_the_batch_append_function_answers_as_the_statement_does(pg_dsn: str) -> None:
    """0017's ``append_messages`` (the batch behind PgBouncer) and ``APPEND_MESSAGES``, on
    twin sessions: the same rows back (each session appended to, its new view_tokens; a
    stale head writes nothing) and the same events written. Its plan is generic, made
    once per server session (a statement there was planned at every run)."""
    from datetime import UTC, datetime

    from contextledger.store.postgres.statements import APPEND_MESSAGES, APPEND_MESSAGES_CALL

    async with Ledger.open(pg_dsn) as ledger:
        for name in ("a", "b", "c", "d"):
            await (await ledger.session(name)).add_message({"role": "user", "content": name})
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    now = datetime.now(UTC)
    data = '{"message": {"role": "user", "content": "y"}}'
    try:
        answers, written = [], []
        for sql, (good, stale) in (
            (APPEND_MESSAGES, ("a", "b")),
            (APPEND_MESSAGES_CALL, ("c", "d")),
        ):
            heads = {
                r[0]: (r[1], r[2], r[3])
                for r in await conn.fetch(
                    "SELECT session_id, head, last_hash, view_tokens FROM contextledger.sessions"
                )
            }
            (gh, gl, gt), (sh, _, _) = heads[good], heads[stale]
            rows = [
                (good, gh + 1, 1, data, 5, now, "k", "h1", gl),
                (stale, sh + 1, 1, data, 5, now, None, "h1", "not-the-hash"),
            ]
            columns = [list(c) for c in zip(*rows, strict=True)]
            if sql == APPEND_MESSAGES:  # (and whether to lex each message: ``warm.py``)
                columns += [[False, False], [None, None]]
            got = await conn.fetch(sql, *columns)
            answers.append([(r[0] == good, r[1] - gt) for r in got])
            written.append(
                [
                    tuple(r)
                    for r in await conn.fetch(
                        "SELECT session_id = $1, seq, hash, idempotency_key, tokens"
                        " FROM contextledger.events WHERE session_id = ANY($2) AND seq > 2"
                        " ORDER BY 1, 2",
                        good,
                        [good, stale],
                    )
                ]
            )
        assert answers[0] == answers[1] == [(True, 5)]
        assert written[0] == written[1] == [(True, 3, "h1", "k", 5)]
        config = await conn.fetchval(
            "SELECT proconfig FROM pg_proc WHERE proname = 'append_messages'"
        )
        assert config == ["plan_cache_mode=force_generic_plan"]
    finally:
        await conn.close()
