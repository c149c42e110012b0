"""Recall searches postings by lexeme, newest first: work bounded by the request.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27

A GIN index answers ``@@`` with every match: on natural text a mid-frequency word
matches thousands of a long session's messages, and the search grew with the history
(1.1 / 15.1 / 35.1 / 94.6 ms a turn at 100 / 1,000 / 5,000 / 20,000 turns). Now each
message's lexemes are rows of ``event_terms`` keyed ``(session_id, lexeme, seq)``: a
query lexeme's newest postings are one backward range of a B-tree, read up to a fixed
count, whatever the session's length. Each row carries the lexeme's count in the message
(``tf``) and the message's distinct lexemes (``dl``), so BM25 scores a candidate from the
postings alone, with no vector read back. A row with the empty lexeme marks each indexed
message (the highest says how far the index has caught up).

The vectors of ``event_search`` are moved over (no message is parsed again) and the
table goes with its GIN index and the functions that searched it; ``purge_session``
removes a session's postings. Same tenant column, key, policy and grants as before.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
ROLE = "contextledger_service"
CURRENT = f"{S}.current_tenant()"
_PURGE = """
    CREATE OR REPLACE FUNCTION {s}.purge_session(p_session_id text, p_reason text)
    RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE n bigint; h text;
    BEGIN
        IF coalesce(btrim(p_reason), '') = '' THEN
            RAISE EXCEPTION 'a purge needs a reason';
        END IF;
        SELECT head, last_hash INTO n, h FROM {s}.sessions
            WHERE session_id = p_session_id FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no session %', p_session_id;
        END IF;
        INSERT INTO {s}.purges (session_id, reason, events, last_hash)
            VALUES (p_session_id, p_reason, n, h);
        PERFORM set_config('contextledger.purging', p_session_id, true);
        DELETE FROM {s}.view_items WHERE session_id = p_session_id;
        DELETE FROM {s}.branch_items WHERE session_id = p_session_id;
        DELETE FROM {s}.{search} WHERE session_id = p_session_id;
        DELETE FROM {s}.events WHERE session_id = p_session_id;
        DELETE FROM {s}.sessions WHERE session_id = p_session_id;
        PERFORM set_config('contextledger.purging', '', true);
        RETURN n;
    END $$;
"""
#: A message's postings from its vector (the library's ``POSTINGS`` spells the same rows).
_POSTINGS = """
    SELECT v.session_id, t.lexeme, v.seq, v.tenant_id,
           least(coalesce(array_length(t.positions, 1), 1), 32767)::smallint,
           least(length(v.search), 32767)::smallint
      FROM {src} v CROSS JOIN LATERAL unnest(v.search) t
    UNION ALL
    SELECT v.session_id, '', v.seq, v.tenant_id, 0::smallint,
           least(length(v.search), 32767)::smallint
      FROM {src} v"""


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE {S}.event_terms (
            session_id text NOT NULL,
            lexeme text NOT NULL,
            seq bigint NOT NULL,
            tenant_id text NOT NULL DEFAULT {CURRENT},
            tf smallint NOT NULL,
            dl smallint NOT NULL,
            CONSTRAINT event_terms_pkey PRIMARY KEY (session_id, lexeme, seq, tenant_id)
                INCLUDE (tf, dl)
        )""")
    op.execute(
        f"INSERT INTO {S}.event_terms (session_id, lexeme, seq, tenant_id, tf, dl)"
        + _POSTINGS.format(src=f"{S}.event_search")
    )
    op.execute(f"GRANT SELECT, INSERT, DELETE ON {S}.event_terms TO {ROLE}")
    op.execute(f"ALTER TABLE {S}.event_terms ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_isolation ON {S}.event_terms"
        f" USING (tenant_id = {CURRENT}) WITH CHECK (tenant_id = {CURRENT})"
    )
    op.execute(_PURGE.format(s=S, search="event_terms"))
    op.execute(f"DROP FUNCTION {S}.session_matches(text, tsquery)")
    op.execute(f"DROP FUNCTION {S}.session_query(text, text)")
    op.execute(f"DROP TABLE {S}.event_search")
    op.execute(f"DROP FUNCTION {S}.session_lexeme(text, text)")


def downgrade() -> None:
    # 0007's search state is rebuilt empty: the search indexes the history again on its
    # first run (postings do not keep positions, so no vector can be made back from them).
    op.execute(f"""
        CREATE TABLE {S}.event_search (
            session_id text NOT NULL,
            seq bigint NOT NULL,
            tenant_id text NOT NULL DEFAULT {CURRENT},
            search tsvector NOT NULL,
            CONSTRAINT event_search_pkey PRIMARY KEY (session_id, seq, tenant_id)
        )""")
    op.execute(f"GRANT SELECT, INSERT, DELETE ON {S}.event_search TO {ROLE}")
    op.execute(f"ALTER TABLE {S}.event_search ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_isolation ON {S}.event_search"
        f" USING (tenant_id = {CURRENT}) WITH CHECK (tenant_id = {CURRENT})"
    )
    op.execute(_PURGE.format(s=S, search="event_search"))
    op.execute(f"DROP TABLE {S}.event_terms")
    op.execute(
        f"CREATE INDEX event_search_search ON {S}.event_search USING gin (search)"
        " WITH (gin_pending_list_limit = 64)"
    )
    _revision_0007().upgrade()  # its functions and index, as it made them


def _revision_0007() -> ModuleType:
    path = Path(__file__).with_name("0007_search_by_session.py")
    spec = importlib.util.spec_from_file_location("contextledger_migration_0007", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
