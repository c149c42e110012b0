"""Lexical recall on PostgreSQL: the search statement, its builder, and the search
with its closed-gate memo."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from functools import lru_cache
from operator import attrgetter
from typing import Any

import asyncpg
import structlog

from contextledger.core.recall import Recalled
from contextledger.errors import (
    InvalidArgument,
)
from contextledger.store.base import BranchMoved, SearchQuery
from contextledger.store.errors import translated
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
from contextledger.store.lineage import segments
from contextledger.store.postgres.forks import Lineages
from contextledger.store.postgres.lexemes import INDEX_TEXT_CONFIG, POSTINGS, SEARCH_VECTOR
from contextledger.store.postgres.placeholders import bind
from contextledger.store.postgres.statements import _BRANCH_BASE, S
from contextledger.store.postgres.tips import _ClosedGate
from contextledger.store.postgres.warm import (
    FACTS,
    FROM_HELD,
    MATCHED_MESSAGES,
    SYNC_TAIL,
    Fetch,
    Synced,
    gate_open,
    ranked,
)
from contextledger.store.postings import Missing

log = structlog.get_logger(__name__)

#: Seqs of the branch up to seq $upto: the current branch, or (replays) the seqs in $branch, the
#: branch as of the replayed seq, sent as ranges (``seq_ranges``). Hashed subplans or a
#: binary search over the ranges: O(1) or O(log ranges) per row.
_BRANCH_SEQS = f"""
 e.session_id = $1 AND e.seq <= $upto
 AND (e.seq > {_BRANCH_BASE}
      OR e.seq IN (SELECT seq FROM {S}.branch_items WHERE session_id = $1 AND part = 0))"""
_GIVEN_SEQS = """
 e.session_id = $1 AND e.seq <= $upto AND (SELECT $branch::text::int8multirange) @> e.seq"""
#: Message events of the branch (of ``events e``).
_ON_BRANCH = " e.type = 'message.appended' AND" + _BRANCH_SEQS
_ON_GIVEN_BRANCH = " e.type = 'message.appended' AND" + _GIVEN_SEQS
#: A posting (``x``, a message event's) on the branch: the current one, or $branch's.
_POSTING_ON_BRANCH = f"""(x.seq > {_BRANCH_BASE}
      OR x.seq IN (SELECT seq FROM {S}.branch_items WHERE session_id = $1 AND part = 0))"""
_POSTING_ON_GIVEN_BRANCH = "(SELECT $branch::text::int8multirange) @> x.seq"
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
#: Rounds of loads (``WarmIndexes.fill``) one search may take: a lexeme's read doubles
#: what it holds each round, so a replay at the start of a long session takes ~log2 of
#: its postings; past this, a bug.
MAX_FILLS = 100
#: The warm path stores a session's new postings once its head is this many seqs past the
#: stored ones (``Search._index_later``): ~16 turns a statement, after the request. A
#: process's first search of the session computes at most these (and whatever its
#: holder had not stored when it stopped) instead of reading them.
INDEX_BATCH = 32


#: Postings are not written by appends (0006, 0010: the parser would run in every append;
#: an append to a session this process searches computes its message's and returns them):
#: the search indexes the session's message events above its highest indexed seq, up to
#: the session's head (the SQL search in the same statement; the warm path, ``warm.py``,
#: computes them in its catch-up and stores them after the request, ``INDEX_BEHIND``,
#: built from this), reading each by its key in a LATERAL
#: lookup (as a range ``seq > upto``, the generic plan scanned the events table: 15 of an 18
#: ms search at 20,000 turns; as ``seq = ANY(array)``, PostgreSQL 15's generic plan for a
#: table not yet analyzed filtered every event of the session). Events of a session are
#: committed in seq order, so the indexed ones are always a prefix (the empty lexeme marks
#: each indexed message: the newest one is one backward index step); ``fresh`` is computed
#: once, stored, and searched alongside. Postings are derived data, so the search's commit
#: does not wait for the WAL flush (an fsync per request otherwise): a crash can lose only
#: the newest ones, a suffix, which the next search indexes again (``_SEARCH_SETTINGS``).
_CATCH_UP = f"""
WITH indexed AS MATERIALIZED (
    SELECT coalesce((SELECT x.seq FROM {S}.event_terms x
                      WHERE x.session_id = $1 AND x.lexeme = ''
                        AND x.tenant_id = {S}.current_tenant()
                      ORDER BY x.seq DESC LIMIT 1), 0) AS upto
), fresh_vectors AS MATERIALIZED (  -- each by its key (see above)
    SELECT e.session_id, e.seq, e.tenant_id, {SEARCH_VECTOR} AS v
      FROM generate_series((SELECT upto FROM indexed) + 1, (
               SELECT h.head FROM {S}.sessions h
                WHERE h.session_id = $1 AND h.tenant_id = {S}.current_tenant())) g(seq)
     CROSS JOIN LATERAL (
        SELECT * FROM {S}.events x
         WHERE x.session_id = $1 AND x.seq = g.seq AND x.tenant_id = {S}.current_tenant()
        OFFSET 0) e
     WHERE e.type = 'message.appended'
), fresh AS MATERIALIZED ({POSTINGS.format(src="fresh_vectors")}
),"""
_STORE_FRESH = f""" stored AS (
    INSERT INTO {S}.event_terms (session_id, lexeme, seq, tenant_id, tf, dl)
    SELECT session_id, lexeme, seq, tenant_id, tf, dl FROM fresh ON CONFLICT DO NOTHING
),"""
#: The search on Citus: the statement above (with its catch-up) in a function that Citus
#: delegates whole to the worker holding the session's shard, which prepares it on the
#: session's shards once per connection (migration 0018; ``search_call`` gives its
#: arguments). As a statement, Citus planned the search on the coordinator with its
#: values every time (no generic plan for a router query with CTEs) and again on the
#: worker, and the catch-up (a modifying CTE, which Citus cannot route to one shard) had
#: to be a statement of its own, four steps through the coordinator.
SEARCH_CALL = (
    f"SELECT seq, rank, message, tokens, created_at FROM {S}.search_messages("
    "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
)
#: Lexical recall, in work bounded by the query whatever the session's length (the rules
#: are ``store.lexical``'s, which ``memory://`` follows in Python). The query becomes
#: lexemes through PostgreSQL's parser, dictionaries and stop words ($config is the
#: configuration); for each of its ``MAX_QUERY_LEXEMES`` longest, the newest ``PER_TERM``
#: postings of the branch's message events below the request's tail ($tail: what the request
#: carries at its end is skipped by the index condition, the few others it carries, $exclude,
#: are filtered) are one backward range of the ``event_terms`` key. A GIN index answered
#: ``@@`` with every match instead, and on natural text a mid-frequency word matches
#: thousands of messages (the search grew 1.1 -> 94.6 ms a turn from 100 to 20,000 turns).
#: A lexeme read whole has its exact document frequency; one read to the cap has it
#: estimated from how far back its postings reach (``lexical.estimated_df``). BM25 scores
#: each message from the postings' own ``tf`` and ``dl`` (no vector read back), times a
#: small preference for the newer statement; ties go to the newer event. A request that
#: carries every message of the branch (a session shorter than its budget) has nothing to
#: recall. Seqs are dense, so what it leaves out lies among the seqs up to $upto it does not
#: carry (the gaps, ``$gaps``, listed by the caller): when there are few, the gate probes them
#: by key and the rest never runs unless one is a branch message; when there are many
#: (``$gaps`` NULL) the gate is open without a probe. The catch-up still indexes what is new,
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
               * (1.0::float8 + {RECENCY}::float8 * p.seq
                  / greatest(1, $tail::bigint)::float8) AS rank
      FROM {postings} p JOIN {weights} w USING (l)
     GROUP BY p.seq ORDER BY rank DESC, p.seq DESC LIMIT {limit}"""


def _ranked_with_messages(cte: str, rank: str) -> str:
    """The ranked seqs of ``cte`` (best first) with their messages, each read by its key."""
    return f"""(SELECT {cte}.seq, {rank}, e.message, e.tokens, e.created_at
   FROM {cte} CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM {S}.events x
         WHERE x.session_id = $1 AND x.seq = {cte}.seq AND x.tenant_id = {S}.current_tenant()
        OFFSET 0
   ) e
  WHERE {cte}.rank > 0
  ORDER BY {cte}.rank DESC, {cte}.seq DESC)"""


_SEARCH = f"""{{head}} gate AS MATERIALIZED (
    SELECT $gaps::bigint[] IS NULL
        OR EXISTS (SELECT FROM {S}.events e WHERE {{on_branch}} AND e.seq = ANY($gaps::bigint[]))
           AS open
), lq AS MATERIALIZED (
    SELECT l FROM unnest(tsvector_to_array(to_tsvector($config::regconfig, $query))) AS l
     WHERE (SELECT open FROM gate)
     ORDER BY length(l) DESC, l LIMIT {MAX_QUERY_LEXEMES}
), post AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl FROM lq CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM ({{postings}}) y ORDER BY y.seq DESC LIMIT {PER_TERM}
    ) p
), deep_l AS MATERIALIZED (  -- the rarest capped lexemes, read further (``DEEP_*``)
    SELECT l FROM post GROUP BY l HAVING count(*) >= {PER_TERM}
     ORDER BY count(*)::float8 / greatest(1, $tail::bigint - min(seq) + 1), l LIMIT {DEEP_TERMS}
), deep AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl FROM deep_l lq CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM ({{deep_postings}}) y ORDER BY y.seq DESC LIMIT {DEEP_LIMIT}
    ) p
), allpost AS MATERIALIZED (
    SELECT * FROM post WHERE l NOT IN (SELECT l FROM deep_l) UNION ALL SELECT * FROM deep
), w AS MATERIALIZED (
    SELECT l, ln(1 + (greatest($upto, d.df) - d.df + 0.5) / (d.df + 0.5)) AS idf FROM (
        SELECT l, CASE WHEN count(*) < {PER_TERM}
                         OR (count(*) > {PER_TERM} AND count(*) < {DEEP_LIMIT})
                       THEN count(*)::float8
                       ELSE least($upto::float8, count(*) * $upto::float8
                                  / greatest(1, $tail::bigint - min(seq) + 1)) END AS df
          FROM allpost GROUP BY l) d
), top AS MATERIALIZED ({_bm25("allpost", "w", "$limit")}
), hop_lq AS MATERIALIZED (  -- a second hop (``lexical.HOP_*``), when $hop
    SELECT DISTINCT l FROM (
        SELECT seq FROM top WHERE $hop::boolean ORDER BY rank DESC, seq DESC LIMIT {HOP_FROM}) h
      CROSS JOIN LATERAL (
        SELECT unnest(tsvector_to_array({{hop_vector}})) AS l FROM {S}.events e
         WHERE e.session_id = $1 AND e.seq = h.seq AND e.tenant_id = {S}.current_tenant()
        OFFSET 0) v
     WHERE l NOT IN (SELECT l FROM lq)
     ORDER BY l
), hop_near AS MATERIALIZED (  -- the hop's sources' neighbours come as neighbours
    SELECT h.seq + d AS seq FROM (
        SELECT seq FROM top WHERE $hop::boolean ORDER BY rank DESC, seq DESC LIMIT {HOP_FROM}) h
      CROSS JOIN (VALUES (-1), (1)) n(d)
), hop_post AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl
      FROM (SELECT l FROM hop_lq ORDER BY length(l) DESC, l LIMIT {HOP_LEXEMES}) lq
     CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM ({{hop_postings}}) y ORDER BY y.seq DESC LIMIT {PER_TERM}
    ) p
), hop_w AS MATERIALIZED (
    SELECT l, ln(1 + (greatest($upto, d.df) - d.df + 0.5) / (d.df + 0.5)) AS idf FROM (
        SELECT l, count(*)::float8 AS df
          FROM hop_post GROUP BY l HAVING count(*) < {PER_TERM}) d
), hop_top AS MATERIALIZED ({_bm25("hop_post", "hop_w", str(HOP_LIMIT))}
), near AS MATERIALIZED (  -- the neighbours of the best matches (``NEIGHBOURED``)
    SELECT DISTINCT n.seq FROM (
        SELECT seq FROM top WHERE rank > 0 ORDER BY rank DESC, seq DESC LIMIT {NEIGHBOURED}) h
      CROSS JOIN LATERAL (VALUES (h.seq - 1), (h.seq + 1)) n(seq)
     WHERE n.seq BETWEEN 1 AND $upto AND NOT (SELECT $exclude::text::int8multirange) @> n.seq
       AND n.seq NOT IN (SELECT seq FROM top) AND n.seq NOT IN (SELECT seq FROM hop_top)
)
{_ranked_with_messages("top", "top.rank")}
UNION ALL
{_ranked_with_messages("hop_top", "-hop_top.rank")}
UNION ALL
SELECT near.seq, 0::float8, e.message, e.tokens, e.created_at
  FROM near CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM {S}.events x
         WHERE x.session_id = $1 AND x.seq = near.seq AND x.tenant_id = {S}.current_tenant()
           AND x.type = 'message.appended' AND {{branch}}
        OFFSET 0
   ) e
UNION ALL SELECT {CLOSED}::bigint, 0::float8, NULL, NULL, NULL FROM gate WHERE NOT gate.open"""
_UNINDEXED = (
    "jsonb_to_tsvector($config::regconfig, e.data -> 'message', '[\"string\", \"numeric\"]')"
)
#: A lexeme's postings up to $tail: stored (``event_terms``, by its key) and fresh; or, for
#: another text search configuration, computed from the branch's messages on the fly.
#: Each arm is limited itself, so the stored one is a backward index scan that stops after
#: ``PER_TERM`` rows (limited only outside, the plan sorted every posting of the lexeme).
#: The stored arm reads only what was indexed before this search (``indexed.upto``), the
#: fresh arm the rest: on one server a statement never sees its own ``stored`` rows, but
#: Citus runs each CTE as its own step, the insert before the reads, and a search that
#: indexed counted each fresh posting twice (scores 28.8 against 16.5 the next search).
_LEFT_OUT = "NOT (SELECT $exclude::text::int8multirange) @> x.seq AND {branch}"
_STORED_POSTINGS = f"""
            (SELECT x.seq, x.tf, x.dl FROM {S}.event_terms x
              WHERE x.session_id = $1 AND x.lexeme = lq.l AND x.seq <= $tail::bigint
                AND x.seq <= (SELECT upto FROM indexed)
                AND x.tenant_id = {S}.current_tenant() AND {_LEFT_OUT}
              ORDER BY x.seq DESC LIMIT {PER_TERM})
            UNION ALL
            (SELECT x.seq, x.tf, x.dl FROM fresh x
              WHERE x.lexeme = lq.l AND x.seq <= $tail::bigint AND {_LEFT_OUT}
              ORDER BY x.seq DESC LIMIT {PER_TERM})"""
_COMPUTED_POSTINGS = f"""
            SELECT x.seq, x.tf, x.dl FROM computed x WHERE x.lexeme = lq.l AND {_LEFT_OUT}"""
_COMPUTED = f"""WITH computed_vectors AS MATERIALIZED (
    SELECT e.session_id, e.seq, e.tenant_id, {_UNINDEXED} AS v FROM {S}.events e
     WHERE e.type = 'message.appended' AND e.session_id = $1 AND e.seq <= $tail::bigint
       AND e.tenant_id = {S}.current_tenant()
), computed AS MATERIALIZED ({POSTINGS.format(src="computed_vectors")}
),"""


#: For the search's own transaction: its commit need not wait for the WAL flush (see
#: above). A live search also forces the cached generic plan: PostgreSQL costs it above
#: the custom ones, so it planned the statement afresh on every request (~5 ms of planning
#: for ~2 ms of work, measured at 1,000 turns), and its shape suits every session. Not a
#: replay's: its branch is an array parameter, which only a custom plan hashes. Never
#: JIT-compiled (``connections.NO_JIT``; behind PgBouncer the main pool's connections carry
#: no setting of their own).
_SEARCH_SETTINGS = "SET LOCAL synchronous_commit = off; SET LOCAL jit = off"
_LIVE_SEARCH_SETTINGS = _SEARCH_SETTINGS + "; SET LOCAL plan_cache_mode = force_generic_plan"
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
    """The seqs up to ``upto_seq`` a request does not carry (``$gaps`` of the search), or
    None when there are more than ``MAX_GATE_GAPS``."""
    held = carried if isinstance(carried, set | frozenset) else set(carried)
    if held and min(held) > 0 and max(held) <= upto_seq:  # the usual case, at C speed
        inside = len(held)
    else:
        inside = sum(1 for x in held if 0 < x <= upto_seq)
    if upto_seq - inside > MAX_GATE_GAPS:
        return None
    return [x for x in range(1, upto_seq + 1) if x not in held]


@lru_cache(maxsize=16)  # eight shapes: the text's $n resolution is cached by it
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
        "AND NOT (SELECT $exclude",
        "AND x.seq NOT IN (SELECT seq FROM top) AND x.seq NOT IN (SELECT seq FROM hop_near)"
        " AND NOT (SELECT $exclude",
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
    q: SearchQuery, gaps: list[int] | None, *, store: bool = True
) -> tuple[str, list[Any]]:
    """The search's SQL and its arguments (``$1`` the session): live (``q.branch`` None) or
    a replay's, with a second hop or not."""
    values = _search_values(q, q.text_config, gaps)
    if q.branch is None:  # a live search's statement has no $branch
        del values["branch"]
    text = search_sql(
        indexed=q.text_config == INDEX_TEXT_CONFIG, given_branch=q.branch is not None, store=store
    )
    return bind(text, values, q.session_id)


def search_call(q: SearchQuery, gaps: list[int] | None) -> list[Any]:
    """``SEARCH_CALL``'s arguments: the same values as ``search_statement``'s (the stored
    postings' configuration), in the function's order."""
    v = _search_values(q, INDEX_TEXT_CONFIG, gaps)
    return [
        q.session_id,
        *(v[k] for k in ("query", "config", "upto", "tail", "exclude", "gaps", "limit")),
        v["hop"],
        v["branch"],
    ]


def _search_values(q: SearchQuery, text_config: str, gaps: list[int] | None) -> dict[str, Any]:
    return {
        "query": q.query,
        "upto": q.upto_seq,
        "exclude": seq_ranges(q.exclude),
        "config": text_config,
        "limit": q.limit,
        "tail": read_from(q.upto_seq, q.exclude),
        "gaps": gaps,
        "hop": q.hop,
        "branch": None if q.branch is None else seq_ranges(q.branch),
    }


@lru_cache(maxsize=1)
def sync_sql() -> str:
    """The warm path's catch-up (``warm.py``): ``_CATCH_UP`` from the postings held, the
    facts a sync checks, the new postings returned with the query's lexemes (stored by
    ``INDEX_BEHIND``, off the request path)."""
    old, new = FROM_HELD
    assert old in _CATCH_UP
    return _CATCH_UP.replace(old, new) + FACTS + SYNC_TAIL


#: The lexemes of messages by seq, computed with the search vector the catch-ups use (a
#: second hop starting from a message whose postings a process holds only in part:
#: ``warm.fill``; postings stored by an older vector differ only as those did).
FORWARD = f"""
SELECT e.seq, tsvector_to_array({SEARCH_VECTOR})
  FROM unnest($seqs::bigint[]) g(seq) CROSS JOIN LATERAL (
        SELECT * FROM {S}.events x
         WHERE x.session_id = $1 AND x.seq = g.seq AND x.tenant_id = {S}.current_tenant()
        OFFSET 0) e
 WHERE e.type = 'message.appended'"""

#: What the warm path's catch-ups left unstored, stored: the postings of the session's
#: messages above its stored ones (``_CATCH_UP``'s), run after the request that found them
#: missing (``Search._index_behind``). Self-healing: whatever a lost or failed run did not
#: store, the next one does (the stored postings stay a prefix of the messages). The
#: session's row is read FOR KEY SHARE (appends, which update it, are not held up): a
#: purge (FOR UPDATE, then the row deleted) waits for it and deletes what it stored, or
#: goes first, and it then finds no head and stores nothing; in any process.
#: A plain INSERT: stored postings are a prefix, so only another process storing the same
#: session's at the same moment can collide, and ``ON CONFLICT DO NOTHING`` cost every row
#: (6.9 -> 5.2 µs a row, ~30% of the statement, measured on PostgreSQL 18); a collision
#: fails the statement whole, and it runs again from what the other stored (``_index``).
_HEAD = f"WHERE h.session_id = $1 AND h.tenant_id = {S}.current_tenant()))"
_CONFLICTS = " ON CONFLICT DO NOTHING"
INDEX_BEHIND = (
    _CATCH_UP.replace(_HEAD, _HEAD[:-2] + " FOR KEY SHARE))")
    + _STORE_FRESH.replace(_CONFLICTS, "").rstrip().rstrip(",")
    + "\nSELECT count(*), max(seq) FROM fresh"
)
#: Runs of ``INDEX_BEHIND`` one store of a session makes after collisions with another
#: process's (each finds the other's postings stored, and starts after them).
MAX_COLLISIONS = 3


class Search(Lineages):
    """The recall search (``Store.search_messages``: ``find``) on the search pool."""

    #: the sessions whose missing postings a task is storing (``_index_behind``), those
    #: asked again meanwhile, and when a read-only server last refused it
    _indexing: dict[str, asyncio.Task[None]]
    _index_again: set[str]
    _unstored: dict[str, None]
    _index_refused_at: float | None

    @translated
    async def find(self, q: SearchQuery) -> tuple[list[tuple[int, float]], list[Recalled]]:
        """One statement: the matches, with their messages and their neighbours' read by
        key (``_SEARCH``)."""
        rows = await self._search_lineage(q)
        found = [(r[0], float(r[1])) for r in rows if r[1] != 0]  # the rest: neighbours
        recalled = [Recalled(r[0], json.loads(r[2]), r[3], r[4]) for r in rows]
        return found, sorted(recalled, key=attrgetter("seq"))

    async def _search_lineage(self, q: SearchQuery) -> list[Any]:
        """``_search``; a fork's searches each session of its lineage (by that session's
        id, the branch given as a replay's is), best first across them."""
        lineage = await self._lineage(q.session_id)
        if not lineage:
            return await self._search(q)
        on = (
            set(q.branch)
            if q.branch is not None
            else await self._fork_branch_seqs(q.session_id, lineage)
        )
        found: list[Any] = []
        for owner, lo, hi in segments(q.session_id, lineage, 1, q.upto_seq):
            part = {at for at in on if lo <= at <= hi}
            if part:
                found.extend(
                    await self._search(
                        replace(q, session_id=owner, upto_seq=hi, branch=part, head=None)
                    )
                )
        matches = sorted((r for r in found if r[1] > 0), key=lambda r: (-r[1], -r[0]))[: q.limit]
        hopped = sorted((r for r in found if r[1] < 0), key=lambda r: (r[1], -r[0]))[:HOP_LIMIT]
        neighbours = [r for r in found if r[1] == 0]
        return [*matches, *hopped, *neighbours]

    async def _search(self, q: SearchQuery) -> list[asyncpg.Record]:
        """The search's rows, best first: (seq, rank, message JSON, tokens, created_at);
        a second hop's after them with negated ranks, then neighbours with rank 0.
        A sealed session is not searched: its postings would be lexemes of ciphertext."""
        session_id, upto_seq, branch = q.session_id, q.upto_seq, q.branch
        if await self._sealer(session_id) is not None:
            return []
        gaps = gate_gaps(upto_seq, q.exclude)
        closed = self._closed.get(session_id) if branch is None else None
        start = self._heads.get(session_id)
        top = q.seq
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
        if self.citus is None and q.text_config == INDEX_TEXT_CONFIG:
            rows: list[Any] = await self._warm_search(q, gaps)
        else:
            rows = await self._sql_search(q, gaps)
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

    async def _warm_search(self, q: SearchQuery, gaps: list[int] | None) -> list[Any]:
        """The search on the postings this process holds (``warm.py``): one statement
        catches them up, they are ranked here, one more reads the matches' messages.
        Rows as ``_sql_search``'s."""
        fetch = self._fetch(q.session_id, live=q.branch is None)
        synced = await self._warm.sync(
            q.session_id,
            q.query,
            INDEX_TEXT_CONFIG,
            fetch,
            sync_sql(),
            seq=q.seq,
            tip=self._heads.get(q.session_id),
        )
        if synced is None:
            return []
        if synced.on_branch is not None and q.moved_past(synced.on_branch.base):
            raise BranchMoved(q.session_id)  # (a reset after the request's seq: see there)
        try:
            return await self._warm_rows(q, gaps, synced, fetch)
        finally:  # after the request's reads: its connection is back for the tasks
            if synced.unstored:
                self._index_later(q.session_id, synced.lag)
            if synced.postings.base > 1:  # held in part: the rest read in the background
                self._warm.complete_later(q.session_id, self._fetch(q.session_id, live=True))

    def _fetch(self, session_id: str, *, live: bool) -> Fetch:
        """A statement by its named values, ``$1`` the session (``_run_search``)."""

        async def fetch(text: str, values: dict[str, Any]) -> list[asyncpg.Record]:
            statement, args = bind(text, values, session_id)
            return await self._run_search(statement, args, live=live)

        return fetch

    async def _warm_rows(
        self, q: SearchQuery, gaps: list[int] | None, synced: Synced, fetch: Fetch
    ) -> list[Any]:
        """The gate, the ranking on the postings held, the matches' messages by key."""
        if not gate_open(synced, gaps, q.branch):
            return [(CLOSED, 0.0, None, None, None)]
        for _ in range(MAX_FILLS):
            try:
                found, near = ranked(
                    synced,
                    upto_seq=q.upto_seq,
                    exclude=q.exclude,
                    branch=q.branch,
                    limit=q.limit,
                    hop=q.hop,
                )
                break
            except Missing as missing:  # older postings this search reads: loaded, again
                await self._warm.fill(synced, missing, fetch, FORWARD)
        else:  # (each round loads more: a bug, said, not a request that never ends)
            raise RuntimeError(f"recall: {MAX_FILLS} rounds of loads for one search")
        if not found:
            return []
        # Every seq is of the branch the ranking kept to (the hold's as of the request's
        # seq, or the replay's): read by key whatever the branch is now (a rollback that
        # landed since is after the request's seq; ``warm.ranked``).
        values: dict[str, Any] = {"seqs": sorted({s for s, _ in found} | set(near))}
        values["upto"] = q.upto_seq
        read = {r[0]: r for r in await fetch(MATCHED_MESSAGES, values)}
        rows = [(s, score, *read[s][1:]) for s, score in found if s in read]
        return rows + [(s, 0.0, *read[s][1:]) for s in near if s in read]

    def _index_later(self, session_id: str, lag: int) -> None:
        """Postings the stored ones lack are stored once the session's head is
        ``INDEX_BATCH`` seqs past them (one statement for several turns, run after the
        request: ``_index_behind``); until then they are noted (``wait_indexed`` and
        ``close`` store them)."""
        if self._closing:  # (``close`` stores what was noted; a late search's is left)
            return
        if lag >= INDEX_BATCH:
            self._index_behind(session_id)
            return
        unstored = self._unstored
        unstored.pop(session_id, None)
        if len(unstored) >= MAX_REMEMBERED:  # the oldest noted: its next search notes it
            del unstored[next(iter(unstored))]
        unstored[session_id] = None

    def _index_behind(self, session_id: str) -> None:
        """Store what the session's stored postings lack (``INDEX_BEHIND``) in a task of
        its own, one at a time per session (asked again while one runs, it runs once
        more after). Not on a read-only server (refused in the last
        ``SEARCH_POOL_BACKOFF`` seconds)."""
        self._unstored.pop(session_id, None)
        refused = self._index_refused_at
        if refused is not None and time.monotonic() - refused < SEARCH_POOL_BACKOFF:
            return
        if session_id in self._indexing:
            self._index_again.add(session_id)
            return
        task = asyncio.get_running_loop().create_task(self._index(session_id))
        self._indexing[session_id] = task

    async def _index(self, session_id: str) -> None:
        try:
            collisions = 0
            while True:
                self._index_again.discard(session_id)
                statement, args = bind(INDEX_BEHIND, {}, session_id)
                try:
                    ((_, upto),) = await self._run_search(statement, args, live=True)
                except asyncpg.UniqueViolationError:  # another process stored them first
                    collisions += 1
                    if collisions > MAX_COLLISIONS:
                        raise
                    continue
                if upto is not None:
                    self._warm.stored(session_id, upto)
                if session_id not in self._index_again:
                    break
        except asyncpg.ReadOnlySQLTransactionError:  # a standby: searched, never stored
            self._index_refused_at = time.monotonic()
        except Exception as exc:  # the next search finds the postings missing and retries
            log.warning("recall_index_failed", session_id=session_id, error=repr(exc))
        finally:
            self._index_again.discard(session_id)
            del self._indexing[session_id]

    async def wait_indexed(self, session_id: str | None = None, *, store: bool = True) -> None:
        """Until the postings the searches so far found missing are stored (``session_id``
        None: every session's), and the rest of the postings of sessions held in part are
        read (``WarmIndexes.complete``, unless closing: ``close`` stops those first):
        ``close`` and tests that read ``event_terms``. With ``store`` False, only until
        the running tasks end, ``session_id``'s noted postings forgotten (a purge: what
        they would store is about to go; ``INDEX_BEHIND`` holds off a purge meanwhile)."""
        for sid in list(self._unstored):
            if session_id in (None, sid):
                if store:
                    self._index_behind(sid)
                elif sid == session_id:
                    del self._unstored[sid]
        while True:
            pending = [t for sid, t in self._indexing.items() if session_id in (None, sid)]
            if not pending:
                break
            await asyncio.gather(*pending, return_exceptions=True)
        if store:  # and the older postings of sessions held in part, read
            await self._warm.wait()

    async def _sql_search(self, q: SearchQuery, gaps: list[int] | None) -> list[Any]:
        """The search as one statement (``_SEARCH``; on Citus, ``SEARCH_CALL``)."""
        branch = q.branch
        text, args = search_statement(q, gaps)

        def sql(store: bool) -> str:  # a standby's statement stores nothing
            return text if store else search_statement(q, gaps, store=False)[0]

        async def attempt() -> list[asyncpg.Record]:
            try:
                citus = self.citus
                if citus is not None and citus.read_only:  # see ``Citus.read_only``
                    return await self._run_search(sql(store=False), args, live=branch is None)
                if citus is not None and q.text_config == INDEX_TEXT_CONFIG:
                    call = search_call(q, gaps)
                    try:  # one call, run on the session's worker (``SEARCH_CALL``)
                        return await self._run_search(SEARCH_CALL, call, live=branch is None)
                    except asyncpg.ReadOnlySQLTransactionError:  # a standby: unstored
                        return await self._run_search(sql(store=False), args, live=branch is None)
                try:
                    return await self._run_search(sql(store=True), args, live=branch is None)
                except asyncpg.ReadOnlySQLTransactionError:  # a standby: same answer, unstored
                    return await self._run_search(sql(store=False), args, live=branch is None)
            except asyncpg.UndefinedObjectError as exc:  # an unknown text search configuration
                raise InvalidArgument(
                    f"recall.text_search_config: {exc}", field="recall.text_search_config"
                ) from None

        return await attempt()

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
