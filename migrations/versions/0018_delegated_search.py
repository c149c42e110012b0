"""The recall search as a function Citus runs whole on the session's worker.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27

On one server the live search is one statement with a cached generic plan. On Citus it
could not be: Citus plans a query with CTEs on distributed tables only with its
parameters' values, so every search was planned on the coordinator (11-15 ms at 1,000
turns), its shard query planned again on the worker (5-18 ms) and then run, and its
catch-up (the ``INSERT`` of new postings, which Citus cannot route as a CTE) was a second
statement of four steps: 2.4-2.6x one server per turn (issue #27).

``search_messages`` is the store's own search statement (``store/postgres/search.py``,
the one-server statement with its catch-up, ``store=True``), run by a function that
Citus delegates to the worker holding the session's shard (distributed by its session
argument, co-located with ``sessions``, ``force_delegation``), as the appends are (0014).
There the function names the session's shards themselves (``events_102041``: plain
tables to the planner, no Citus planning), prepares the statement once per connection
and shard, and runs it: the coordinator plans only the call, the worker plans the search
once per connection (a generic plan for a live search, as on one server; a replay's
with its values, as on one server). A shard not on this node (the call was not
delegated) is searched through Citus instead, planned each time.

On plain PostgreSQL the function is the same and runs the statement on the tables
themselves; the store does not call it there (its statement is as fast).

The statements are frozen here as of this revision; ``tests/integration/test_recall.py``
checks they are still the store's, so a change to the search needs a migration that
replaces this function.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
ROLE = "contextledger_service"
SIGNATURE = (
    "search_messages(text, text, text, bigint, bigint, text, bigint[], integer, boolean, text)"
)
#: The tables the statements read (and ``event_terms`` written), each replaced by the
#: session's shard of it on Citus.
TABLES = ("events", "event_terms", "sessions", "branch_items")

#: ``search_sql(indexed=True, given_branch=False)`` as ``named`` numbers it.
LIVE = """
WITH indexed AS MATERIALIZED (
    SELECT coalesce((SELECT x.seq FROM contextledger.event_terms x
                      WHERE x.session_id = $1 AND x.lexeme = ''
                        AND x.tenant_id = contextledger.current_tenant()
                      ORDER BY x.seq DESC LIMIT 1), 0) AS upto
), fresh_vectors AS MATERIALIZED (  -- each by its key (see above)
    SELECT e.session_id, e.seq, e.tenant_id, CASE WHEN octet_length(e.data::text) <= 16384 THEN jsonb_to_tsvector('english'::regconfig, coalesce((e.data -> 'message') - 'role', e.data -> 'messages', '{}'::jsonb), '["string", "numeric"]') ELSE to_tsvector('english'::regconfig, left(coalesce(e.data -> 'message' ->> 'content', (e.data -> 'messages')::text, ''), 16384)) END AS v
      FROM generate_series((SELECT upto FROM indexed) + 1, (
               SELECT h.head FROM contextledger.sessions h
                WHERE h.session_id = $1 AND h.tenant_id = contextledger.current_tenant())) g(seq)
     CROSS JOIN LATERAL (
        SELECT * FROM contextledger.events x
         WHERE x.session_id = $1 AND x.seq = g.seq AND x.tenant_id = contextledger.current_tenant()
        OFFSET 0) e
     WHERE e.type = 'message.appended'
), fresh AS MATERIALIZED (
    SELECT v.session_id, t.lexeme, v.seq, v.tenant_id,
           least(coalesce(array_length(t.positions, 1), 1), 32767)::smallint AS tf,
           least(n.dl, 32767)::smallint AS dl
      FROM fresh_vectors v
     CROSS JOIN LATERAL (SELECT sum(coalesce(array_length(u.positions, 1), 1))::int AS dl
                           FROM unnest(v.v) u) n
     CROSS JOIN LATERAL unnest(v.v) t
    UNION ALL
    SELECT v.session_id, '', v.seq, v.tenant_id, 0::smallint,
           least((SELECT sum(coalesce(array_length(u.positions, 1), 1))::int
                    FROM unnest(v.v) u), 32767)::smallint
      FROM fresh_vectors v
), stored AS (
    INSERT INTO contextledger.event_terms (session_id, lexeme, seq, tenant_id, tf, dl)
    SELECT session_id, lexeme, seq, tenant_id, tf, dl FROM fresh ON CONFLICT DO NOTHING
), gate AS MATERIALIZED (
    SELECT $2::bigint[] IS NULL
        OR EXISTS (SELECT FROM contextledger.events e WHERE  e.type = 'message.appended' AND
 e.session_id = $1 AND e.seq <= $3
 AND (e.seq > (SELECT branch_base FROM contextledger.sessions WHERE session_id = $1)
      OR e.seq IN (SELECT seq FROM contextledger.branch_items WHERE session_id = $1 AND part = 0)) AND e.seq = ANY($2::bigint[]))
           AS open
), lq AS MATERIALIZED (
    SELECT l FROM unnest(tsvector_to_array(to_tsvector($4::regconfig, $5))) AS l
     WHERE (SELECT open FROM gate)
     ORDER BY length(l) DESC, l LIMIT 12
), post AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl FROM lq CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM (
            (SELECT x.seq, x.tf, x.dl FROM contextledger.event_terms x
              WHERE x.session_id = $1 AND x.lexeme = lq.l AND x.seq <= $6::bigint
                AND x.seq <= (SELECT upto FROM indexed)
                AND x.tenant_id = contextledger.current_tenant() AND NOT (SELECT $7::text::int8multirange) @> x.seq AND (x.seq > (SELECT branch_base FROM contextledger.sessions WHERE session_id = $1)
      OR x.seq IN (SELECT seq FROM contextledger.branch_items WHERE session_id = $1 AND part = 0))
              ORDER BY x.seq DESC LIMIT 32)
            UNION ALL
            (SELECT x.seq, x.tf, x.dl FROM fresh x
              WHERE x.lexeme = lq.l AND x.seq <= $6::bigint AND NOT (SELECT $7::text::int8multirange) @> x.seq AND (x.seq > (SELECT branch_base FROM contextledger.sessions WHERE session_id = $1)
      OR x.seq IN (SELECT seq FROM contextledger.branch_items WHERE session_id = $1 AND part = 0))
              ORDER BY x.seq DESC LIMIT 32)) y ORDER BY y.seq DESC LIMIT 32
    ) p
), deep_l AS MATERIALIZED (  -- the rarest capped lexemes, read further (``DEEP_*``)
    SELECT l FROM post GROUP BY l HAVING count(*) >= 32
     ORDER BY count(*)::float8 / greatest(1, $6::bigint - min(seq) + 1), l LIMIT 6
), deep AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl FROM deep_l lq CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM (
            (SELECT x.seq, x.tf, x.dl FROM contextledger.event_terms x
              WHERE x.session_id = $1 AND x.lexeme = lq.l AND x.seq <= $6::bigint
                AND x.seq <= (SELECT upto FROM indexed)
                AND x.tenant_id = contextledger.current_tenant() AND NOT (SELECT $7::text::int8multirange) @> x.seq AND (x.seq > (SELECT branch_base FROM contextledger.sessions WHERE session_id = $1)
      OR x.seq IN (SELECT seq FROM contextledger.branch_items WHERE session_id = $1 AND part = 0))
              ORDER BY x.seq DESC LIMIT 1024)
            UNION ALL
            (SELECT x.seq, x.tf, x.dl FROM fresh x
              WHERE x.lexeme = lq.l AND x.seq <= $6::bigint AND NOT (SELECT $7::text::int8multirange) @> x.seq AND (x.seq > (SELECT branch_base FROM contextledger.sessions WHERE session_id = $1)
      OR x.seq IN (SELECT seq FROM contextledger.branch_items WHERE session_id = $1 AND part = 0))
              ORDER BY x.seq DESC LIMIT 1024)) y ORDER BY y.seq DESC LIMIT 1024
    ) p
), allpost AS MATERIALIZED (
    SELECT * FROM post WHERE l NOT IN (SELECT l FROM deep_l) UNION ALL SELECT * FROM deep
), w AS MATERIALIZED (
    SELECT l, ln(1 + (greatest($3, d.df) - d.df + 0.5) / (d.df + 0.5)) AS idf FROM (
        SELECT l, CASE WHEN count(*) < 32
                         OR (count(*) > 32 AND count(*) < 1024)
                       THEN count(*)::float8
                       ELSE least($3::float8, count(*) * $3::float8
                                  / greatest(1, $6::bigint - min(seq) + 1)) END AS df
          FROM allpost GROUP BY l) d
), top AS MATERIALIZED (
    SELECT p.seq, sum(w.idf * p.tf * 1.5::float8
                      / (p.tf + 0.5::float8 * (0.09999999999999998::float8 + 0.9::float8 * p.dl
                         / greatest(1.0::float8, (SELECT avg(dl)::float8 FROM allpost)))))
               * (1.0::float8 + 0.15::float8 * p.seq
                  / greatest(1, $6::bigint)::float8) AS rank
      FROM allpost p JOIN w w USING (l)
     GROUP BY p.seq ORDER BY rank DESC, p.seq DESC LIMIT $8
), hop_lq AS MATERIALIZED (  -- a second hop (``lexical.HOP_*``), when $9
    SELECT DISTINCT l FROM (
        SELECT seq FROM top WHERE $9::boolean ORDER BY rank DESC, seq DESC LIMIT 2) h
      CROSS JOIN LATERAL (
        SELECT unnest(tsvector_to_array(CASE WHEN octet_length(e.data::text) <= 16384 THEN jsonb_to_tsvector('english'::regconfig, coalesce((e.data -> 'message') - 'role', e.data -> 'messages', '{}'::jsonb), '["string", "numeric"]') ELSE to_tsvector('english'::regconfig, left(coalesce(e.data -> 'message' ->> 'content', (e.data -> 'messages')::text, ''), 16384)) END)) AS l FROM contextledger.events e
         WHERE e.session_id = $1 AND e.seq = h.seq AND e.tenant_id = contextledger.current_tenant()
        OFFSET 0) v
     WHERE l NOT IN (SELECT l FROM lq)
     ORDER BY l
), hop_near AS MATERIALIZED (  -- the hop's sources' neighbours come as neighbours
    SELECT h.seq + d AS seq FROM (
        SELECT seq FROM top WHERE $9::boolean ORDER BY rank DESC, seq DESC LIMIT 2) h
      CROSS JOIN (VALUES (-1), (1)) n(d)
), hop_post AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl
      FROM (SELECT l FROM hop_lq ORDER BY length(l) DESC, l LIMIT 8) lq
     CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM (
            (SELECT x.seq, x.tf, x.dl FROM contextledger.event_terms x
              WHERE x.session_id = $1 AND x.lexeme = lq.l AND x.seq <= $6::bigint
                AND x.seq <= (SELECT upto FROM indexed)
                AND x.tenant_id = contextledger.current_tenant() AND x.seq NOT IN (SELECT seq FROM top) AND x.seq NOT IN (SELECT seq FROM hop_near) AND NOT (SELECT $7::text::int8multirange) @> x.seq AND (x.seq > (SELECT branch_base FROM contextledger.sessions WHERE session_id = $1)
      OR x.seq IN (SELECT seq FROM contextledger.branch_items WHERE session_id = $1 AND part = 0))
              ORDER BY x.seq DESC LIMIT 32)
            UNION ALL
            (SELECT x.seq, x.tf, x.dl FROM fresh x
              WHERE x.lexeme = lq.l AND x.seq <= $6::bigint AND x.seq NOT IN (SELECT seq FROM top) AND x.seq NOT IN (SELECT seq FROM hop_near) AND NOT (SELECT $7::text::int8multirange) @> x.seq AND (x.seq > (SELECT branch_base FROM contextledger.sessions WHERE session_id = $1)
      OR x.seq IN (SELECT seq FROM contextledger.branch_items WHERE session_id = $1 AND part = 0))
              ORDER BY x.seq DESC LIMIT 32)) y ORDER BY y.seq DESC LIMIT 32
    ) p
), hop_w AS MATERIALIZED (
    SELECT l, ln(1 + (greatest($3, d.df) - d.df + 0.5) / (d.df + 0.5)) AS idf FROM (
        SELECT l, count(*)::float8 AS df
          FROM hop_post GROUP BY l HAVING count(*) < 32) d
), hop_top AS MATERIALIZED (
    SELECT p.seq, sum(w.idf * p.tf * 1.5::float8
                      / (p.tf + 0.5::float8 * (0.09999999999999998::float8 + 0.9::float8 * p.dl
                         / greatest(1.0::float8, (SELECT avg(dl)::float8 FROM hop_post)))))
               * (1.0::float8 + 0.15::float8 * p.seq
                  / greatest(1, $6::bigint)::float8) AS rank
      FROM hop_post p JOIN hop_w w USING (l)
     GROUP BY p.seq ORDER BY rank DESC, p.seq DESC LIMIT 6
), near AS MATERIALIZED (  -- the neighbours of the best matches (``NEIGHBOURED``)
    SELECT DISTINCT n.seq FROM (
        SELECT seq FROM top WHERE rank > 0 ORDER BY rank DESC, seq DESC LIMIT 8) h
      CROSS JOIN LATERAL (VALUES (h.seq - 1), (h.seq + 1)) n(seq)
     WHERE n.seq BETWEEN 1 AND $3 AND NOT (SELECT $7::text::int8multirange) @> n.seq
       AND n.seq NOT IN (SELECT seq FROM top) AND n.seq NOT IN (SELECT seq FROM hop_top)
)
(SELECT top.seq, top.rank, e.message, e.tokens, e.created_at
   FROM top CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM contextledger.events x
         WHERE x.session_id = $1 AND x.seq = top.seq AND x.tenant_id = contextledger.current_tenant()
        OFFSET 0
   ) e
  WHERE top.rank > 0
  ORDER BY top.rank DESC, top.seq DESC)
UNION ALL
(SELECT hop_top.seq, -hop_top.rank, e.message, e.tokens, e.created_at
   FROM hop_top CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM contextledger.events x
         WHERE x.session_id = $1 AND x.seq = hop_top.seq AND x.tenant_id = contextledger.current_tenant()
        OFFSET 0
   ) e
  WHERE hop_top.rank > 0
  ORDER BY hop_top.rank DESC, hop_top.seq DESC)
UNION ALL
SELECT near.seq, 0::float8, e.message, e.tokens, e.created_at
  FROM near CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM contextledger.events x
         WHERE x.session_id = $1 AND x.seq = near.seq AND x.tenant_id = contextledger.current_tenant()
           AND x.type = 'message.appended' AND (x.seq > (SELECT branch_base FROM contextledger.sessions WHERE session_id = $1)
      OR x.seq IN (SELECT seq FROM contextledger.branch_items WHERE session_id = $1 AND part = 0))
        OFFSET 0
   ) e
UNION ALL SELECT -1::bigint, 0::float8, NULL, NULL, NULL FROM gate WHERE NOT gate.open"""  # noqa: E501
LIVE_ARGS = (
    "p_session",
    "p_gaps",
    "p_upto",
    "p_config",
    "p_query",
    "p_tail",
    "p_exclude",
    "p_limit",
    "p_hop",
)

#: ``search_sql(indexed=True, given_branch=True)`` as ``named`` numbers it.
REPLAY = """
WITH indexed AS MATERIALIZED (
    SELECT coalesce((SELECT x.seq FROM contextledger.event_terms x
                      WHERE x.session_id = $1 AND x.lexeme = ''
                        AND x.tenant_id = contextledger.current_tenant()
                      ORDER BY x.seq DESC LIMIT 1), 0) AS upto
), fresh_vectors AS MATERIALIZED (  -- each by its key (see above)
    SELECT e.session_id, e.seq, e.tenant_id, CASE WHEN octet_length(e.data::text) <= 16384 THEN jsonb_to_tsvector('english'::regconfig, coalesce((e.data -> 'message') - 'role', e.data -> 'messages', '{}'::jsonb), '["string", "numeric"]') ELSE to_tsvector('english'::regconfig, left(coalesce(e.data -> 'message' ->> 'content', (e.data -> 'messages')::text, ''), 16384)) END AS v
      FROM generate_series((SELECT upto FROM indexed) + 1, (
               SELECT h.head FROM contextledger.sessions h
                WHERE h.session_id = $1 AND h.tenant_id = contextledger.current_tenant())) g(seq)
     CROSS JOIN LATERAL (
        SELECT * FROM contextledger.events x
         WHERE x.session_id = $1 AND x.seq = g.seq AND x.tenant_id = contextledger.current_tenant()
        OFFSET 0) e
     WHERE e.type = 'message.appended'
), fresh AS MATERIALIZED (
    SELECT v.session_id, t.lexeme, v.seq, v.tenant_id,
           least(coalesce(array_length(t.positions, 1), 1), 32767)::smallint AS tf,
           least(n.dl, 32767)::smallint AS dl
      FROM fresh_vectors v
     CROSS JOIN LATERAL (SELECT sum(coalesce(array_length(u.positions, 1), 1))::int AS dl
                           FROM unnest(v.v) u) n
     CROSS JOIN LATERAL unnest(v.v) t
    UNION ALL
    SELECT v.session_id, '', v.seq, v.tenant_id, 0::smallint,
           least((SELECT sum(coalesce(array_length(u.positions, 1), 1))::int
                    FROM unnest(v.v) u), 32767)::smallint
      FROM fresh_vectors v
), stored AS (
    INSERT INTO contextledger.event_terms (session_id, lexeme, seq, tenant_id, tf, dl)
    SELECT session_id, lexeme, seq, tenant_id, tf, dl FROM fresh ON CONFLICT DO NOTHING
), gate AS MATERIALIZED (
    SELECT $2::bigint[] IS NULL
        OR EXISTS (SELECT FROM contextledger.events e WHERE  e.type = 'message.appended' AND
 e.session_id = $1 AND e.seq <= $3 AND (SELECT $4::text::int8multirange) @> e.seq AND e.seq = ANY($2::bigint[]))
           AS open
), lq AS MATERIALIZED (
    SELECT l FROM unnest(tsvector_to_array(to_tsvector($5::regconfig, $6))) AS l
     WHERE (SELECT open FROM gate)
     ORDER BY length(l) DESC, l LIMIT 12
), post AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl FROM lq CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM (
            (SELECT x.seq, x.tf, x.dl FROM contextledger.event_terms x
              WHERE x.session_id = $1 AND x.lexeme = lq.l AND x.seq <= $7::bigint
                AND x.seq <= (SELECT upto FROM indexed)
                AND x.tenant_id = contextledger.current_tenant() AND NOT (SELECT $8::text::int8multirange) @> x.seq AND (SELECT $4::text::int8multirange) @> x.seq
              ORDER BY x.seq DESC LIMIT 32)
            UNION ALL
            (SELECT x.seq, x.tf, x.dl FROM fresh x
              WHERE x.lexeme = lq.l AND x.seq <= $7::bigint AND NOT (SELECT $8::text::int8multirange) @> x.seq AND (SELECT $4::text::int8multirange) @> x.seq
              ORDER BY x.seq DESC LIMIT 32)) y ORDER BY y.seq DESC LIMIT 32
    ) p
), deep_l AS MATERIALIZED (  -- the rarest capped lexemes, read further (``DEEP_*``)
    SELECT l FROM post GROUP BY l HAVING count(*) >= 32
     ORDER BY count(*)::float8 / greatest(1, $7::bigint - min(seq) + 1), l LIMIT 6
), deep AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl FROM deep_l lq CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM (
            (SELECT x.seq, x.tf, x.dl FROM contextledger.event_terms x
              WHERE x.session_id = $1 AND x.lexeme = lq.l AND x.seq <= $7::bigint
                AND x.seq <= (SELECT upto FROM indexed)
                AND x.tenant_id = contextledger.current_tenant() AND NOT (SELECT $8::text::int8multirange) @> x.seq AND (SELECT $4::text::int8multirange) @> x.seq
              ORDER BY x.seq DESC LIMIT 1024)
            UNION ALL
            (SELECT x.seq, x.tf, x.dl FROM fresh x
              WHERE x.lexeme = lq.l AND x.seq <= $7::bigint AND NOT (SELECT $8::text::int8multirange) @> x.seq AND (SELECT $4::text::int8multirange) @> x.seq
              ORDER BY x.seq DESC LIMIT 1024)) y ORDER BY y.seq DESC LIMIT 1024
    ) p
), allpost AS MATERIALIZED (
    SELECT * FROM post WHERE l NOT IN (SELECT l FROM deep_l) UNION ALL SELECT * FROM deep
), w AS MATERIALIZED (
    SELECT l, ln(1 + (greatest($3, d.df) - d.df + 0.5) / (d.df + 0.5)) AS idf FROM (
        SELECT l, CASE WHEN count(*) < 32
                         OR (count(*) > 32 AND count(*) < 1024)
                       THEN count(*)::float8
                       ELSE least($3::float8, count(*) * $3::float8
                                  / greatest(1, $7::bigint - min(seq) + 1)) END AS df
          FROM allpost GROUP BY l) d
), top AS MATERIALIZED (
    SELECT p.seq, sum(w.idf * p.tf * 1.5::float8
                      / (p.tf + 0.5::float8 * (0.09999999999999998::float8 + 0.9::float8 * p.dl
                         / greatest(1.0::float8, (SELECT avg(dl)::float8 FROM allpost)))))
               * (1.0::float8 + 0.15::float8 * p.seq
                  / greatest(1, $7::bigint)::float8) AS rank
      FROM allpost p JOIN w w USING (l)
     GROUP BY p.seq ORDER BY rank DESC, p.seq DESC LIMIT $9
), hop_lq AS MATERIALIZED (  -- a second hop (``lexical.HOP_*``), when $10
    SELECT DISTINCT l FROM (
        SELECT seq FROM top WHERE $10::boolean ORDER BY rank DESC, seq DESC LIMIT 2) h
      CROSS JOIN LATERAL (
        SELECT unnest(tsvector_to_array(CASE WHEN octet_length(e.data::text) <= 16384 THEN jsonb_to_tsvector('english'::regconfig, coalesce((e.data -> 'message') - 'role', e.data -> 'messages', '{}'::jsonb), '["string", "numeric"]') ELSE to_tsvector('english'::regconfig, left(coalesce(e.data -> 'message' ->> 'content', (e.data -> 'messages')::text, ''), 16384)) END)) AS l FROM contextledger.events e
         WHERE e.session_id = $1 AND e.seq = h.seq AND e.tenant_id = contextledger.current_tenant()
        OFFSET 0) v
     WHERE l NOT IN (SELECT l FROM lq)
     ORDER BY l
), hop_near AS MATERIALIZED (  -- the hop's sources' neighbours come as neighbours
    SELECT h.seq + d AS seq FROM (
        SELECT seq FROM top WHERE $10::boolean ORDER BY rank DESC, seq DESC LIMIT 2) h
      CROSS JOIN (VALUES (-1), (1)) n(d)
), hop_post AS MATERIALIZED (
    SELECT lq.l, p.seq, p.tf, p.dl
      FROM (SELECT l FROM hop_lq ORDER BY length(l) DESC, l LIMIT 8) lq
     CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM (
            (SELECT x.seq, x.tf, x.dl FROM contextledger.event_terms x
              WHERE x.session_id = $1 AND x.lexeme = lq.l AND x.seq <= $7::bigint
                AND x.seq <= (SELECT upto FROM indexed)
                AND x.tenant_id = contextledger.current_tenant() AND x.seq NOT IN (SELECT seq FROM top) AND x.seq NOT IN (SELECT seq FROM hop_near) AND NOT (SELECT $8::text::int8multirange) @> x.seq AND (SELECT $4::text::int8multirange) @> x.seq
              ORDER BY x.seq DESC LIMIT 32)
            UNION ALL
            (SELECT x.seq, x.tf, x.dl FROM fresh x
              WHERE x.lexeme = lq.l AND x.seq <= $7::bigint AND x.seq NOT IN (SELECT seq FROM top) AND x.seq NOT IN (SELECT seq FROM hop_near) AND NOT (SELECT $8::text::int8multirange) @> x.seq AND (SELECT $4::text::int8multirange) @> x.seq
              ORDER BY x.seq DESC LIMIT 32)) y ORDER BY y.seq DESC LIMIT 32
    ) p
), hop_w AS MATERIALIZED (
    SELECT l, ln(1 + (greatest($3, d.df) - d.df + 0.5) / (d.df + 0.5)) AS idf FROM (
        SELECT l, count(*)::float8 AS df
          FROM hop_post GROUP BY l HAVING count(*) < 32) d
), hop_top AS MATERIALIZED (
    SELECT p.seq, sum(w.idf * p.tf * 1.5::float8
                      / (p.tf + 0.5::float8 * (0.09999999999999998::float8 + 0.9::float8 * p.dl
                         / greatest(1.0::float8, (SELECT avg(dl)::float8 FROM hop_post)))))
               * (1.0::float8 + 0.15::float8 * p.seq
                  / greatest(1, $7::bigint)::float8) AS rank
      FROM hop_post p JOIN hop_w w USING (l)
     GROUP BY p.seq ORDER BY rank DESC, p.seq DESC LIMIT 6
), near AS MATERIALIZED (  -- the neighbours of the best matches (``NEIGHBOURED``)
    SELECT DISTINCT n.seq FROM (
        SELECT seq FROM top WHERE rank > 0 ORDER BY rank DESC, seq DESC LIMIT 8) h
      CROSS JOIN LATERAL (VALUES (h.seq - 1), (h.seq + 1)) n(seq)
     WHERE n.seq BETWEEN 1 AND $3 AND NOT (SELECT $8::text::int8multirange) @> n.seq
       AND n.seq NOT IN (SELECT seq FROM top) AND n.seq NOT IN (SELECT seq FROM hop_top)
)
(SELECT top.seq, top.rank, e.message, e.tokens, e.created_at
   FROM top CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM contextledger.events x
         WHERE x.session_id = $1 AND x.seq = top.seq AND x.tenant_id = contextledger.current_tenant()
        OFFSET 0
   ) e
  WHERE top.rank > 0
  ORDER BY top.rank DESC, top.seq DESC)
UNION ALL
(SELECT hop_top.seq, -hop_top.rank, e.message, e.tokens, e.created_at
   FROM hop_top CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM contextledger.events x
         WHERE x.session_id = $1 AND x.seq = hop_top.seq AND x.tenant_id = contextledger.current_tenant()
        OFFSET 0
   ) e
  WHERE hop_top.rank > 0
  ORDER BY hop_top.rank DESC, hop_top.seq DESC)
UNION ALL
SELECT near.seq, 0::float8, e.message, e.tokens, e.created_at
  FROM near CROSS JOIN LATERAL (
        SELECT (x.data -> 'message')::text AS message, x.tokens, x.created_at FROM contextledger.events x
         WHERE x.session_id = $1 AND x.seq = near.seq AND x.tenant_id = contextledger.current_tenant()
           AND x.type = 'message.appended' AND (SELECT $4::text::int8multirange) @> x.seq
        OFFSET 0
   ) e
UNION ALL SELECT -1::bigint, 0::float8, NULL, NULL, NULL FROM gate WHERE NOT gate.open"""  # noqa: E501
REPLAY_ARGS = (
    "p_session",
    "p_gaps",
    "p_upto",
    "p_branch",
    "p_config",
    "p_query",
    "p_tail",
    "p_exclude",
    "p_limit",
    "p_hop",
)


def _literals(args: Sequence[str]) -> str:
    """The arguments as SQL literals, in the statement's ``$n`` order."""
    return "ARRAY[" + ", ".join(f"quote_nullable({a})" for a in args) + "]"


FUNCTION = f"""
CREATE FUNCTION {S}.search_messages(
    p_session text, p_query text, p_config text, p_upto bigint, p_tail bigint,
    p_exclude text, p_gaps bigint[], p_limit integer, p_hop boolean, p_branch text)
RETURNS TABLE (seq bigint, rank double precision, message text, tokens integer,
               created_at timestamptz)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $fn$
DECLARE
    v_live constant boolean := p_branch IS NULL;
    v_citus constant boolean := EXISTS (
        SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus');
    v_name text := CASE WHEN p_branch IS NULL THEN '{S}_search_live'
                        ELSE '{S}_search_replay' END;
    v_args text[];
    v_sql text;
    v_table text;
    v_shard text;
BEGIN
    -- postings are derived data: the commit need not wait for the WAL flush
    SET LOCAL synchronous_commit = off;
    IF v_live THEN
        v_args := {_literals(LIVE_ARGS)};
    ELSE  -- a replay's branch is a parameter only a custom plan hashes
        SET LOCAL plan_cache_mode = force_custom_plan;
        v_args := {_literals(REPLAY_ARGS)};
    END IF;
    IF v_citus THEN
        v_name := v_name || '_'
            || get_shard_id_for_distribution_column('{S}.events', p_session);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_prepared_statements WHERE name = v_name) THEN
        v_sql := CASE WHEN v_live THEN $live${LIVE}$live$ ELSE $replay${REPLAY}$replay$ END;
        IF v_citus THEN  -- the session's shards on this node, by name
            FOREACH v_table IN ARRAY ARRAY{list(TABLES)!r} LOOP
                v_shard := shard_name(('{S}.' || v_table)::regclass,
                    get_shard_id_for_distribution_column('{S}.' || v_table, p_session));
                IF to_regclass(v_shard) IS NULL THEN
                    -- not delegated (a worker without Citus' metadata): Citus
                    -- 13.2 crashed running the statement from a function here
                    RAISE EXCEPTION 'session %''s shard % is not on this node', p_session,
                        v_shard USING ERRCODE = 'object_not_in_prerequisite_state',
                        HINT = 'contextledger.search_messages runs where Citus delegates'
                            ' it: every worker needs the metadata (citus_add_node syncs it)';
                END IF;
                v_sql := regexp_replace(v_sql, '{S}\\.' || v_table || '\\M', v_shard, 'g');
            END LOOP;
        END IF;
        EXECUTE format('PREPARE %I AS %s', v_name, v_sql);
    END IF;
    RETURN QUERY EXECUTE format('EXECUTE %I(%s)', v_name, array_to_string(v_args, ', '));
END $fn$"""


def has_citus(bind: sa.Connection) -> bool:
    found = bind.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'citus'").first()
    return found is not None


def upgrade() -> None:
    op.execute(FUNCTION)
    op.execute(f"GRANT EXECUTE ON FUNCTION {S}.{SIGNATURE} TO {ROLE}")
    if has_citus(op.get_bind()):
        op.execute("SET LOCAL citus.multi_shard_modify_mode = sequential")
        op.execute(
            f"SELECT create_distributed_function('{S}.{SIGNATURE}', 'p_session',"
            f" colocate_with => '{S}.sessions', force_delegation => true)"
        )


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {S}.{SIGNATURE}")
