"""Recall's index finds a session's matches without a pass over the session.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23

0006's GIN index holds the lexemes of every session's messages. A search wants the
matches of a few rare lexemes in one session, so its plan ANDed the GIN bitmap with a
bitmap of the session's whole key range: 2.0-2.5 ms of a 4.8 ms search at 20,000 turns
(40,402 keys read to find one match), the part of a turn that grew with the history.

Here each event is indexed with one more lexeme naming its session (``session_lexeme``:
``'session <md5 of tenant/id>'``; the text parser never yields a lexeme with a space, so
it cannot meet a word of a message). The search asks for ``(its lexemes) & (the session's)``
in one GIN scan, which steps through the session's long posting list only to the rare
lexemes' items: O(matches), whatever the session's length (0.46 ms instead of 2.8 at
20,000 turns). The tag lives in the index expression, not in the stored vectors, so no
row is rewritten and ranking sees the vectors as before. 0006's index is dropped: every
search names its session. The tag names the tenant too: clients choose session ids
("main"), and a tag by id alone made a tenant's search step through every other tenant's
"main" (15 ms against 0.4 for a small session beside a large one of another tenant: a
timing signal across tenants). The functions are not STRICT, so PostgreSQL inlines them
(5.2 against 2.5 µs a row when the index is built or written).

Under row-level security (the service's role) no index served the match at all: ``@@``
is not leakproof, so PostgreSQL may not evaluate it inside an index before the policy's
tenant check, and the search read and filtered every vector of the session (18 ms at
20,000 turns, measured as ``contextledger_service``). ``session_matches`` runs the index
lookup as the tables' owner (SECURITY DEFINER, a fixed ``search_path``) and applies the
tenant check the policy would, ``tenant_id = current_tenant()``: the same rows, through the
index, for every role. EXECUTE is revoked from PUBLIC and granted to the service role;
another role (a custom SERVICE_ROLE, an application role with table grants) is refused
it, and the store then searches the table as before (RLS applying, without the index's
help) until that role is granted EXECUTE.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
ROLE = "contextledger_service"


def upgrade() -> None:
    op.execute(f"""
        CREATE FUNCTION {S}.session_lexeme(tenant_id text, session_id text) RETURNS tsvector
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $$ SELECT array_to_tsvector(ARRAY['session ' || md5(tenant_id || '/' || session_id)])
        $$""")
    op.execute(f"""
        CREATE FUNCTION {S}.session_query(tenant_id text, session_id text) RETURNS tsquery
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $$ SELECT quote_literal('session ' || md5(tenant_id || '/' || session_id))::tsquery
        $$""")
    # The fence (OFFSET 0) keeps the session condition out of the index scan: otherwise
    # the plan ANDs in a bitmap of the session's whole key range, the cost this removes.
    op.execute(f"""
        CREATE FUNCTION {S}.session_matches(p_session text, p_query tsquery)
        RETURNS TABLE (session_id text, seq bigint, search tsvector)
        LANGUAGE sql STABLE STRICT SECURITY DEFINER PARALLEL SAFE ROWS 100
        SET search_path = pg_catalog, pg_temp
        AS $$
            SELECT m.session_id, m.seq, m.search FROM (
                SELECT e.session_id, e.seq, e.tenant_id, e.search FROM {S}.event_search e
                 WHERE (e.search || {S}.session_lexeme(e.tenant_id, e.session_id))
                       @@ (p_query && {S}.session_query({S}.current_tenant(), p_session))
                OFFSET 0) m
             WHERE m.session_id = p_session AND m.tenant_id = {S}.current_tenant()
        $$""")
    op.execute(f"REVOKE ALL ON FUNCTION {S}.session_matches(text, tsquery) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {S}.session_matches(text, tsquery) TO {ROLE}")
    for fn in ("session_lexeme", "session_query"):  # where PUBLIC's default is revoked
        op.execute(f"GRANT EXECUTE ON FUNCTION {S}.{fn}(text, text) TO {ROLE}")
    op.execute(
        f"CREATE INDEX event_search_by_session ON {S}.event_search"
        f" USING gin ((search || {S}.session_lexeme(tenant_id, session_id)))"
        " WITH (gin_pending_list_limit = 64)"
    )
    op.execute(f"DROP INDEX {S}.event_search_search")


def downgrade() -> None:
    op.execute(
        f"CREATE INDEX event_search_search ON {S}.event_search USING gin (search)"
        " WITH (gin_pending_list_limit = 64)"
    )
    op.execute(f"DROP INDEX {S}.event_search_by_session")
    op.execute(f"DROP FUNCTION {S}.session_matches(text, tsquery)")
    op.execute(f"DROP FUNCTION {S}.session_query(text, text)")
    op.execute(f"DROP FUNCTION {S}.session_lexeme(text, text)")
