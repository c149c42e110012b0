"""The batched message append as a function whose plan the server keeps.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27

Behind PgBouncer in transaction mode the store has no prepared statements, so the batch
append (``APPEND_MESSAGES`` in ``store/postgres/statements.py``: the appends to several
sessions that arrived while another was in flight, in one statement) was parsed and
planned at every run: ~0.7 ms of the server's CPU for a statement that then ran in
~0.15 ms. ``append_messages`` is that statement in a function; its plan is generic
(``plan_cache_mode``, set for the call only), made once per server session and kept
there, whichever client the pooler lends the session to. Same arguments, same rows back:
each session appended to and its new ``view_tokens`` (none for a row whose head check
failed).

On Citus the store never batches across sessions (each append is its own single-shard
statement), so the function is only created there, never called.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
ROLE = "contextledger_service"
SIGNATURE = (
    "append_messages(text[], bigint[], smallint[], text[], integer[], timestamptz[],"
    " text[], text[], text[])"
)


def upgrade() -> None:
    op.execute(f"""
    CREATE FUNCTION {S}.append_messages(
        p_sessions text[], p_seqs bigint[], p_versions smallint[], p_datas text[],
        p_tokens integer[], p_created timestamptz[], p_keys text[], p_hashes text[],
        p_prevs text[])
    RETURNS TABLE (session_id text, view_tokens bigint) LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan AS $$
    #variable_conflict use_column
    BEGIN
        RETURN QUERY
        WITH i AS (
            SELECT * FROM unnest(p_sessions, p_seqs, p_versions, p_datas, p_tokens,
                                 p_created, p_keys, p_hashes, p_prevs)
                AS t(session_id, seq, version, data, tokens, created_at, idempotency_key,
                     hash, prev)
        ), l AS (  -- row locks in one global order: batches of two processes cannot deadlock
            SELECT x.session_id FROM {S}.sessions x
             WHERE x.session_id IN (SELECT i.session_id FROM i)
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
            SELECT i.session_id, i.seq, 'message.appended', i.version, i.data::jsonb,
                   i.tokens, i.created_at, i.idempotency_key, i.hash
              FROM i JOIN s ON s.session_id = i.session_id AND s.head = i.seq
        )
        SELECT s.session_id, s.view_tokens FROM s;
    END $$""")
    op.execute(f"GRANT EXECUTE ON FUNCTION {S}.{SIGNATURE} TO {ROLE}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {S}.{SIGNATURE}")
