"""The SQL that turns a message event into recall's lexemes, shared by the search's
catch-ups (``search.py``, ``warm.py``) and the appends that lex what they write for a
session this process searches (``statements.APPEND_MESSAGE``): one spelling, so the
postings a process computes either way are the same rows."""

from __future__ import annotations

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
#: A message's postings from its vector ``v`` (migration 0010 spells the same rows).
#: ``dl`` is the message's length in tokens (its lexemes' counts summed), as BM25 has it:
#: with the number of distinct lexemes (0010 to 0014), a message repeating one sentence
#: five times had each word's tf at 5 and the length of one sentence.
POSTINGS = """
    SELECT v.session_id, t.lexeme, v.seq, v.tenant_id,
           least(coalesce(array_length(t.positions, 1), 1), 32767)::smallint AS tf,
           least(n.dl, 32767)::smallint AS dl
      FROM {src} v
     CROSS JOIN LATERAL (SELECT sum(coalesce(array_length(u.positions, 1), 1))::int AS dl
                           FROM unnest(v.v) u) n
     CROSS JOIN LATERAL unnest(v.v) t
    UNION ALL
    SELECT v.session_id, '', v.seq, v.tenant_id, 0::smallint,
           least((SELECT sum(coalesce(array_length(u.positions, 1), 1))::int
                    FROM unnest(v.v) u), 32767)::smallint
      FROM {src} v"""
#: A query text's lexemes (``{query}``: its SQL), NULL for a NULL text: as the warm
#: path's catch-up reads them (``warm.SYNC_TAIL``).
QUERY_LEXEMES = (
    "CASE WHEN {query} IS NOT NULL"
    f" THEN tsvector_to_array(to_tsvector('{INDEX_TEXT_CONFIG}'::regconfig, {{query}})) END"
)
#: A message event's lexemes and their counts (``{data}``: its data as text) when
#: ``{lex}``, else NULLs: one row. ``warm.lexed`` makes them the rows ``POSTINGS`` spells.
LEXED = (
    "SELECT CASE WHEN {lex} THEN coalesce(array_agg(t.lexeme), '{{}}') END AS lexemes,"
    " CASE WHEN {lex} THEN coalesce(array_agg(coalesce(array_length(t.positions, 1), 1)),"
    " '{{}}') END AS tfs"
    f" FROM (SELECT {{data}}::jsonb AS data WHERE {{lex}}) e"
    f" CROSS JOIN LATERAL unnest({SEARCH_VECTOR.replace('{', '{{').replace('}', '}}')}) t"
)
