"""Hybrid recall's embeddings belong to a tenant, and go with a purged session.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28

``event_embeddings`` is made by the store the first time the hybrid engine finds pgvector
(``store/postgres/vectors.py``: a server may get the extension after it was migrated). It
was keyed by session id alone, with no tenant and no row-level security, while session
ids are a tenant's own (0004): two tenants' sessions of one id shared embeddings (the
second's messages were never embedded, its searches ranked by the first's vectors), a
service role was never granted the table, ``erase_session`` failed on it (0016 had
scoped its DELETE by a ``tenant_id`` the table did not have: erasure refused outright
wherever the table existed), and ``purge_session`` left a purged session's vectors behind
(derived from its text, and taken as the embeddings of a session made again under the id).

Where the table exists it gets the tenant of the session each row is of (rows of an id
two tenants hold, and of sessions purged, are dropped: embeddings are derived, a request
makes them again), the tenant in its key, the policy every table has, and the service
role's grant (no TRUNCATE, which row-level security does not hold, as 0011);
``purge_session`` deletes the session's embeddings as ``erase_session`` does.
The store makes the table this way from now on (``EMBEDDINGS_DDL``).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
ROLE = "contextledger_service"
CURRENT = f"{S}.current_tenant()"
TABLE = f"{S}.event_embeddings"
#: What the purge deletes, right after the postings (as 0016 left that line) and before
#: the events: the same statement ``erase_session`` runs (0013, scoped by 0016).
POSTINGS = (
    f"DELETE FROM {S}.event_terms WHERE session_id = p_session_id"
    f" AND tenant_id = (SELECT {S}.current_tenant());"
)
EMBEDDINGS = f"""
        IF to_regclass('{TABLE}') IS NOT NULL THEN
            EXECUTE 'DELETE FROM {TABLE} WHERE session_id = $1 AND tenant_id = (SELECT {CURRENT})'
                USING p_session_id;
        END IF;"""

_UPGRADE_TABLE = f"""
DO $$ BEGIN
    IF to_regclass('{TABLE}') IS NULL OR EXISTS (
        SELECT 1 FROM information_schema.columns
         WHERE table_schema = '{S}' AND table_name = 'event_embeddings'
           AND column_name = 'tenant_id') THEN
        RETURN;
    END IF;
    ALTER TABLE {TABLE} ADD COLUMN tenant_id text;
    -- every tenant's sessions and events, read by an owner that is not a superuser too
    -- (as 0015)
    ALTER TABLE {S}.sessions NO FORCE ROW LEVEL SECURITY;
    ALTER TABLE {S}.events NO FORCE ROW LEVEL SECURITY;
    DELETE FROM {TABLE} x WHERE x.session_id IN (
        SELECT session_id FROM {S}.sessions GROUP BY session_id HAVING count(*) > 1);
    UPDATE {TABLE} x SET tenant_id = s.tenant_id
      FROM {S}.sessions s WHERE s.session_id = x.session_id;
    DELETE FROM {TABLE} WHERE tenant_id IS NULL;
    -- and rows at no message event of their session: left by a session purged and made
    -- again under its id while its messages were embedded (the search no longer joins
    -- the events that would have dropped them)
    DELETE FROM {TABLE} x WHERE NOT EXISTS (
        SELECT 1 FROM {S}.events e
         WHERE e.tenant_id = x.tenant_id AND e.session_id = x.session_id AND e.seq = x.seq
           AND e.type = 'message.appended');
    ALTER TABLE {S}.sessions FORCE ROW LEVEL SECURITY;
    ALTER TABLE {S}.events FORCE ROW LEVEL SECURITY;
    ALTER TABLE {TABLE} ALTER COLUMN tenant_id SET NOT NULL,
        ALTER COLUMN tenant_id SET DEFAULT {CURRENT};
    ALTER TABLE {TABLE} DROP CONSTRAINT event_embeddings_pkey;
    ALTER TABLE {TABLE} ADD PRIMARY KEY (tenant_id, session_id, model, seq);
    ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY;
    ALTER TABLE {TABLE} FORCE ROW LEVEL SECURITY;
    CREATE POLICY tenant_isolation ON {TABLE}
        USING (tenant_id = {CURRENT}) WITH CHECK (tenant_id = {CURRENT});
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO {ROLE};
    END IF;
END $$"""

_DOWNGRADE_TABLE = f"""
DO $$ BEGIN
    IF to_regclass('{TABLE}') IS NULL THEN
        RETURN;
    END IF;
    DROP POLICY IF EXISTS tenant_isolation ON {TABLE};
    ALTER TABLE {TABLE} NO FORCE ROW LEVEL SECURITY;
    ALTER TABLE {TABLE} DISABLE ROW LEVEL SECURITY;
    DELETE FROM {TABLE} x WHERE x.session_id IN (
        SELECT session_id FROM {TABLE} GROUP BY session_id HAVING count(DISTINCT tenant_id) > 1);
    ALTER TABLE {TABLE} DROP CONSTRAINT event_embeddings_pkey;
    ALTER TABLE {TABLE} ADD PRIMARY KEY (session_id, model, seq);
    ALTER TABLE {TABLE} DROP COLUMN tenant_id;
END $$"""


def _purge(forward: bool) -> None:
    bind = op.get_bind()
    body = bind.exec_driver_sql(
        f"SELECT pg_get_functiondef('{S}.purge_session(text, text)'::regprocedure)"
    ).scalar_one()
    old, new = POSTINGS, POSTINGS + EMBEDDINGS
    if (body.count(old) if forward else body.count(new)) != 1:
        raise RuntimeError(f"{S}.purge_session no longer deletes its postings as 0019 expects")
    op.execute(body.replace(old, new) if forward else body.replace(new, old))


def upgrade() -> None:
    op.execute(_UPGRADE_TABLE)
    _purge(forward=True)


def downgrade() -> None:
    _purge(forward=False)
    op.execute(_DOWNGRADE_TABLE)
