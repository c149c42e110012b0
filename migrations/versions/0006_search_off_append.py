"""Recall's search vectors leave the append path: a table filled when recall searches.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

0003 kept each event's tsvector in a STORED generated column of ``events``, so every
append parsed its message inside the append's statement. Measured A/B on one server
(scratch copies of ``events`` with and without each feature, raw asyncpg loops, medians
of 7 rounds, against the 0002 table): the column alone made an INSERT 1.3-1.4x as
expensive with 32 writers and ``synchronous_commit=on``, 1.6-2.0x on CPU alone (the
text parser costs 57-85 µs for a 430-byte chat message, and the stored vector adds
~450 bytes to a ~700-byte row and its WAL). The tenant column, its function default,
the widened keys and row-level security measured 0.9-1.06x (noise) for the owner, 1.15x
under RLS.

Now ``event_search`` holds the vectors of ``message.appended`` events (the only ones
recall searches), with the GIN index of 0005. The library's search statement first
indexes the session's message events above the highest indexed seq (one statement:
those vectors are computed once, inserted, and searched with the rest), so an append
writes no vector at all and each event is still parsed once. Existing vectors are
copied over, not recomputed. Same tenant column, key, policy and grants as the tables
of 0004; ``purge_session`` removes a session's vectors too.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
ROLE = "contextledger_service"
CURRENT = f"{S}.current_tenant()"
#: 0003's expression, for the downgrade (the library's copy is in store/postgres.py).
SEARCH_VECTOR = (
    "CASE WHEN octet_length(data::text) <= 16384"
    " THEN jsonb_to_tsvector('english'::regconfig,"
    " coalesce(data -> 'message', data -> 'messages', '{}'::jsonb), '[\"string\", \"numeric\"]')"
    " ELSE to_tsvector('english'::regconfig, left(coalesce(data -> 'message' ->> 'content',"
    " (data -> 'messages')::text, ''), 16384)) END"
)
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
        DELETE FROM {s}.branch_items WHERE session_id = p_session_id;{extra}
        DELETE FROM {s}.events WHERE session_id = p_session_id;
        DELETE FROM {s}.sessions WHERE session_id = p_session_id;
        PERFORM set_config('contextledger.purging', '', true);
        RETURN n;
    END $$;
"""


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE {S}.event_search (
            session_id text NOT NULL,
            seq bigint NOT NULL,
            tenant_id text NOT NULL DEFAULT {CURRENT},
            search tsvector NOT NULL,
            CONSTRAINT event_search_pkey PRIMARY KEY (session_id, seq, tenant_id)
        )""")
    op.execute(
        f"INSERT INTO {S}.event_search (session_id, seq, tenant_id, search)"
        f" SELECT session_id, seq, tenant_id, search FROM {S}.events"
        " WHERE type = 'message.appended' AND search IS NOT NULL"
    )
    op.execute(f"DROP INDEX IF EXISTS {S}.events_search")
    op.execute(f"ALTER TABLE {S}.events DROP COLUMN search")
    op.execute(
        f"CREATE INDEX event_search_search ON {S}.event_search USING gin (search)"
        " WITH (gin_pending_list_limit = 64)"
    )
    op.execute(f"GRANT SELECT, INSERT, DELETE ON {S}.event_search TO {ROLE}")
    op.execute(f"ALTER TABLE {S}.event_search ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_isolation ON {S}.event_search"
        f" USING (tenant_id = {CURRENT}) WITH CHECK (tenant_id = {CURRENT})"
    )
    op.execute(
        _PURGE.format(
            s=S,
            extra=f"\n        DELETE FROM {S}.event_search WHERE session_id = p_session_id;",
        )
    )


def downgrade() -> None:
    op.execute(_PURGE.format(s=S, extra=""))
    op.execute(f"DROP TABLE {S}.event_search")
    op.execute(
        f"ALTER TABLE {S}.events ADD COLUMN search tsvector"
        f" GENERATED ALWAYS AS (CASE WHEN type IN ('message.appended', 'messages.replaced',"
        f" 'summary.recorded') THEN {SEARCH_VECTOR} END) STORED"
    )
    op.execute(
        f"CREATE INDEX events_search ON {S}.events USING gin (search)"
        " WITH (gin_pending_list_limit = 64)"
    )
