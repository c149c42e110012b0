"""The PostgreSQL store: asyncpg on the hot path, one round trip per message append.

Appending a message is a single statement: a conditional ``UPDATE sessions ...
WHERE head = seq - 1`` feeding the INSERTs of the event and its view and branch
rows. If another writer advanced the head first, the UPDATE matches nothing, so
nothing is inserted; we re-read the head and retry (or raise
``ConcurrencyError`` when the caller pinned ``expected_seq``). Appends to
different sessions touch different rows only: no table locks, no counters.

Everything else (summaries, compactions, rollbacks, set_messages) is a cold
path: one transaction that locks the session row, loads the view (O(view)),
runs the pure ``record_events`` and writes the difference.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any, NamedTuple

import asyncpg
import structlog

from contextledger.core.chain import GENESIS_HASH, make_event
from contextledger.core.encoding import dumps
from contextledger.core.events import Event, MessageAppended, Payload, SessionCreated, decode
from contextledger.core.projection import (
    ViewState,
    check_append_target,
    compare_rows,
    fold,
    record_events,
)
from contextledger.core.recall import Recalled
from contextledger.core.units import is_human_turn, result_ids
from contextledger.core.view import ORD_STRIDE, ViewItem
from contextledger.errors import (
    ConcurrencyError,
    ConfigError,
    IdempotencyConflict,
    InvalidArgument,
    MigrationRequired,
    SessionExists,
    SessionNotFound,
)
from contextledger.store import distributed
from contextledger.store.base import (
    AppendResult,
    Checkpoint,
    RebuildReport,
    SessionInfo,
    Store,
    ViewTail,
)
from contextledger.store.batching import AppendBatcher
from contextledger.store.distributed import Citus
from contextledger.store.dsn import asyncpg_dsn, redact
from contextledger.store.errors import translate, translated, translated_iter
from contextledger.store.lexical import (
    DEEP_LIMIT,
    DEEP_TERMS,
    HOP_FROM,
    HOP_LEXEMES,
    HOP_LIMIT,
    K1,
    MAX_QUERY_LEXEMES,
    NEIGHBOURED,
    PER_TERM,
    RECENCY,
    B,
    read_from,
)
from contextledger.store.scoped import TENANT_SETTING, TenantConnection, scoped

log = structlog.get_logger(__name__)
S = "contextledger"
_RETRIES = 50

APPEND_MESSAGE = f"""
WITH s AS (
    UPDATE {S}.sessions
       SET head = $2, last_hash = $8, view_tokens = view_tokens + $5, view_count = view_count + 1
     WHERE session_id = $1 AND head = $2::bigint - 1 AND last_hash = $9
 RETURNING view_tokens
), e AS (
    INSERT INTO {S}.events (session_id, seq, type, version, data, tokens, created_at,
                            idempotency_key, hash)
    SELECT $1, $2, 'message.appended', $3, $4::jsonb, $5, $6, $7, $8 FROM s
)
SELECT view_tokens FROM s
"""

#: The same append for many sessions at once (see batching.py): one round trip, one commit.
APPEND_MESSAGES = f"""
WITH i AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::smallint[], $4::text[], $5::int[],
                         $6::timestamptz[], $7::text[], $8::text[], $9::text[])
        AS t(session_id, seq, version, data, tokens, created_at, idempotency_key, hash, prev)
), l AS (  -- row locks in one global order: batches of two processes cannot deadlock
    SELECT x.session_id FROM {S}.sessions x WHERE x.session_id IN (SELECT session_id FROM i)
     ORDER BY x.session_id FOR NO KEY UPDATE
), s AS (
    UPDATE {S}.sessions x
       SET head = i.seq, last_hash = i.hash, view_tokens = x.view_tokens + i.tokens,
           view_count = x.view_count + 1
      FROM i JOIN l ON l.session_id = i.session_id
     WHERE x.session_id = i.session_id AND x.head = i.seq - 1 AND x.last_hash = i.prev
 RETURNING x.session_id, x.head, x.view_tokens
), e AS (
    INSERT INTO {S}.events (session_id, seq, type, version, data, tokens, created_at,
                            idempotency_key, hash)
    SELECT i.session_id, i.seq, 'message.appended', i.version, i.data::jsonb, i.tokens,
           i.created_at, i.idempotency_key, i.hash
      FROM i JOIN s ON s.session_id = i.session_id AND s.head = i.seq
)
SELECT session_id, view_tokens FROM s
"""

#: Several messages to one session in one statement (``add_messages``, synthetic results
#: before a message): one round trip, one commit, one seq per message, all or nothing.
APPEND_SESSION_MESSAGES = f"""
WITH s AS (
    UPDATE {S}.sessions
       SET head = $2::bigint + cardinality($3::bigint[]), last_hash = $9,
           view_tokens = view_tokens + $10, view_count = view_count + cardinality($3::bigint[])
     WHERE session_id = $1 AND head = $2 AND last_hash = $12
 RETURNING view_tokens
), e AS (
    INSERT INTO {S}.events (session_id, seq, type, version, data, tokens, created_at,
                            idempotency_key, hash)
    SELECT $1, i.seq, 'message.appended', i.version, i.data::jsonb, i.tokens, $7, i.key, i.hash
      FROM unnest($3::bigint[], $4::smallint[], $5::text[], $6::int[], $8::text[], $11::text[])
           AS i(seq, version, data, tokens, hash, key), s
)
SELECT view_tokens FROM s
"""

#: The same two appends on Citus: functions (migration 0014) that Citus runs whole on the
#: worker holding the session's shard; the statements above it would plan as two steps
#: with the rows passing through the coordinator.
APPEND_MESSAGE_CALL = f"SELECT {S}.append_message($1, $2, $3, $4, $5, $6, $7, $8, $9)"
APPEND_SESSION_MESSAGES_CALL = (
    f"SELECT {S}.append_session_messages($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
)

SESSION_COLUMNS = (
    "session_id, created_at, model, config::text, metadata::text, head, "
    "last_hash, view_tokens, view_count"
)
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
                  ELSE e.data -> 'message' END)::text
  FROM {S}.branch_items b
  JOIN {S}.events e ON e.session_id = b.session_id AND e.seq = b.seq
 WHERE b.session_id = $1
UNION ALL
SELECT e.seq * {ORD_STRIDE}, (e.data -> 'message')::text FROM {S}.events e
 WHERE e.session_id = $1 AND e.seq > {_BRANCH_BASE} AND e.type = 'message.appended'
ORDER BY 1"""
READ_BRANCH_REFS = f"""
SELECT ord, seq, part FROM {S}.branch_items WHERE session_id = $1
UNION ALL
SELECT e.seq * {ORD_STRIDE}, e.seq, 0 FROM {S}.events e
 WHERE e.session_id = $1 AND e.seq > {_BRANCH_BASE} AND e.type = 'message.appended'
ORDER BY 1"""
#: The text search configuration recall's stored vectors are built with (``event_search``).
INDEX_TEXT_CONFIG = "english"
#: An event's search vector, as 0003 defined it (a message over 16 KiB is indexed by the
#: first 16 KiB of its text: the parser costs ~0.2-0.6 µs a byte), less the role (since
#: 0010: "user" and "assistant" were lexemes of every message).
SEARCH_VECTOR = (
    "CASE WHEN octet_length(e.data::text) <= 16384"
    " THEN jsonb_to_tsvector('english'::regconfig,"
    " coalesce((e.data -> 'message') - 'role', e.data -> 'messages', '{}'::jsonb),"
    ' \'["string", "numeric"]\')'
    " ELSE to_tsvector('english'::regconfig, left(coalesce(e.data -> 'message' ->> 'content',"
    " (e.data -> 'messages')::text, ''), 16384)) END"
)
#: Seqs of the branch up to seq $3: the current branch, or (replays) the seqs in $5, the
#: branch as of the replayed seq, sent as ranges (``seq_ranges``). Hashed subplans or a
#: binary search over the ranges: O(1) or O(log ranges) per row.
_BRANCH_SEQS = f"""
 e.session_id = $1 AND e.seq <= $3
 AND (e.seq > {_BRANCH_BASE}
      OR e.seq IN (SELECT seq FROM {S}.branch_items WHERE session_id = $1 AND part = 0))"""
_GIVEN_SEQS = """
 e.session_id = $1 AND e.seq <= $3 AND (SELECT $5::text::int8multirange) @> e.seq"""
#: Message events of the branch (of ``events e``).
_ON_BRANCH = " e.type = 'message.appended' AND" + _BRANCH_SEQS
_ON_GIVEN_BRANCH = " e.type = 'message.appended' AND" + _GIVEN_SEQS
#: A posting (``x``, a message event's) on the branch: the current one, or $5's.
_POSTING_ON_BRANCH = f"""(x.seq > {_BRANCH_BASE}
      OR x.seq IN (SELECT seq FROM {S}.branch_items WHERE session_id = $1 AND part = 0))"""
_POSTING_ON_GIVEN_BRANCH = "(SELECT $5::text::int8multirange) @> x.seq"
#: The search's gate probes the seqs a request leaves out one by one up to this many;
#: beyond, something is surely left out at length and the gate opens without a probe.
MAX_GATE_GAPS = 256
#: The row a search returns when its gate found nothing left out (not a match).
CLOSED = -1
#: A closed gate is remembered (per session, in this store) and the search skipped while
#: the request leaves out no seq it did not leave out then; at most this many seqs later
#: the search runs again, so the vectors it stores lag the ledger by a bounded amount.
RECHECK_AFTER = 64
#: Sessions whose closed gate a store remembers (the oldest is forgotten first).
MAX_REMEMBERED = 4096


class _ClosedGate(NamedTuple):
    """A live search whose gate found nothing left out, remembered by the store."""

    seq: int  # the seq that search was taken at
    gaps: frozenset[int]  # the seqs it left out (none a branch message)
    tip: tuple[int, str]  # (seq, hash) of the chain as this store has extended it since


#: A message's postings from its vector ``v`` (migration 0010 spells the same rows).
POSTINGS = """
    SELECT v.session_id, t.lexeme, v.seq, v.tenant_id,
           least(coalesce(array_length(t.positions, 1), 1), 32767)::smallint AS tf,
           least(length(v.v), 32767)::smallint AS dl
      FROM {src} v CROSS JOIN LATERAL unnest(v.v) t
    UNION ALL
    SELECT v.session_id, '', v.seq, v.tenant_id, 0::smallint, least(length(v.v), 32767)::smallint
      FROM {src} v"""
#: Postings are not written by appends (0006, 0010: the parser would run in every append):
#: the search indexes the session's message events above its highest indexed seq, up to
#: the session's head, itself, in the same statement, reading them by key (as a range
#: ``seq > upto``, the generic plan scanned the events table: 15 of an 18 ms search at
#: 20,000 turns). Events of a session are committed in seq order, so the indexed
#: ones are always a prefix (the empty lexeme marks each indexed message: the newest one
#: is one backward index step); ``fresh`` is computed once, stored, and searched alongside.
#: Postings are derived data, so the search's commit does not wait for the WAL flush (an
#: fsync per request otherwise): a crash can lose only the newest ones, a suffix, which
#: the next search indexes again (``_SEARCH_SETTINGS``).
_CATCH_UP = f"""
WITH indexed AS MATERIALIZED (
    SELECT coalesce((SELECT x.seq FROM {S}.event_terms x
                      WHERE x.session_id = $1 AND x.lexeme = ''
                        AND x.tenant_id = {S}.current_tenant()
                      ORDER BY x.seq DESC LIMIT 1), 0) AS upto
), fresh_vectors AS MATERIALIZED (  -- by key: a range the generic plan read as a scan
    SELECT e.session_id, e.seq, e.tenant_id, {SEARCH_VECTOR} AS v FROM {S}.events e
     WHERE e.session_id = $1 AND e.tenant_id = {S}.current_tenant()
       AND e.seq = ANY (ARRAY(SELECT generate_series((SELECT upto FROM indexed) + 1, (
               SELECT h.head FROM {S}.sessions h
                WHERE h.session_id = $1 AND h.tenant_id = {S}.current_tenant()))))
       AND e.type = 'message.appended'
), fresh AS MATERIALIZED ({POSTINGS.format(src="fresh_vectors")}
),"""
_STORE_FRESH = f""" stored AS (
    INSERT INTO {S}.event_terms (session_id, lexeme, seq, tenant_id, tf, dl)
    SELECT session_id, lexeme, seq, tenant_id, tf, dl FROM fresh ON CONFLICT DO NOTHING
),"""
#: Lexical recall, in work bounded by the query whatever the session's length (the rules
#: are ``store.lexical``'s, which ``memory://`` follows in Python). The query becomes
#: lexemes through PostgreSQL's parser, dictionaries and stop words ($6 is the
#: configuration); for each of its ``MAX_QUERY_LEXEMES`` longest, the newest ``PER_TERM``
#: postings of the branch's message events below the request's tail ($T: what the request
#: carries at its end is skipped by the index condition, the few others it carries, $4,
#: are filtered) are one backward range of the ``event_terms`` key. A GIN index answered
#: ``@@`` with every match instead, and on natural text a mid-frequency word matches
#: thousands of messages (the search grew 1.1 -> 94.6 ms a turn from 100 to 20,000 turns).
#: A lexeme read whole has its exact document frequency; one read to the cap has it
#: estimated from how far back its postings reach (``lexical.estimated_df``). BM25 scores
#: each message from the postings' own ``tf`` and ``dl`` (no vector read back), times a
#: small preference for the newer statement; ties go to the newer event. A request that
#: carries every message of the branch (a session shorter than its budget) has nothing to
#: recall. Seqs are dense, so what it leaves out lies among the seqs up to $3 it does not
#: carry (the gaps, ``$G``, listed by the caller): when there are few, the gate probes them
#: by key and the rest never runs unless one is a branch message; when there are many
#: (``$G`` NULL) the gate is open without a probe. The catch-up still indexes what is new,
#: so no backlog waits for the first search.
#: The matches come with their messages and times, so a request's recall is one statement.
#: Each is read by its key: a LATERAL subquery kept apart (``OFFSET 0``), where ``top.seq``
#: is a parameter, so an index condition (joined, the generic plan could estimate the
#: session at one row and scan all its events per match).


def _bm25(postings: str, weights: str, limit: str) -> str:
    """BM25 over a CTE of postings ``(l, seq, tf, dl)`` with idf ``weights``: the best
    ``limit`` seqs, a small preference for the newer (``lexical.rank`` in SQL)."""
    return f"""
    SELECT p.seq, sum(w.idf * p.tf * {K1 + 1}::float8
                      / (p.tf + {K1}::float8 * ({1 - B}::float8 + {B}::float8 * p.dl
                         / greatest(1.0::float8, (SELECT avg(dl)::float8 FROM {postings})))))
               * (1.0::float8 + {RECENCY}::float8 * p.seq / greatest(1, $T::bigint)::float8) AS rank
      FROM {postings} p JOIN {weights} w USING (l)
     GROUP BY p.seq ORDER BY rank DESC, p.seq DESC LIMIT {limit}"""


_SEARCH = f"""{{head}} gate AS MATERIALIZED (
    SELECT $G::bigint[] IS NULL
        OR EXISTS (SELECT FROM {S}.events e WHERE {{on_branch}} AND e.seq = ANY($G::bigint[]))
           AS open
), lq AS MATERIALIZED (
    SELECT l FROM unnest(tsvector_to_array(to_tsvector($6::regconfig, $2))) AS l
     WHERE (SELECT open FROM gate)
     ORDER BY length(l) DESC, l LIMIT {MAX_QUERY_LEXEMES}
), post AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl FROM lq CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM ({{postings}}) y ORDER BY y.seq DESC LIMIT {PER_TERM}
    ) p
), deep_l AS MATERIALIZED (  -- the rarest capped lexemes, read further (``DEEP_*``)
    SELECT l FROM post GROUP BY l HAVING count(*) >= {PER_TERM}
     ORDER BY count(*)::float8 / greatest(1, $T::bigint - min(seq) + 1), l LIMIT {DEEP_TERMS}
), deep AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl FROM deep_l lq CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM ({{deep_postings}}) y ORDER BY y.seq DESC LIMIT {DEEP_LIMIT}
    ) p
), allpost AS MATERIALIZED (
    SELECT * FROM post WHERE l NOT IN (SELECT l FROM deep_l) UNION ALL SELECT * FROM deep
), w AS MATERIALIZED (
    SELECT l, ln(1 + (greatest($3, d.df) - d.df + 0.5) / (d.df + 0.5)) AS idf FROM (
        SELECT l, CASE WHEN count(*) < {PER_TERM}
                         OR (count(*) > {PER_TERM} AND count(*) < {DEEP_LIMIT})
                       THEN count(*)::float8
                       ELSE least($3::float8, count(*) * $3::float8
                                  / greatest(1, $T::bigint - min(seq) + 1)) END AS df
          FROM allpost GROUP BY l) d
), top AS MATERIALIZED ({_bm25("allpost", "w", "$7")}
), hop_lq AS MATERIALIZED (  -- a second hop (``lexical.HOP_*``), when $H
    SELECT DISTINCT l FROM (
        SELECT seq FROM top WHERE $H::boolean ORDER BY rank DESC, seq DESC LIMIT {HOP_FROM}) h
      CROSS JOIN LATERAL (
        SELECT unnest(tsvector_to_array({{hop_vector}})) AS l FROM {S}.events e
         WHERE e.session_id = $1 AND e.seq = h.seq AND e.tenant_id = {S}.current_tenant()
        OFFSET 0) v
     WHERE l NOT IN (SELECT l FROM lq)
     ORDER BY l
), hop_near AS MATERIALIZED (  -- the hop's sources' neighbours come as neighbours
    SELECT h.seq + d AS seq FROM (
        SELECT seq FROM top WHERE $H::boolean ORDER BY rank DESC, seq DESC LIMIT {HOP_FROM}) h
      CROSS JOIN (VALUES (-1), (1)) n(d)
), hop_post AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl
      FROM (SELECT l FROM hop_lq ORDER BY length(l) DESC, l LIMIT {HOP_LEXEMES}) lq
     CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM ({{hop_postings}}) y ORDER BY y.seq DESC LIMIT {PER_TERM}
    ) p
), hop_w AS MATERIALIZED (
    SELECT l, ln(1 + (greatest($3, d.df) - d.df + 0.5) / (d.df + 0.5)) AS idf FROM (
        SELECT l, count(*)::float8 AS df
          FROM hop_post GROUP BY l HAVING count(*) < {PER_TERM}) d
), hop_top AS MATERIALIZED ({_bm25("hop_post", "hop_w", str(HOP_LIMIT))}
), near AS MATERIALIZED (  -- the neighbours of the best matches (``NEIGHBOURED``)
    SELECT DISTINCT n.seq FROM (
        SELECT seq FROM top WHERE rank > 0 ORDER BY rank DESC, seq DESC LIMIT {NEIGHBOURED}) h
      CROSS JOIN LATERAL (VALUES (h.seq - 1), (h.seq + 1)) n(seq)
     WHERE n.seq BETWEEN 1 AND $3 AND NOT (SELECT $4::text::int8multirange) @> n.seq
       AND n.seq NOT IN (SELECT seq FROM top) AND n.seq NOT IN (SELECT seq FROM hop_top)
)
(SELECT top.seq, top.rank, e.message, e.tokens, e.created_at
   FROM top CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM {S}.events x
         WHERE x.session_id = $1 AND x.seq = top.seq AND x.tenant_id = {S}.current_tenant()
        OFFSET 0
   ) e
  WHERE top.rank > 0
  ORDER BY top.rank DESC, top.seq DESC)
UNION ALL
(SELECT hop_top.seq, -hop_top.rank, e.message, e.tokens, e.created_at
   FROM hop_top CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM {S}.events x
         WHERE x.session_id = $1 AND x.seq = hop_top.seq AND x.tenant_id = {S}.current_tenant()
        OFFSET 0
   ) e
  WHERE hop_top.rank > 0
  ORDER BY hop_top.rank DESC, hop_top.seq DESC)
UNION ALL
SELECT near.seq, 0::float8, e.message, e.tokens, e.created_at
  FROM near CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM {S}.events x
         WHERE x.session_id = $1 AND x.seq = near.seq AND x.tenant_id = {S}.current_tenant()
           AND x.type = 'message.appended' AND {{branch}}
        OFFSET 0
   ) e
UNION ALL SELECT {CLOSED}::bigint, 0::float8, NULL, NULL, NULL FROM gate WHERE NOT gate.open"""
_UNINDEXED = "jsonb_to_tsvector($6::regconfig, e.data -> 'message', '[\"string\", \"numeric\"]')"
#: A lexeme's postings up to $T: stored (``event_terms``, by its key) and fresh; or, for
#: another text search configuration, computed from the branch's messages on the fly.
#: Each arm is limited itself, so the stored one is a backward index scan that stops after
#: ``PER_TERM`` rows (limited only outside, the plan sorted every posting of the lexeme).
_LEFT_OUT = "NOT (SELECT $4::text::int8multirange) @> x.seq AND {branch}"
_STORED_POSTINGS = f"""
            (SELECT x.seq, x.tf, x.dl FROM {S}.event_terms x
              WHERE x.session_id = $1 AND x.lexeme = lq.l AND x.seq <= $T::bigint
                AND x.tenant_id = {S}.current_tenant() AND {_LEFT_OUT}
              ORDER BY x.seq DESC LIMIT {PER_TERM})
            UNION ALL
            (SELECT x.seq, x.tf, x.dl FROM fresh x
              WHERE x.lexeme = lq.l AND x.seq <= $T::bigint AND {_LEFT_OUT}
              ORDER BY x.seq DESC LIMIT {PER_TERM})"""
_COMPUTED_POSTINGS = f"""
            SELECT x.seq, x.tf, x.dl FROM computed x WHERE x.lexeme = lq.l AND {_LEFT_OUT}"""
_COMPUTED = f"""WITH computed_vectors AS MATERIALIZED (
    SELECT e.session_id, e.seq, e.tenant_id, {_UNINDEXED} AS v FROM {S}.events e
     WHERE e.type = 'message.appended' AND e.session_id = $1 AND e.seq <= $T::bigint
       AND e.tenant_id = {S}.current_tenant()
), computed AS MATERIALIZED ({POSTINGS.format(src="computed_vectors")}
),"""


#: For the search's own transaction: its commit need not wait for the WAL flush (see
#: above). A live search also forces the cached generic plan: PostgreSQL costs it above
#: the custom ones, so it planned the statement afresh on every request (~5 ms of planning
#: for ~2 ms of work, measured at 1,000 turns), and its shape suits every session. Not a
#: replay's: its branch is an array parameter, which only a custom plan hashes.
_SEARCH_SETTINGS = "SET LOCAL synchronous_commit = off"
_LIVE_SEARCH_SETTINGS = _SEARCH_SETTINGS + "; SET LOCAL plan_cache_mode = force_generic_plan"
#: The same settings for the connections kept for live searches (``connect``'s second
#: pool), so a search is one autocommit statement: the transaction block and its SET
#: cost three more round trips (~0.5 ms of a ~3 ms search, measured at 20,000 turns).
_SEARCH_CONNECTION = {"synchronous_commit": "off", "plan_cache_mode": "force_generic_plan"}
#: After the server refused the search pool a connection, live searches use the main
#: pool for this long (seconds) instead of forking a backend per search to be refused.
SEARCH_POOL_BACKOFF = 10.0


def seq_ranges(seqs: Collection[int]) -> str:
    """``seqs`` as an ``int8multirange`` literal, the way the search takes a set of seqs:
    a request carries its tail whole and a branch is mostly one run, so a few ranges. As
    a ``bigint[]`` of every seq, the 835 a request carried at 1,500 turns cost ~0.26 ms a
    search to encode and read back, and a replay's branch ~0.3 µs a seq."""
    ordered = sorted(seqs if isinstance(seqs, set | frozenset) else set(seqs))
    n = len(ordered)
    # The usual request: a few seqs (pinned items, the last human turn), then its tail in
    # one run to the end: found by position (C speed) and written as one range.
    tail = next((h for h in range(min(n, 8)) if ordered[-1] - ordered[h] == n - 1 - h), n)
    parts = _runs(ordered[:tail])
    if tail < n:
        parts.append(f"[{ordered[tail]},{ordered[-1]}]")
    return "{" + ",".join(parts) + "}"


def _runs(ordered: Sequence[int]) -> list[str]:
    """``[a,b]`` for each run of consecutive seqs in ``ordered`` (sorted, distinct)."""
    parts: list[str] = []
    start = prev = 0
    for seq in ordered:
        if parts and seq == prev + 1:  # the next in a run
            prev = seq
            continue
        if parts:
            parts[-1] = f"[{start},{prev}]"
        start = prev = seq
        parts.append("")
    if parts:
        parts[-1] = f"[{start},{prev}]"
    return parts


def gate_gaps(upto_seq: int, carried: Collection[int]) -> list[int] | None:
    """The seqs up to ``upto_seq`` a request does not carry (``$G`` of the search), or
    None when there are more than ``MAX_GATE_GAPS``."""
    held = carried if isinstance(carried, set | frozenset) else set(carried)
    if held and min(held) > 0 and max(held) <= upto_seq:  # the usual case, at C speed
        inside = len(held)
    else:
        inside = sum(1 for x in held if 0 < x <= upto_seq)
    if upto_seq - inside > MAX_GATE_GAPS:
        return None
    return [x for x in range(1, upto_seq + 1) if x not in held]


def search_sql(*, indexed: bool, given_branch: bool, store: bool = True) -> str:
    """The recall search: on the stored postings (catching up first; ``store=False`` on a
    read-only server computes the missing ones without storing them), or on postings
    computed on the fly for another text search configuration."""
    on_branch = _ON_GIVEN_BRANCH if given_branch else _ON_BRANCH
    branch = _POSTING_ON_GIVEN_BRANCH if given_branch else _POSTING_ON_BRANCH
    if indexed:
        head = _CATCH_UP + (_STORE_FRESH if store else "")
        postings = _STORED_POSTINGS
    else:
        head, postings = _COMPUTED, _COMPUTED_POSTINGS
    postings = postings.replace("{branch}", branch)
    hop_postings = postings.replace(
        "AND NOT (SELECT $4",
        "AND x.seq NOT IN (SELECT seq FROM top) AND x.seq NOT IN (SELECT seq FROM hop_near)"
        " AND NOT (SELECT $4",
    )
    return _SEARCH.format(
        head=head,
        on_branch=on_branch,
        postings=postings,
        hop_postings=hop_postings,
        deep_postings=postings.replace(f"LIMIT {PER_TERM}", f"LIMIT {DEEP_LIMIT}"),
        hop_vector=SEARCH_VECTOR if indexed else _UNINDEXED,
        branch=branch,
    )


def search_statement(
    query: str,
    exclude: Collection[int],
    upto_seq: int,
    branch: Collection[int] | None,
    limit: int,
    text_config: str,
    gaps: list[int] | None,
    *,
    store: bool = True,
    hop: bool = False,
) -> tuple[str, list[Any]]:
    """The search's SQL and its arguments (the session id, ``$1``, left for the caller):
    live (``branch`` None) or a replay's, with a second hop or not."""
    args: list[Any] = [None, query, upto_seq, seq_ranges(exclude)]
    args += [seq_ranges(branch) if branch is not None else None, text_config, limit]
    if branch is None:  # $5 unused: keep the parameter list dense
        del args[4]
    args += [read_from(upto_seq, exclude), gaps, hop]
    text = search_sql(
        indexed=text_config == INDEX_TEXT_CONFIG, given_branch=branch is not None, store=store
    )
    if branch is None:
        text = text.replace("$6", "$5").replace("$7", "$6")
    n = len(args)
    return text.replace("$T", f"${n - 2}").replace("$G", f"${n - 1}").replace("$H", f"${n}"), args


#: Embeddings for hybrid recall (created on first use where ``vector`` exists; not a
#: migration, so servers without pgvector are unaffected). ``available_from`` is the
#: head of the request that computed it: a replay at seq S uses those from <= S only.
EMBEDDINGS_DDL = f"""
CREATE TABLE IF NOT EXISTS {S}.event_embeddings (
    session_id text NOT NULL,
    model text NOT NULL,
    seq bigint NOT NULL,
    available_from bigint NOT NULL,
    embedding vector NOT NULL,
    PRIMARY KEY (session_id, model, seq)
)"""
DISTRIBUTE_EMBEDDINGS = f"""
SELECT create_distributed_table('{S}.event_embeddings', 'session_id',
                                colocate_with => '{S}.sessions')
 WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition
                    WHERE logicalrelid = '{S}.event_embeddings'::regclass)"""
UNEMBEDDED = f"""
SELECT e.seq, (e.data -> 'message')::text FROM {S}.events e
 WHERE {{branch}}
   AND NOT EXISTS (SELECT 1 FROM {S}.event_embeddings x
                    WHERE x.session_id = $1 AND x.model = $2 AND x.seq = e.seq)
 ORDER BY e.seq = ANY($4::bigint[]) DESC, e.seq DESC LIMIT $5"""
VECTOR_SEARCH = f"""
WITH q AS (
    SELECT embedding FROM {S}.event_embeddings
     WHERE session_id = $1 AND model = $2 AND seq = $5 AND available_from <= $3
)
SELECT e.seq, x.embedding <=> q.embedding AS distance
  FROM {S}.event_embeddings x
  JOIN {S}.events e ON e.session_id = x.session_id AND e.seq = x.seq, q
 WHERE x.session_id = $1 AND x.model = $2 AND x.available_from <= $3
   AND NOT (SELECT $4::text::int8multirange) @> x.seq AND {{branch}}
 ORDER BY distance, e.seq DESC LIMIT $6"""
RECALL_MESSAGES = f"""
SELECT e.seq, (e.data -> 'message')::text, e.tokens, e.created_at FROM {S}.events e
 WHERE e.session_id = $1 AND e.seq = ANY($2::bigint[]) AND {{branch}}
 ORDER BY e.seq"""
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
    )


def _item(row: asyncpg.Record) -> ViewItem:
    return ViewItem(
        ref=(row[1], row[2]),
        ord=row[0],
        message=json.loads(row[4]),
        tokens=row[5],
        critical=row[6],
        kind=row[3],
    )


def _is_result(item: ViewItem) -> bool:
    return item.role == "tool" or bool(result_ids(item.message))


def _event(session_id: str, row: asyncpg.Record) -> Event:
    data = json.loads(row[4])
    return Event(
        session_id,
        row[0],
        decode(row[2], row[3], data),
        row[6],
        row[8],
        row[5],
        row[7],
        row[1],
        data,
        row[3],
    )


def _idempotency_violation(exc: asyncpg.UniqueViolationError) -> bool:
    """The unique violation is the idempotency index's. Citus relays a worker's error
    without its constraint field (and names the shard's index, ``events_idempotency_N``):
    the message names it then."""
    return "events_idempotency" in f"{exc.constraint_name or ''} {exc}"


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing to undo (we never SET, LISTEN or take advisory locks).

    asyncpg still rolls back an open transaction before calling this; its default
    reset (``RESET ALL; CLOSE ALL; UNLISTEN *; ...``) cost a second round trip per
    append (~136 µs, measured by bench/ledger.py).
    """


class PostgresStore(Store):
    kind = "postgres"
    concurrent_search = True

    def __init__(
        self,
        pool: asyncpg.Pool,
        dsn: str,
        *,
        hot_connections: int = 4,
        search_pool: asyncpg.Pool | None = None,
        citus: Citus | None = None,
    ) -> None:
        self._pool = pool
        self.citus = citus  # the Citus the store found at start (None: plain PostgreSQL)
        self._search_pool = search_pool  # live searches (``_SEARCH_CONNECTION``), if any
        self._search_refused_at: float | None = None  # when the server last refused it one
        self._dsn = dsn
        self._heads: dict[str, tuple[int, str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Appends run on connections kept out of the pool: acquiring and releasing a
        # pooled connection per statement cost ~40-55 µs (bench/ledger.py). At most half
        # the pool (none of a pool of one: kept out, it left reads none and they waited
        # forever).
        self._idle: list[asyncpg.Connection] = []
        self._lent = 0
        self._closing = False
        # On Citus, no batch across sessions (a multi-shard transaction, two-phase commit):
        # each append is its own single-shard statement, as many in flight as connections.
        self._batcher = AppendBatcher(
            self._append_one,
            self._append_many,
            max_batch=1 if citus is not None else 256,
            max_inflight=max(2, hot_connections) if citus is not None else 2,
            rolled_back=lambda exc: (
                isinstance(exc, asyncpg.PostgresError)
                and not isinstance(exc, asyncpg.PostgresConnectionError)
            ),
        )
        self._hot_max = hot_connections
        self._vectors: bool | None = None  # pgvector present? (asked once)
        self._closed: dict[str, _ClosedGate] = {}  # each session's last closed gate

    @classmethod
    @translated
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        tenant: str | None = None,
        role: str | None = None,
        pgbouncer: bool = False,
    ) -> PostgresStore:
        """``tenant`` scopes every transaction to that tenant's rows: ``set_config(
        'contextledger.tenant', tenant, true)`` at its start (``store/scoped.py``; the
        row-level security key, and the default of every ``tenant_id`` column), never a
        startup parameter, and a tenant connection whose role row-level security would
        not hold (superuser, BYPASSRLS, a member of the tables' owner) is refused.
        ``role`` makes the connections act as that database role (a startup parameter:
        not behind PgBouncer, where the DSN logs in as the role itself).

        ``pgbouncer``: the server is reached through PgBouncer in transaction mode:
        asyncpg's statement cache is off (``statement_cache_size=0``: named prepared
        statements do not survive a server connection change) and no setting travels
        as a startup parameter (the search pool's go into each transaction).
        """
        settings: dict[str, str] = {} if pgbouncer else {"application_name": "contextledger"}
        if role is not None:
            if pgbouncer:
                raise ConfigError(
                    "behind PgBouncer the DSN must log in as the role itself: a role switch "
                    "is a startup parameter PgBouncer refuses",
                    key="role",
                )
            settings["role"] = role
        if tenant is None and not pgbouncer:
            # No tenant: the local one, said outright. Left unset, ``current_tenant()``
            # (0011) asks a plpgsql function who may mean 'local', once per call: per row
            # of every insert's ``tenant_id`` default and per index probe of a search.
            settings[TENANT_SETTING] = "local"
        search_settings = dict(settings)
        if not pgbouncer:
            search_settings.update(_SEARCH_CONNECTION, application_name="contextledger-search")
        options: dict[str, Any] = {"reset": _keep_session}
        search_options: dict[str, Any] = {"reset": _keep_session}
        if pgbouncer:
            options["statement_cache_size"] = search_options["statement_cache_size"] = 0
        if tenant is not None:
            options.update(
                connection_class=TenantConnection,
                init=scoped(tenant, per_transaction=pgbouncer),
            )
            search_options.update(
                connection_class=TenantConnection,
                init=scoped(
                    tenant, _SEARCH_CONNECTION if pgbouncer else None, per_transaction=pgbouncer
                ),
            )
        pool = search_pool = None
        try:
            pool = await asyncpg.create_pool(
                asyncpg_dsn(dsn),
                min_size=min_size,
                max_size=max_size,
                server_settings=settings,
                **options,
            )
            search_pool = await asyncpg.create_pool(  # connects at the first search
                asyncpg_dsn(dsn),
                min_size=0,
                max_size=max(1, max_size // 2),
                server_settings=search_settings,
                max_inactive_connection_lifetime=30,  # slots go back soon after a burst
                **search_options,
            )
        except Exception as exc:
            if pool is not None:
                await pool.close()
            typed = translate(exc)
            if typed is None:
                raise
            typed.args = (f"cannot connect to {redact(dsn)}: {typed.args[0]}",)
            raise typed from exc
        assert pool is not None and search_pool is not None
        try:
            async with pool.acquire() as conn:
                citus = await distributed.check(conn, schema=False)
        except BaseException:
            await pool.close()
            await search_pool.close()
            raise
        if citus is not None and "plan_cache_mode" in search_settings:
            # Citus plans a query with a CTE or subqueries on distributed tables only
            # with its parameters' values: no generic plan for the search (it has no
            # connection yet, so all of them get this).
            search_settings.pop("plan_cache_mode")
            cache = {k: v for k, v in search_options.items() if k == "statement_cache_size"}
            search_pool.set_connect_args(asyncpg_dsn(dsn), server_settings=search_settings, **cache)
        return cls(pool, dsn, hot_connections=max_size // 2, search_pool=search_pool, citus=citus)

    @translated
    async def schema_revision(self) -> str | None:
        try:
            revision: str | None = await self._pool.fetchval(
                f"SELECT version_num FROM {S}.alembic_version"
            )
            return revision
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return None

    @translated
    async def require_revision(self, head: str) -> None:
        current = await self.schema_revision()
        if current == head and self.citus is not None:
            async with self._pool.acquire() as conn:
                self.citus = await distributed.check(conn)  # the tables distributed, too
        if current != head:
            raise MigrationRequired(
                f"the database at {redact(self._dsn)} is at schema revision {current!r}, this "
                f"code needs {head!r}. Run `contextledger migrate --dsn '{redact(self._dsn)}'`"
                + (" with the real password" if redact(self._dsn) != self._dsn else "")
                + " (or open the ledger with migrate=True).",
                current=current,
                required=head,
            )

    async def _append_one(self, row: tuple[Any, ...]) -> Any:
        sql = APPEND_MESSAGE if self.citus is None else APPEND_MESSAGE_CALL
        return await self._hot(lambda conn: conn.fetchval(sql, *row))

    async def _append_many(self, rows: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        columns = [list(c) for c in zip(*rows, strict=True)]
        records = await self._hot(lambda conn: conn.fetch(APPEND_MESSAGES, *columns))
        return {r[0]: r[1] for r in records}

    async def _hot(self, call: Callable[[asyncpg.Connection], Awaitable[Any]]) -> Any:
        """``fetchval`` on a kept connection; falls back to the pool when all are busy.

        A server-side error leaves the connection usable; anything else (a dropped
        connection, a cancellation mid-query) hands it back to the pool, which
        resets or replaces it.
        """
        if self._idle:
            conn = self._idle.pop()
        elif self._lent < self._hot_max:
            self._lent += 1
            try:
                conn = await self._pool.acquire()
            except BaseException:
                self._lent -= 1
                raise
        else:
            async with self._pool.acquire() as pooled:
                return await call(pooled)
        try:
            result = await call(conn)
        except asyncpg.PostgresError as exc:
            if not isinstance(exc, asyncpg.PostgresConnectionError):
                await self._give_back(conn)
                raise
            await self._drop(conn)
            raise
        except BaseException:
            await self._drop(conn)
            raise
        await self._give_back(conn)
        return result

    async def _drop(self, conn: asyncpg.Connection) -> None:
        """Hand a connection in an unknown state back to the pool, which resets or
        replaces it."""
        self._lent -= 1
        try:
            await self._pool.release(conn)
        except Exception as exc:  # already broken: the pool has terminated it
            log.debug("hot_connection_dropped", error=str(exc))

    async def _give_back(self, conn: asyncpg.Connection) -> None:
        if self._closing:  # close() is waiting for every connection to come home
            self._lent -= 1
            await self._pool.release(conn)
        else:
            self._idle.append(conn)

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    # -- sessions ---------------------------------------------------------------------

    @translated
    async def create_session(
        self, session_id: str, payload: SessionCreated, *, created_at: datetime
    ) -> SessionInfo:
        event = make_event(session_id, 1, payload, GENESIS_HASH, created_at=created_at)
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    f"INSERT INTO {S}.sessions (session_id, created_at, model, config, metadata,"
                    " head, last_hash) VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, 1, $6)",
                    session_id,
                    created_at,
                    payload.model,
                    dumps(dict(payload.config)),
                    dumps(dict(payload.metadata)),
                    event.hash,
                )
                await conn.execute(
                    f"INSERT INTO {S}.events (session_id, seq, type, version, data, tokens,"
                    " created_at, hash) VALUES ($1, 1, $2, $3, $4::jsonb, 0, $5, $6)",
                    session_id,
                    event.type,
                    event.version,
                    dumps(event.payload.to_data()),
                    created_at,
                    event.hash,
                )
        except asyncpg.UniqueViolationError:
            raise SessionExists(
                f"session {session_id!r} already exists", session_id=session_id
            ) from None
        self._heads[session_id] = (1, event.hash)
        return SessionInfo(
            session_id,
            created_at,
            payload.model,
            payload.config,
            payload.metadata,
            1,
            event.hash,
            0,
            0,
        )

    @translated
    async def session_info(self, session_id: str) -> SessionInfo:
        row = await self._pool.fetchrow(
            f"SELECT {SESSION_COLUMNS} FROM {S}.sessions WHERE session_id = $1", session_id
        )
        if row is None:
            raise SessionNotFound.for_session(session_id)
        info = _info(row)
        if self._heads.get(session_id) != (info.head, info.last_hash):
            self._closed.pop(session_id, None)  # another writer moved the chain
        self._heads[session_id] = (info.head, info.last_hash)
        return info

    @translated
    async def list_sessions(
        self, *, after: tuple[datetime, str] | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """A page by keyset (migration 0009's index, under row-level security): the rows
        after the last one shown, not an OFFSET past every earlier one."""
        where = "WHERE (created_at, session_id) > ($1, $2)" if after is not None else ""
        args: list[Any] = list(after) if after is not None else []
        page = f" LIMIT ${len(args) + 1}" if limit is not None else ""
        if limit is not None:
            args.append(limit)
        rows = await self._pool.fetch(
            f"SELECT {SESSION_COLUMNS} FROM {S}.sessions {where}"
            f" ORDER BY created_at, session_id{page}",
            *args,
        )
        return [_info(r) for r in rows]

    # -- appends ----------------------------------------------------------------------

    @translated
    async def append(
        self,
        session_id: str,
        payloads: Sequence[Payload],
        *,
        created_at: datetime,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
        known: tuple[int, str] | None = None,
    ) -> AppendResult:
        async with self._lock(session_id):
            if len(payloads) == 1 and isinstance(payloads[0], MessageAppended):
                return await self._append_message(
                    session_id, payloads[0], created_at, expected_seq, idempotency_key, known
                )
            if payloads and all(isinstance(p, MessageAppended) for p in payloads):
                return await self._append_messages(
                    session_id, payloads, created_at, expected_seq, idempotency_key, known
                )
            return await self._append_general(
                session_id, payloads, created_at, expected_seq, idempotency_key, known
            )

    async def _check_target(
        self,
        conn: asyncpg.Connection | asyncpg.Pool,
        session_id: str,
        head: int,
        last_hash: str,
        known: tuple[int, str] | None,
        expected_seq: int | None,
    ) -> None:
        """The shared pure decision (``check_append_target``) with the stored hash it needs."""
        at = None
        if known is not None and known != (head, last_hash) and 0 < known[0] <= head:
            at = await conn.fetchval(
                f"SELECT hash FROM {S}.events WHERE session_id = $1 AND seq = $2",
                session_id,
                known[0],
            )
        check_append_target(
            session_id,
            head=head,
            last_hash=last_hash,
            known=known,
            hash_at_known=at,
            expected_seq=expected_seq,
        )

    async def _head(self, session_id: str, *, fresh: bool = False) -> tuple[int, str]:
        cached = None if fresh else self._heads.get(session_id)
        if cached is None:
            info = await self.session_info(session_id)
            cached = (info.head, info.last_hash)
        return cached

    async def _append_message(
        self,
        session_id: str,
        payload: MessageAppended,
        created_at: datetime,
        expected_seq: int | None,
        key: str | None,
        known: tuple[int, str] | None,
    ) -> AppendResult:
        head, last_hash = await self._head(session_id)
        checked: tuple[int, str] | None = None  # the chain state last found admissible
        for _ in range(_RETRIES):
            if (head, last_hash) != checked and (
                (known is not None and known != (head, last_hash))
                or (expected_seq is not None and expected_seq != head)
            ):
                if checked is None:  # the cached head may be stale: decide on the stored one
                    head, last_hash = await self._head(session_id, fresh=True)
                if (
                    expected_seq is not None
                    and expected_seq != head
                    and key is not None
                    and await self._pool.fetchval(
                        f"SELECT 1 FROM {S}.events WHERE session_id = $1 AND idempotency_key = $2",
                        session_id,
                        key,
                    )
                ):
                    return await self._duplicate(session_id, key, payload.to_data())
                await self._check_target(
                    self._pool, session_id, head, last_hash, known, expected_seq
                )
                checked = (head, last_hash)
            event = make_event(
                session_id, head + 1, payload, last_hash, created_at=created_at, idempotency_key=key
            )
            data_json = (
                event.encoded.decode() if event.encoded is not None else dumps(payload.to_data())
            )
            try:
                view_tokens = await self._batcher.submit(
                    (
                        session_id,
                        event.seq,
                        event.version,
                        data_json,
                        event.tokens,
                        created_at,
                        key,
                        event.hash,
                        last_hash,
                    )
                )
            except asyncpg.UniqueViolationError as exc:
                if key is not None and _idempotency_violation(exc):
                    return await self._duplicate(session_id, key, payload.to_data())
                raise
            except asyncpg.ForeignKeyViolationError:
                raise SessionNotFound.for_session(session_id) from None
            except asyncpg.DeadlockDetectedError:  # our one row lock queued behind a cycle
                view_tokens = None
            if view_tokens is not None:
                self._heads[session_id] = (event.seq, event.hash)
                self._advance(session_id, (head, last_hash), (event.seq, event.hash))
                return AppendResult((event.seq,), False, view_tokens, event.hash)
            # The head moved under us (another process) or the session is gone.
            head, last_hash = await self._head(session_id, fresh=True)
        raise ConcurrencyError(f"gave up appending to {session_id!r} after {_RETRIES} tries")

    async def _append_messages(
        self,
        session_id: str,
        payloads: Sequence[Payload],
        created_at: datetime,
        expected_seq: int | None,
        key: str | None,
        known: tuple[int, str] | None,
    ) -> AppendResult:
        """Many messages, one statement: the conditional head UPDATE (head and last hash,
        so the chain is pinned) gates every INSERT."""
        head, last_hash = await self._head(session_id)
        for _ in range(_RETRIES):
            if known is not None and known != (head, last_hash):
                head, last_hash = await self._head(session_id, fresh=True)
                await self._check_target(
                    self._pool, session_id, head, last_hash, known, expected_seq
                )
            if expected_seq is not None and expected_seq != head:
                head, last_hash = await self._head(session_id, fresh=True)
                if expected_seq != head:
                    if key is not None and await self._pool.fetchval(
                        f"SELECT 1 FROM {S}.events WHERE session_id = $1 AND idempotency_key = $2",
                        session_id,
                        key,
                    ):
                        return await self._duplicate(session_id, key, payloads[-1].to_data())
                    raise ConcurrencyError(
                        f"expected head {expected_seq}, session {session_id!r} is at {head}",
                        expected_seq=expected_seq,
                        head=head,
                    )
            events: list[Event] = []
            prev = last_hash
            for n, payload in enumerate(payloads):
                event = make_event(
                    session_id,
                    head + 1 + n,
                    payload,
                    prev,
                    created_at=created_at,
                    idempotency_key=key if n == len(payloads) - 1 else None,
                )
                events.append(event)
                prev = event.hash
            try:
                view_tokens = await self._pool.fetchval(
                    APPEND_SESSION_MESSAGES if self.citus is None else APPEND_SESSION_MESSAGES_CALL,
                    session_id,
                    head,
                    [e.seq for e in events],
                    [e.version for e in events],
                    [
                        e.encoded.decode() if e.encoded is not None else dumps(e.payload.to_data())
                        for e in events
                    ],
                    [e.tokens for e in events],
                    created_at,
                    [e.hash for e in events],
                    prev,
                    sum(e.tokens for e in events),
                    [e.idempotency_key for e in events],
                    last_hash,
                )
            except asyncpg.UniqueViolationError as exc:
                if key is not None and _idempotency_violation(exc):
                    return await self._duplicate(session_id, key, payloads[-1].to_data())
                raise
            if view_tokens is not None:
                self._heads[session_id] = (events[-1].seq, events[-1].hash)
                self._advance(session_id, (head, last_hash), (events[-1].seq, events[-1].hash))
                return AppendResult(tuple(e.seq for e in events), False, view_tokens, prev)
            head, last_hash = await self._head(session_id, fresh=True)
        raise ConcurrencyError(f"gave up appending to {session_id!r} after {_RETRIES} tries")

    async def _duplicate(self, session_id: str, key: str, data: dict[str, Any]) -> AppendResult:
        row = await self._pool.fetchrow(
            f"SELECT seq, data::text FROM {S}.events WHERE session_id = $1"
            " AND idempotency_key = $2",
            session_id,
            key,
        )
        assert row is not None
        if json.loads(row[1]) != data:
            raise IdempotencyConflict(
                f"idempotency key {key!r} was used for a different event (seq {row[0]})", seq=row[0]
            )
        tokens = await self._pool.fetchval(
            f"SELECT view_tokens FROM {S}.sessions WHERE session_id = $1", session_id
        )
        return AppendResult((row[0],), True, tokens)

    async def _append_general(
        self,
        session_id: str,
        payloads: Sequence[Payload],
        created_at: datetime,
        expected_seq: int | None,
        key: str | None,
        known: tuple[int, str] | None,
    ) -> AppendResult:
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT head, last_hash, model, config::text, view_gen, view_base, branch_base"
                f" FROM {S}.sessions WHERE session_id = $1 FOR UPDATE",
                session_id,
            )
            if row is None:
                raise SessionNotFound.for_session(session_id)
            head, last_hash = row[0], row[1]
            if key is not None:
                dup = await conn.fetchrow(
                    f"SELECT seq, data::text FROM {S}.events WHERE session_id = $1"
                    " AND idempotency_key = $2",
                    session_id,
                    key,
                )
                if dup is not None:
                    if json.loads(dup[1]) != payloads[-1].to_data():
                        raise IdempotencyConflict(
                            f"idempotency key {key!r} was used for a different event "
                            f"(seq {dup[0]})",
                            seq=dup[0],
                        )
                    return AppendResult((dup[0],), True)
            await self._check_target(conn, session_id, head, last_hash, known, expected_seq)
            view = tuple(_item(r) for r in await conn.fetch(READ_VIEW, session_id))
            state = ViewState(head=head, view=view, model=row[2], config=json.loads(row[3]))
            history: list[Event] | None = None

            def state_at(seq: int) -> ViewState:
                assert history is not None
                return fold(history, until=seq)

            if any(p.TYPE == "session.rolled_back" for p in payloads):
                history = [
                    _event(session_id, r)
                    for r in await conn.fetch(
                        f"SELECT {EVENT_COLUMNS} FROM {S}.events"
                        " WHERE session_id = $1 ORDER BY seq",
                        session_id,
                    )
                ]
            step = record_events(
                state,
                session_id,
                last_hash,
                payloads,
                created_at=created_at,
                idempotency_key=key,
                state_at=state_at if history else None,
            )
            await conn.executemany(
                f"INSERT INTO {S}.events (session_id, seq, type, version, data, tokens,"
                " created_at, idempotency_key, hash) VALUES ($1,$2,$3,$4,$5::jsonb,$6,$7,$8,$9)",
                [
                    (
                        session_id,
                        e.seq,
                        e.type,
                        e.version,
                        dumps(e.payload.to_data()),
                        e.tokens,
                        e.created_at,
                        e.idempotency_key,
                        e.hash,
                    )
                    for e in step.events
                ],
            )
            last = step.events[-1]
            gen, view_base = await self._write_view(
                conn, session_id, row[4], row[5], last.seq, view, step.state.view, step.events
            )
            branch_base = row[6]
            if step.branch_reset:
                await conn.execute(
                    f"DELETE FROM {S}.branch_items WHERE session_id = $1", session_id
                )
                await conn.executemany(
                    f"INSERT INTO {S}.branch_items (session_id, ord, seq, part)"
                    " VALUES ($1, $2, $3, $4)",
                    [(session_id, i.ord, i.ref[0], i.ref[1]) for i in step.state.branch],
                )
                branch_base = last.seq
            await conn.execute(
                f"UPDATE {S}.sessions SET head = $2, last_hash = $3, view_tokens = $4,"
                " view_count = $5, config = $6::jsonb, model = $7, view_gen = $8,"
                " view_base = $9, branch_base = $10 WHERE session_id = $1",
                session_id,
                last.seq,
                last.hash,
                step.state.view_tokens,
                len(step.state.view),
                dumps(dict(step.state.config)),
                step.state.model,
                gen,
                view_base,
                branch_base,
            )
        self._heads[session_id] = (last.seq, last.hash)
        self._closed.pop(session_id, None)  # not a message: the gate is probed again
        return AppendResult(
            tuple(e.seq for e in step.events), False, step.state.view_tokens, last.hash
        )

    @staticmethod
    async def _write_view(
        conn: asyncpg.Connection,
        session_id: str,
        gen: int,
        base: int,
        head: int,
        old: Sequence[ViewItem],
        new: Sequence[ViewItem],
        events: Sequence[Event],
    ) -> tuple[int, int]:
        """Bring the stored view from ``old`` to ``new``; return (generation, watermark).

        If the new view is the old one plus this batch's appended messages, those
        are already its implicit tail: nothing to write. Otherwise the whole view is
        materialized under the next generation (the old one deleted, its dead rows
        outside the range reads scan) and the watermark moves to ``head``.
        """
        appended = {e.seq for e in events if isinstance(e.payload, MessageAppended)}
        grown = new[len(old) :]
        if (
            len(new) >= len(old)
            and tuple(new[: len(old)]) == tuple(old)
            and all(i.seq in appended and i.ref[1] == 0 for i in grown)
        ):
            return gen, base
        await conn.execute(
            f"DELETE FROM {S}.view_items WHERE session_id = $1 AND gen = $2", session_id, gen
        )
        await PostgresStore._insert_view(conn, session_id, gen + 1, new)
        return gen + 1, head

    @staticmethod
    async def _insert_view(
        conn: asyncpg.Connection, session_id: str, gen: int, items: Sequence[ViewItem]
    ) -> None:
        if items:
            await conn.executemany(
                f"INSERT INTO {S}.view_items (session_id, gen, ord, seq, part, kind, message,"
                " tokens, critical) VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9)",
                [
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
                ],
            )

    # -- reads ------------------------------------------------------------------------

    @translated
    async def read_view(self, session_id: str) -> tuple[ViewItem, ...]:
        rows = await self._pool.fetch(READ_VIEW, session_id)
        if not rows:
            await self.session_info(session_id)  # raises SessionNotFound
        return tuple(_item(r) for r in rows)

    @translated
    async def read_view_tail(self, session_id: str, max_tokens: int) -> ViewTail:
        """The tail of the view from the end, a page at a time (primary-key range scans):
        O(max_tokens) rows, whatever the history; then the pinned items before it."""
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            row = await conn.fetchrow(
                f"SELECT head, view_tokens, view_gen, view_base FROM {S}.sessions"
                " WHERE session_id = $1",
                session_id,
            )
            if row is None:
                raise SessionNotFound.for_session(session_id)
            head, total, gen, base = row
            got: list[ViewItem] = []  # newest first
            size = 0

            async def older() -> AsyncIterator[ViewItem]:
                cursor = 2**62
                while True:  # message events after the watermark, newest first
                    rows = await conn.fetch(
                        f"SELECT {_TAIL_ROW} FROM {S}.events e WHERE e.session_id = $1"
                        " AND e.seq > $2 AND e.seq < $3 AND e.type = 'message.appended'"
                        " ORDER BY e.seq DESC LIMIT 128",
                        session_id,
                        base,
                        cursor,
                    )
                    for r in rows:
                        yield _item(r)
                    if len(rows) < 128:
                        break
                    cursor = rows[-1][1]
                cursor = 2**62
                while True:  # then the materialized rows of the current generation
                    rows = await conn.fetch(
                        f"SELECT {VIEW_COLUMNS} FROM {S}.view_items WHERE session_id = $1"
                        " AND gen = $2 AND ord < $3 ORDER BY ord DESC LIMIT 128",
                        session_id,
                        gen,
                        cursor,
                    )
                    for r in rows:
                        yield _item(r)
                    if len(rows) < 128:
                        return
                    cursor = rows[-1][0]

            async for item in older():
                if size + item.tokens > max_tokens and got and not _is_result(got[-1]):
                    break  # full, and the tail does not start inside a tool unit
                got.append(item)
                size += item.tokens
            tail = tuple(reversed(got))
            start = tail[0].ord if tail else 2**62
            # pinned items, then the last few user messages (the latest human turn is
            # among them): both by index, never every message before the tail
            args = (session_id, gen, start, base)
            pinned_rows = await conn.fetch(
                f"SELECT {VIEW_COLUMNS} FROM {S}.view_items WHERE session_id = $1 AND gen = $2"
                " AND ord < $3 AND (critical OR kind = 'summary' OR message ->> 'role' = 'system')"
                f" UNION ALL SELECT {_TAIL_ROW} FROM {S}.events e WHERE e.session_id = $1"
                f" AND e.seq > $4 AND e.seq * {ORD_STRIDE} < $3 AND e.type = 'message.appended'"
                " AND (coalesce((e.data ->> 'critical')::boolean, false)"
                " OR e.data -> 'message' ->> 'role' = 'system')",
                *args,
            )
            user_rows = await conn.fetch(
                f"(SELECT {VIEW_COLUMNS} FROM {S}.view_items WHERE session_id = $1 AND gen = $2"
                " AND ord < $3 AND message ->> 'role' = 'user' ORDER BY ord DESC LIMIT $5)"
                f" UNION ALL (SELECT {_TAIL_ROW} FROM {S}.events e WHERE e.session_id = $1"
                f" AND e.seq > $4 AND e.seq < $3 / {ORD_STRIDE} + 1"
                f" AND e.seq * {ORD_STRIDE} < $3 AND e.type = 'message.appended'"
                " AND e.data -> 'message' ->> 'role' = 'user' ORDER BY e.seq DESC LIMIT $5)"
                " ORDER BY 1 DESC LIMIT $5",
                *args,
                LAST_USERS,
            )
        human = next(
            (i for i in map(_item, user_rows) if is_human_turn(i.message)), None
        )  # newest first
        found = {i.ref: i for i in map(_item, pinned_rows)}
        if human is not None:
            found.setdefault(human.ref, human)
        pinned = tuple(sorted(found.values(), key=lambda i: i.ord))
        return ViewTail(tail, pinned, total - size, head)

    @translated
    async def read_branch(self, session_id: str) -> list[dict[str, Any]]:
        rows = await self._pool.fetch(READ_BRANCH, session_id)
        if not rows:
            await self.session_info(session_id)
        return [json.loads(r[1]) for r in rows]

    @translated_iter
    async def read_events(
        self,
        session_id: str,
        from_seq: int = 1,
        to_seq: int | None = None,
        *,
        page: int = 2000,
    ) -> AsyncIterator[Event]:
        upper = to_seq if to_seq is not None else 2**62
        cursor = from_seq
        while True:
            rows = await self._pool.fetch(
                f"SELECT {EVENT_COLUMNS} FROM {S}.events WHERE session_id = $1"
                " AND seq >= $2 AND seq <= $3 ORDER BY seq LIMIT $4",
                session_id,
                cursor,
                upper,
                page,
            )
            for row in rows:
                yield _event(session_id, row)
            if len(rows) < page:
                return
            cursor = rows[-1][0] + 1

    def _advance(self, session_id: str, base: tuple[int, str], tip: tuple[int, str]) -> None:
        """An append through this store linked ``tip`` onto ``base`` (the statement checks the
        link): a remembered closed gate follows the chain only while it is extended here."""
        closed = self._closed.get(session_id)
        if closed is not None:
            if closed.tip == base:
                self._closed[session_id] = closed._replace(tip=tip)
            else:
                del self._closed[session_id]

    @translated
    async def search(
        self,
        session_id: str,
        query: str,
        *,
        exclude: Collection[int],
        upto_seq: int,
        branch: Collection[int] | None,
        limit: int,
        text_config: str,
        head: int | None = None,
        hop: bool = False,
    ) -> list[tuple[int, float]]:
        # The statement of ``search_messages`` (what requests use): the messages it reads
        # by key for the top matches are dropped here.
        rows = await self._search(
            session_id, query, exclude, upto_seq, branch, limit, text_config, head, hop
        )
        return [(r[0], float(r[1])) for r in rows if r[1] != 0]  # not the neighbours

    @translated
    async def search_messages(
        self,
        session_id: str,
        query: str,
        *,
        exclude: Collection[int],
        upto_seq: int,
        branch: Collection[int] | None,
        limit: int,
        text_config: str,
        head: int | None = None,
        hop: bool = False,
    ) -> tuple[list[tuple[int, float]], list[Recalled]]:
        rows = await self._search(
            session_id, query, exclude, upto_seq, branch, limit, text_config, head, hop
        )
        found = [(r[0], float(r[1])) for r in rows if r[1] != 0]  # the rest: neighbours
        recalled = [Recalled(r[0], json.loads(r[2]), r[3], r[4]) for r in rows]
        return found, sorted(recalled, key=attrgetter("seq"))

    async def _search(
        self,
        session_id: str,
        query: str,
        exclude: Collection[int],
        upto_seq: int,
        branch: Collection[int] | None,
        limit: int,
        text_config: str,
        head: int | None,
        hop: bool = False,
    ) -> list[asyncpg.Record]:
        """The search's rows, best first: (seq, rank, message JSON, tokens, created_at);
        a second hop's after them with negated ranks, then neighbours with rank 0."""
        gaps = gate_gaps(upto_seq, exclude)
        closed = self._closed.get(session_id) if branch is None else None
        start = self._heads.get(session_id)
        # the request's seq: the head the caller knows (its search may be anchored before)
        top = upto_seq if head is None else max(head, upto_seq)
        if (
            closed is not None
            and gaps is not None
            and closed.tip == start
            and closed.tip[0] == top
            and top < closed.seq + RECHECK_AFTER
            and closed.gaps.issuperset(gaps)
        ):
            # Every seq left out now was left out then, when none was a branch message,
            # and the branch is the one that search saw: every event since was a message
            # appended through this store onto its chain (``_advance``; any other event,
            # or another writer, forgets the gate; a purged and re-created session is
            # another chain). So nothing is left out (a replay of this request runs the
            # search, and finds nothing either). A search anchored before the head (at
            # its query, ``core.recall.query_anchor``) is covered the same way, if the
            # head the caller knows is the one this store extended: a caller that learned
            # of a later head elsewhere (a view reloaded after another process's rollback)
            # searches.
            return []
        text, args = search_statement(
            query, exclude, upto_seq, branch, limit, text_config, gaps, hop=hop
        )
        args[0] = session_id

        def sql(store: bool) -> str:  # a standby's statement stores nothing
            if store:
                return text
            return search_statement(
                query, exclude, upto_seq, branch, limit, text_config, gaps, store=False, hop=hop
            )[0]

        async def attempt() -> list[asyncpg.Record]:
            try:
                try:
                    return await self._run_search(sql(store=True), args, live=branch is None)
                except asyncpg.ReadOnlySQLTransactionError:  # a standby: same answer, unstored
                    return await self._run_search(sql(store=False), args, live=branch is None)
            except asyncpg.UndefinedObjectError as exc:  # an unknown text search configuration
                raise InvalidArgument(
                    f"recall.text_search_config: {exc}", field="recall.text_search_config"
                ) from None

        rows = await attempt()
        if branch is None:
            self._closed.pop(session_id, None)
            tip = self._heads.get(session_id)
            closed_now = any(r[0] == CLOSED for r in rows)
            # remembered only if nothing was appended here while it ran (the gate must
            # follow the chain from the state the search saw)
            if (
                gaps is not None
                and closed_now
                and tip is not None
                and tip == start
                and tip[0] == top
            ):
                if len(self._closed) >= MAX_REMEMBERED:
                    del self._closed[next(iter(self._closed))]
                self._closed[session_id] = _ClosedGate(upto_seq, frozenset(gaps), tip)
        return [r for r in rows if r[0] != CLOSED]

    async def _run_search(
        self, text: str, args: Sequence[Any], *, live: bool
    ) -> list[asyncpg.Record]:
        """A live search on the search pool (one statement, its settings at connect),
        unless the server refused that pool a slot in the last ``SEARCH_POOL_BACKOFF``
        seconds; a replay, or a live search without a slot, in a transaction on the main
        pool with the same settings set locally."""
        refused = self._search_refused_at
        if (
            live
            and self._search_pool is not None
            and (refused is None or time.monotonic() - refused > SEARCH_POOL_BACKOFF)
        ):
            try:
                async with self._search_pool.acquire() as conn:
                    found: list[asyncpg.Record] = await conn.fetch(text, *args)
                    return found
            except asyncpg.TooManyConnectionsError:  # no slot for it: the main pool's
                self._search_refused_at = time.monotonic()
        async with self._pool.acquire() as conn, conn.transaction():
            generic = live and self.citus is None  # Citus: see ``connect``
            await conn.execute(_LIVE_SEARCH_SETTINGS if generic else _SEARCH_SETTINGS)
            rows: list[asyncpg.Record] = await conn.fetch(text, *args)
            return rows

    def connections(self) -> tuple[int, int]:
        pools = [p for p in (self._pool, self._search_pool) if p is not None]
        return sum(p.get_size() for p in pools), sum(p.get_idle_size() for p in pools)

    @translated
    async def vectors_available(self) -> bool:
        if self._vectors is None:
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                    await conn.execute(EMBEDDINGS_DDL)
                    if self.citus is not None:  # co-located with its session, as 0014's
                        await conn.execute(DISTRIBUTE_EMBEDDINGS)
                self._vectors = True
            except asyncpg.PostgresError as exc:  # no pgvector here (PG 15), or no right
                log.info("recall_vectors_unavailable", error=str(exc))
                self._vectors = False
        return self._vectors

    @translated
    async def unembedded(
        self, session_id: str, model: str, *, upto_seq: int, first: Collection[int], limit: int
    ) -> list[Recalled]:
        sql = UNEMBEDDED.format(branch=_ON_BRANCH)
        rows = await self._pool.fetch(sql, session_id, model, upto_seq, sorted(first), limit)
        return [Recalled(r[0], json.loads(r[1])) for r in rows]

    @translated
    async def store_embeddings(
        self,
        session_id: str,
        model: str,
        available_from: int,
        vectors: Sequence[tuple[int, Sequence[float]]],
    ) -> None:
        if not vectors:
            return
        await self._pool.executemany(
            f"INSERT INTO {S}.event_embeddings (session_id, model, seq, available_from,"
            " embedding) VALUES ($1, $2, $3, $4, $5::text::vector) ON CONFLICT DO NOTHING",
            [
                (session_id, model, seq, available_from, "[" + ",".join(map(repr, vec)) + "]")
                for seq, vec in vectors
            ],
        )

    @translated
    async def vector_search(
        self,
        session_id: str,
        model: str,
        query_seq: int,
        *,
        exclude: Collection[int],
        upto_seq: int,
        branch: Collection[int] | None,
        limit: int,
    ) -> list[tuple[int, float]]:
        if branch is None:
            sql = VECTOR_SEARCH.format(branch=_ON_BRANCH)
            given: list[Any] = []
        else:
            sql = VECTOR_SEARCH.format(branch=_ON_GIVEN_BRANCH.replace("$5", "$7"))
            given = [seq_ranges(branch)]
        rows = await self._pool.fetch(
            sql, session_id, model, upto_seq, seq_ranges(exclude), query_seq, limit, *given
        )
        return [(r[0], float(r[1])) for r in rows]

    @translated
    async def recall_messages(
        self,
        session_id: str,
        seqs: Collection[int],
        *,
        upto_seq: int,
        branch: Collection[int] | None,
    ) -> list[Recalled]:
        if not seqs:
            return []
        if branch is None:
            sql = RECALL_MESSAGES.format(branch=_ON_BRANCH)
            rows = await self._pool.fetch(sql, session_id, sorted(seqs), upto_seq)
        else:
            sql = RECALL_MESSAGES.format(branch=_ON_GIVEN_BRANCH).replace("$5", "$4")
            rows = await self._pool.fetch(
                sql, session_id, sorted(seqs), upto_seq, seq_ranges(branch)
            )
        return [Recalled(r[0], json.loads(r[1]), r[2], r[3]) for r in rows]

    @translated
    async def checkpoints(self, session_id: str) -> list[Checkpoint]:
        rows = await self._pool.fetch(
            f"SELECT seq, data ->> 'label', created_at FROM {S}.events"
            " WHERE session_id = $1 AND type = 'checkpoint.created' ORDER BY seq",
            session_id,
        )
        return [Checkpoint(r[0], r[1], r[2]) for r in rows]

    @translated
    async def rebuild(self, session_id: str, *, repair: bool = True) -> RebuildReport:
        async with self._lock(session_id), self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT view_tokens, view_count, view_gen, head FROM {S}.sessions"
                " WHERE session_id = $1 FOR UPDATE",
                session_id,
            )
            if row is None:
                raise SessionNotFound.for_session(session_id)
            events = [
                _event(session_id, r)
                for r in await conn.fetch(
                    f"SELECT {EVENT_COLUMNS} FROM {S}.events WHERE session_id = $1 ORDER BY seq",
                    session_id,
                )
            ]
            expected = fold(events)
            view = tuple(_item(r) for r in await conn.fetch(READ_VIEW, session_id))
            branch = [(r[0], r[1], r[2]) for r in await conn.fetch(READ_BRANCH_REFS, session_id)]
            diffs = compare_rows(expected.view, view, "view")
            if branch != [(i.ord, i.ref[0], i.ref[1]) for i in expected.branch]:
                diffs.append(
                    f"branch: {len(branch)} stored rows differ from the "
                    f"{len(expected.branch)} expected"
                )
            if (row[0], row[1]) != (expected.view_tokens, len(expected.view)):
                diffs.append(
                    f"session totals: stored {row[0]} tokens / {row[1]} items, "
                    f"expected {expected.view_tokens} / {len(expected.view)}"
                )
            if diffs and repair:
                await conn.execute(f"DELETE FROM {S}.view_items WHERE session_id = $1", session_id)
                await conn.execute(
                    f"DELETE FROM {S}.branch_items WHERE session_id = $1", session_id
                )
                gen = row[2] + 1
                await self._insert_view(conn, session_id, gen, expected.view)
                await conn.executemany(
                    f"INSERT INTO {S}.branch_items (session_id, ord, seq, part)"
                    " VALUES ($1, $2, $3, $4)",
                    [(session_id, i.ord, i.ref[0], i.ref[1]) for i in expected.branch],
                )
                await conn.execute(
                    f"UPDATE {S}.sessions SET view_tokens = $2, view_count = $3, view_gen = $4,"
                    " view_base = $5, branch_base = $5 WHERE session_id = $1",
                    session_id,
                    expected.view_tokens,
                    len(expected.view),
                    gen,
                    row[3],
                )
        if diffs:
            log.warning(
                "projection_rebuilt", session_id=session_id, differences=diffs, repaired=repair
            )
        return RebuildReport(session_id, tuple(diffs), bool(diffs) and repair)

    @translated
    async def purge(self, session_id: str, reason: str) -> int:
        """The audited purge path (see the migration): removes a session entirely."""
        async with self._lock(session_id):
            try:
                # In a transaction block: Citus forwards the purge's SET LOCAL mark to the
                # workers (where the append-only trigger reads it) only within one.
                async with self._pool.acquire() as conn, conn.transaction():
                    n: int = await conn.fetchval(
                        f"SELECT {S}.purge_session($1, $2)", session_id, reason
                    )
            except asyncpg.RaiseError as exc:
                if "no session" in str(exc):
                    raise SessionNotFound.for_session(session_id) from None
                if "reason" in str(exc):
                    raise InvalidArgument(
                        "a purge needs a non-blank reason", field="reason"
                    ) from None
                raise
        self._heads.pop(session_id, None)
        self._closed.pop(session_id, None)
        return n

    @translated
    async def purges(self) -> list[dict[str, Any]]:
        """The audit records of every purge: who removed which session, when and why."""
        rows = await self._pool.fetch(
            f"SELECT session_id, purged_at, purged_by, reason, events, last_hash "
            f"FROM {S}.purges ORDER BY purged_at, session_id"
        )
        return [dict(r) for r in rows]

    @translated
    async def close(self) -> None:
        await self._batcher.wait_idle()  # appends already accepted get their answer
        self._closing = True
        while self._idle:
            self._lent -= 1
            await self._pool.release(self._idle.pop())
        try:
            if self._search_pool is not None:
                await self._search_pool.close()
        finally:
            await self._pool.close()
