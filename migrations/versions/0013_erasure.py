"""Erase by destroying keys: per-session data keys, the erasure audit, ``erase_session``.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27

- ``session_keys``: one wrapped data key per sealed session (``store/sealing.py``): the
  KEK's fingerprint and the DEK wrapped under it. Erasing sets ``wrapped_dek`` to NULL
  and ``destroyed_at``; a rotation re-wraps it (``rotated_at``). A session table (keyed
  by ``session_id``, tenant policy, FORCE row-level security).
- ``erasures``: the audit of erasures (who, on whose behalf, when, why, how many events,
  the last hash, the derived rows removed): insert-only for the service role, as
  ``purges`` is.
- ``sessions.erased_at``: set by an erasure; appends require it NULL, reads refuse.
- ``erase_session(id, reason, actor)``: one transaction that destroys the key, deletes
  every derived plaintext copy (view rows, branch rows, search postings, embeddings)
  and writes the audit row. Every statement names one session (Citus-ready).
- ``purge_session`` also removes the session's key row (a purged session's key has
  nothing left to open); an erased session can still be purged.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
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
        DELETE FROM {s}.event_terms WHERE session_id = p_session_id;{extra}
        DELETE FROM {s}.events WHERE session_id = p_session_id;
        DELETE FROM {s}.sessions WHERE session_id = p_session_id;
        PERFORM set_config('contextledger.purging', '', true);
        RETURN n;
    END $$;
"""

#: SQLSTATEs the store translates (class "CL": contextledger's own).
ERASED = "CL001"
NOT_SEALED = "CL002"

_ERASE = f"""
    CREATE FUNCTION {S}.erase_session(p_session_id text, p_reason text, p_actor text)
    RETURNS {S}.erasures LANGUAGE plpgsql AS $$
    DECLARE
        n bigint; h text; gone timestamptz; sealed boolean;
        v bigint; b bigint; t bigint; m bigint := 0;
        receipt {S}.erasures;
    BEGIN
        IF coalesce(btrim(p_reason), '') = '' THEN
            RAISE EXCEPTION 'an erasure needs a reason' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT head, last_hash, erased_at INTO n, h, gone FROM {S}.sessions
            WHERE session_id = p_session_id FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no session %', p_session_id USING ERRCODE = 'no_data_found';
        END IF;
        IF gone IS NOT NULL THEN
            RAISE EXCEPTION 'session % was erased', p_session_id USING ERRCODE = '{ERASED}';
        END IF;
        SELECT wrapped_dek IS NOT NULL INTO sealed FROM {S}.session_keys
            WHERE session_id = p_session_id FOR UPDATE;
        IF NOT FOUND OR NOT sealed THEN
            RAISE EXCEPTION 'session % was written without a data key', p_session_id
                USING ERRCODE = '{NOT_SEALED}', HINT = 'use contextledger.purge_session';
        END IF;
        UPDATE {S}.session_keys SET wrapped_dek = NULL, destroyed_at = now()
            WHERE session_id = p_session_id;
        UPDATE {S}.sessions SET erased_at = now() WHERE session_id = p_session_id;
        DELETE FROM {S}.view_items WHERE session_id = p_session_id;
        GET DIAGNOSTICS v = ROW_COUNT;
        DELETE FROM {S}.branch_items WHERE session_id = p_session_id;
        GET DIAGNOSTICS b = ROW_COUNT;
        DELETE FROM {S}.event_terms WHERE session_id = p_session_id;
        GET DIAGNOSTICS t = ROW_COUNT;
        IF to_regclass('{S}.event_embeddings') IS NOT NULL THEN
            EXECUTE 'DELETE FROM {S}.event_embeddings WHERE session_id = $1' USING p_session_id;
            GET DIAGNOSTICS m = ROW_COUNT;
        END IF;
        INSERT INTO {S}.erasures (session_id, actor, reason, events, last_hash, removed)
            VALUES (p_session_id, p_actor, p_reason, n, h,
                    jsonb_build_object('view', v, 'branch', b, 'postings', t, 'embeddings', m))
            RETURNING * INTO receipt;
        RETURN receipt;
    END $$;
"""


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE {S}.session_keys (
            session_id text NOT NULL,
            tenant_id text NOT NULL DEFAULT {CURRENT},
            kek_id text NOT NULL,
            wrapped_dek bytea,
            created_at timestamptz NOT NULL DEFAULT now(),
            rotated_at timestamptz,
            destroyed_at timestamptz,
            CONSTRAINT session_keys_pkey PRIMARY KEY (session_id, tenant_id),
            CONSTRAINT session_keys_destroyed
                CHECK ((wrapped_dek IS NULL) = (destroyed_at IS NOT NULL))
        )""")
    op.execute(f"""
        CREATE TABLE {S}.erasures (
            session_id text NOT NULL,
            tenant_id text NOT NULL DEFAULT {CURRENT},
            erased_at timestamptz NOT NULL DEFAULT now(),
            erased_by text NOT NULL DEFAULT current_user,
            actor text,
            reason text NOT NULL,
            events bigint NOT NULL,
            last_hash text NOT NULL,
            removed jsonb NOT NULL,
            CONSTRAINT erasures_pkey PRIMARY KEY (session_id, tenant_id)
        )""")
    op.execute(f"ALTER TABLE {S}.sessions ADD COLUMN erased_at timestamptz")
    # the key table is the only one rewritten in place (erase, rotate); DELETE for purge
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {S}.session_keys TO {ROLE}")
    op.execute(f"GRANT SELECT, INSERT ON {S}.erasures TO {ROLE}")
    for table in ("session_keys", "erasures"):
        op.execute(f"ALTER TABLE {S}.{table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {S}.{table} FORCE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {S}.{table}"
            f" USING (tenant_id = {CURRENT}) WITH CHECK (tenant_id = {CURRENT})"
        )
    op.execute(_ERASE)
    op.execute(f"REVOKE ALL ON FUNCTION {S}.erase_session(text, text, text) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {S}.erase_session(text, text, text) TO {ROLE}")
    op.execute(
        _PURGE.format(
            s=S, extra=f"\n        DELETE FROM {S}.session_keys WHERE session_id = p_session_id;"
        )
    )


def downgrade() -> None:
    # without the key table every sealed session would be unreadable: refuse, not shred
    # (every tenant's rows: the owner is not held by the policy once FORCE is off)
    op.execute(f"ALTER TABLE {S}.session_keys NO FORCE ROW LEVEL SECURITY")
    op.execute(f"""
        DO $$ BEGIN
            IF EXISTS (SELECT 1 FROM {S}.session_keys WHERE wrapped_dek IS NOT NULL) THEN
                RAISE EXCEPTION 'sealed sessions exist: downgrading would destroy their keys'
                    USING HINT = 'erase or purge them first';
            END IF;
        END $$
    """)
    op.execute(_PURGE.format(s=S, extra=""))
    op.execute(f"DROP FUNCTION {S}.erase_session(text, text, text)")
    op.execute(f"ALTER TABLE {S}.sessions DROP COLUMN erased_at")
    op.execute(f"DROP TABLE {S}.erasures")
    op.execute(f"DROP TABLE {S}.session_keys")
