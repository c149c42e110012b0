"""The PostgreSQL store's shared SQL: append and read statements, and the row mappers.

The search's SQL is in ``search.py``, the embeddings' in ``vectors.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg
import structlog

from contextledger.core.encoding import dumps
from contextledger.core.events import Event, decode
from contextledger.core.units import result_ids
from contextledger.core.view import ORD_STRIDE, ViewItem
from contextledger.errors import SessionErased, SessionNotEncrypted
from contextledger.store.base import (
    SessionInfo,
)
from contextledger.store.postgres.lexemes import LEXED, QUERY_LEXEMES
from contextledger.store.sealing import Sealer, is_sealed_message

log = structlog.get_logger(__name__)
S = "contextledger"
_RETRIES = 50

#: One message appended; for a session whose postings this process holds ($10: ``warm.py``),
#: the message's lexemes and their counts (``LEXED``: its postings, ``warm.lexed``) and,
#: for a human turn, the lexemes of the query text the next request searches with ($11),
#: in the same round trip: the request then has nothing to catch up
#: (``WarmIndexes.appended``). NULL arrays otherwise; no row when the head check failed.
APPEND_MESSAGE = f"""
WITH s AS (
    UPDATE {S}.sessions
       SET head = $2, last_hash = $8, view_tokens = view_tokens + $5, view_count = view_count + 1
     WHERE session_id = $1 AND head = $2::bigint - 1 AND last_hash = $9 AND erased_at IS NULL
 RETURNING view_tokens
), e AS (
    INSERT INTO {S}.events (session_id, seq, type, version, data, tokens, created_at,
                            idempotency_key, hash)
    SELECT $1, $2, 'message.appended', $3, $4::jsonb, $5, $6, $7, $8 FROM s
)
SELECT s.view_tokens, p.lexemes, p.tfs, {QUERY_LEXEMES.format(query="$11::text")}
  FROM s CROSS JOIN LATERAL ({LEXED.format(data="$4", lex="$10::boolean")}) p
"""

#: The same append for many sessions at once (see batching.py): one round trip, one commit.
APPEND_MESSAGES = f"""
WITH i AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::smallint[], $4::text[], $5::int[],
                         $6::timestamptz[], $7::text[], $8::text[], $9::text[],
                         $10::boolean[], $11::text[])
        AS t(session_id, seq, version, data, tokens, created_at, idempotency_key, hash, prev,
             lex, query)
), l AS (  -- row locks in one global order: batches of two processes cannot deadlock
    SELECT x.session_id FROM {S}.sessions x WHERE x.session_id IN (SELECT session_id FROM i)
     ORDER BY x.session_id FOR NO KEY UPDATE
), s AS (
    UPDATE {S}.sessions x
       SET head = i.seq, last_hash = i.hash, view_tokens = x.view_tokens + i.tokens,
           view_count = x.view_count + 1
      FROM i JOIN l ON l.session_id = i.session_id
     WHERE x.session_id = i.session_id AND x.head = i.seq - 1 AND x.last_hash = i.prev
       AND x.erased_at IS NULL
 RETURNING x.session_id, x.head, x.view_tokens
), e AS (
    INSERT INTO {S}.events (session_id, seq, type, version, data, tokens, created_at,
                            idempotency_key, hash)
    SELECT i.session_id, i.seq, 'message.appended', i.version, i.data::jsonb, i.tokens,
           i.created_at, i.idempotency_key, i.hash
      FROM i JOIN s ON s.session_id = i.session_id AND s.head = i.seq
)
SELECT s.session_id, s.view_tokens, p.lexemes, p.tfs, {QUERY_LEXEMES.format(query="i.query")}
  FROM s JOIN i ON i.session_id = s.session_id AND i.seq = s.head
 CROSS JOIN LATERAL ({LEXED.format(data="i.data", lex="i.lex")}) p
"""

#: Several messages to one session in one statement (``add_messages``, synthetic results
#: before a message): one round trip, one commit, one seq per message, all or nothing.
#: Lexed as ``APPEND_MESSAGE`` when $13 (each message's query text in $14): then a row a
#: message, else one row; none when the head check failed.
APPEND_SESSION_MESSAGES = f"""
WITH s AS (
    UPDATE {S}.sessions
       SET head = $2::bigint + cardinality($3::bigint[]), last_hash = $9,
           view_tokens = view_tokens + $10, view_count = view_count + cardinality($3::bigint[])
     WHERE session_id = $1 AND head = $2 AND last_hash = $12 AND erased_at IS NULL
 RETURNING view_tokens
), e AS (
    INSERT INTO {S}.events (session_id, seq, type, version, data, tokens, created_at,
                            idempotency_key, hash)
    SELECT $1, i.seq, 'message.appended', i.version, i.data::jsonb, i.tokens, $7, i.key, i.hash
      FROM unnest($3::bigint[], $4::smallint[], $5::text[], $6::int[], $8::text[], $11::text[])
           AS i(seq, version, data, tokens, hash, key), s
)
SELECT s.view_tokens, m.seq, m.lexemes, m.tfs, m.query FROM s LEFT JOIN LATERAL (
    SELECT i.seq, p.lexemes, p.tfs, {QUERY_LEXEMES.format(query="i.query")} AS query
      FROM unnest($3::bigint[], $5::text[], $14::text[]) AS i(seq, data, query)
     CROSS JOIN LATERAL ({LEXED.format(data="i.data", lex="$13::boolean")}) p
     WHERE $13::boolean
) m ON true
"""

#: The same two appends on Citus: functions (migration 0014) that Citus runs whole on the
#: worker holding the session's shard; the statements above it would plan as two steps
#: with the rows passing through the coordinator.
APPEND_MESSAGE_CALL = f"SELECT {S}.append_message($1, $2, $3, $4, $5, $6, $7, $8, $9)"
#: The batch behind PgBouncer (migration 0017): a statement there is parsed and planned at
#: every run (no prepared statements); the function's generic plan is kept by the server
#: session (on Citus there is no batch: each append is a single-shard call).
APPEND_MESSAGES_CALL = (
    f"SELECT session_id, view_tokens FROM {S}.append_messages($1, $2, $3, $4, $5, $6, $7, $8, $9)"
)
APPEND_SESSION_MESSAGES_CALL = (
    f"SELECT {S}.append_session_messages($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
)

SESSION_COLUMNS = (
    "session_id, created_at, model, config::text, metadata::text, head, "
    "last_hash, view_tokens, view_count, erased_at, "
    f"EXISTS (SELECT 1 FROM {S}.session_keys k WHERE k.session_id = sessions.session_id), "
    "parent_session_id, parent_seq"
)
#: ``SESSION_COLUMNS`` for a statement reading the one session ``$1``: its key's probe
#: names it too, so Citus routes the statement to that session's shard (correlated to
#: the row alone, Citus ran it on every shard: 8 tasks for one session's info).
ONE_SESSION_COLUMNS = SESSION_COLUMNS.replace("= sessions.session_id", "= $1")
VIEW_COLUMNS = "ord, seq, part, kind, message::text, tokens, critical"
#: A message event in the implicit tail, in the same columns as a view_items row.
_TAIL_ROW = (
    f"e.seq * {ORD_STRIDE}, e.seq, 0, CASE WHEN e.data ->> 'origin' = 'synthetic'"
    " THEN 'synthetic' ELSE 'message' END, (e.data -> 'message')::text, e.tokens,"
    " coalesce((e.data ->> 'critical')::boolean, false)"
)
#: The view = the current generation's materialized rows + the message events after
#: the watermark. Both parts are primary-key range scans: O(view), whatever the history.
#: The session's generation and watermark are scalar subqueries (InitPlans), so they are
#: index conditions: joined from a CTE, the planner may start from the session's events
#: and filter ``seq > view_base`` row by row, O(history). It did once 0004 widened the
#: sessions key to (session_id, tenant_id): ``session_id = $1`` is no longer provably
#: one row, so the CTE was costed at hundreds of rows (11.9x at 10,000 events).
_VIEW_GEN = f"(SELECT view_gen FROM {S}.sessions WHERE session_id = $1)"
_VIEW_BASE = f"(SELECT view_base FROM {S}.sessions WHERE session_id = $1)"
_BRANCH_BASE = f"(SELECT branch_base FROM {S}.sessions WHERE session_id = $1)"
READ_VIEW = f"""
SELECT {VIEW_COLUMNS} FROM {S}.view_items
 WHERE session_id = $1 AND gen = {_VIEW_GEN}
UNION ALL
SELECT {_TAIL_ROW} FROM {S}.events e
 WHERE e.session_id = $1 AND e.seq > {_VIEW_BASE} AND e.type = 'message.appended'
ORDER BY 1"""
READ_BRANCH = f"""
SELECT ord, (CASE WHEN e.type = 'messages.replaced' THEN e.data -> 'messages' -> b.part
                  ELSE e.data -> 'message' END)::text, e.seq, b.part, e.type
  FROM {S}.branch_items b
  JOIN {S}.events e ON e.session_id = b.session_id AND e.seq = b.seq
 WHERE b.session_id = $1
UNION ALL
SELECT e.seq * {ORD_STRIDE}, (e.data -> 'message')::text, e.seq, 0, e.type FROM {S}.events e
 WHERE e.session_id = $1 AND e.seq > {_BRANCH_BASE} AND e.type = 'message.appended'
ORDER BY 1"""
READ_BRANCH_REFS = f"""
SELECT ord, seq, part FROM {S}.branch_items WHERE session_id = $1
UNION ALL
SELECT e.seq * {ORD_STRIDE}, e.seq, 0 FROM {S}.events e
 WHERE e.session_id = $1 AND e.seq > {_BRANCH_BASE} AND e.type = 'message.appended'
ORDER BY 1"""
#: The seq behind the branch's $2-th message (0-based): its refs only, no message read.
#: A fork's view tail in one session of its lineage (a fork reads its ancestors' message
#: events up to its fork point by their own id, one statement each).
SEGMENT_TAIL = f"""
SELECT {_TAIL_ROW} FROM {S}.events e
 WHERE e.session_id = $1 AND e.seq BETWEEN $2 AND $3 AND e.type = 'message.appended'
 ORDER BY e.seq"""
#: A fork's own part of its view in one statement (one snapshot): a first row with its
#: watermark, head and parent (seq capped to the column: compared, never used), then its
#: materialized rows and its own message events after the watermark (``READ_VIEW``). The
#: ancestors' messages between the watermark and the fork point are append-only, so they
#: are read after it, by each ancestor's id, with no transaction.
READ_FORK_VIEW = f"""
SELECT -1::bigint, view_base, head, 'watermark', parent_session_id,
       least(parent_seq, 2147483647)::int, false FROM {S}.sessions
 WHERE session_id = $1
UNION ALL{READ_VIEW}"""
BRANCH_SEQ = f"SELECT seq FROM ({READ_BRANCH_REFS}) refs OFFSET $2 LIMIT 1"
#: User messages read back from the tail's start to find the latest human turn (the
#: others are tool results in Anthropic's shape): a bound, so reopening stays O(budget).
LAST_USERS = 32
EVENT_COLUMNS = (
    "seq, position, type, version, data::text, tokens, created_at, idempotency_key, hash"
)


def _info(row: asyncpg.Record) -> SessionInfo:
    return SessionInfo(
        row[0],
        row[1],
        row[2],
        json.loads(row[3]),
        json.loads(row[4]),
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        None if row[11] is None else (row[11], row[12]),
    )


def _item(row: asyncpg.Record, sealer: Sealer | None = None) -> ViewItem:
    message = json.loads(row[4])
    if sealer is not None and is_sealed_message(message):
        message = sealer.open_message(row[1], message)  # a tail row: a message event's
    return ViewItem(
        ref=(row[1], row[2]),
        ord=row[0],
        message=message,
        tokens=row[5],
        critical=row[6],
        kind=row[3],
    )


def view_rows_of(session_id: str, gen: int, items: Sequence[ViewItem]) -> list[tuple[Any, ...]]:
    """``view_items`` rows of ``items`` under generation ``gen`` (the message in clear:
    a derived copy, deleted by an erasure)."""
    return [
        (
            session_id,
            gen,
            i.ord,
            i.ref[0],
            i.ref[1],
            i.kind,
            dumps(dict(i.message)),
            i.tokens,
            i.critical,
        )
        for i in items
    ]


async def insert_view(
    conn: asyncpg.Connection, session_id: str, gen: int, items: Sequence[ViewItem]
) -> None:
    """Materialize ``items`` as the session's view rows of generation ``gen``."""
    if items:
        await conn.executemany(
            f"INSERT INTO {S}.view_items (session_id, gen, ord, seq, part, kind, message,"
            " tokens, critical) VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9)",
            view_rows_of(session_id, gen, items),
        )


def _opened(seq: int, message: Any, sealer: Sealer | None) -> Any:
    """A message read by SQL from a ``message.appended`` event, opened if sealed."""
    if sealer is not None and is_sealed_message(message):
        return sealer.open_message(seq, message)
    return message


def _is_result(item: ViewItem) -> bool:
    return item.role == "tool" or bool(result_ids(item.message))


def _event(session_id: str, row: asyncpg.Record, sealer: Sealer | None = None) -> Event:
    """An event as stored; with the session's sealer its payload is the opened data
    (without one, a sealed event's payload holds only the sealed form)."""
    data = json.loads(row[4])
    readable = sealer.open(row[0], row[2], data) if sealer is not None else data
    return Event(
        session_id,
        row[0],
        decode(row[2], row[3], readable),
        row[6],
        row[8],
        row[5],
        row[7],
        row[1],
        data,
        row[3],
    )


def _stored(event: Event) -> str:
    """An event's data as stored (sealed, for a sealed session) in wire JSON."""
    return dumps(event.data if event.data is not None else event.payload.to_data())


#: The SQLSTATEs ``erase_session`` raises (migration 0013).
ERASED_STATE = "CL001"
NOT_SEALED_STATE = "CL002"


def _erased(session_id: str) -> SessionErased:
    return SessionErased(
        f"session {session_id!r} was erased: its content is gone for good "
        "(`contextledger erasures` says who erased it, when and why)",
        session_id=session_id,
    )


def _not_sealed(session_id: str) -> SessionNotEncrypted:
    return SessionNotEncrypted(
        f"session {session_id!r} was written without a data key: it cannot be erased by "
        "destroying one. Remove it with the audited purge "
        f"(`contextledger purge {session_id} --reason ...`).",
        session_id=session_id,
    )
