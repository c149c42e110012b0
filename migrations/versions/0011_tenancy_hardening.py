"""Tenancy that cannot be off: FORCE row-level security, an unset tenant fails closed,
least privilege for the service role.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27

- ``FORCE ROW LEVEL SECURITY`` on every table with a tenant policy: a service role that
  owns the tables (an operator's shortcut) is held by the policies too. (Superusers and
  BYPASSRLS roles are not: the service refuses such a tenant connection, store/scoped.py.)
- ``current_tenant()`` with the setting unset or empty is ``'local'`` for the tables'
  owners (migrations, the CLI, embedded use: owner and superuser alike) and, while no
  API key exists (one tenant, the local one), for anyone. Once keys exist (tenants), it
  raises ``insufficient_privilege`` for any other role: a service connection that lost
  its tenant (a pooler that dropped the startup parameter, a bug) reads and writes
  nothing, not the local tenant's rows. Both ``current_user`` and ``session_user`` must
  own: a SECURITY DEFINER function runs as the owner, its caller does not.
- The service role loses TRUNCATE (it ignores row-level security), TRIGGER and
  REFERENCES on every table, and UPDATE/DELETE on ``purges`` (the audit of erasures is
  insert-only for it; ``purge_session`` only inserts there).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
ROLE = "contextledger_service"


def _policy_tables() -> list[str]:
    rows = op.get_bind().execute(
        sa.text("SELECT DISTINCT tablename FROM pg_policies WHERE schemaname = :s ORDER BY 1"),
        {"s": S},
    )
    return [r[0] for r in rows]


def _tables() -> list[str]:
    rows = op.get_bind().execute(
        sa.text("SELECT tablename FROM pg_tables WHERE schemaname = :s ORDER BY 1"), {"s": S}
    )
    return [r[0] for r in rows]


def upgrade() -> None:
    op.execute(f"""
        CREATE FUNCTION {S}.unset_tenant(p_current name, p_session name) RETURNS text
        LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp AS $$
        DECLARE owner oid := (SELECT nspowner FROM pg_namespace WHERE nspname = '{S}');
        BEGIN
            IF pg_has_role(p_current, owner, 'MEMBER')
               AND pg_has_role(p_session, owner, 'MEMBER') THEN
                RETURN 'local';
            END IF;
            IF NOT EXISTS (SELECT 1 FROM {S}.api_keys) THEN
                RETURN 'local';  -- no key yet: one tenant, the local one
            END IF;
            RAISE EXCEPTION 'contextledger.tenant is not set for this transaction'
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'tenant connections set it in every transaction';
        END $$
    """)
    op.execute(f"""
        CREATE OR REPLACE FUNCTION {S}.current_tenant() RETURNS text
        LANGUAGE sql STABLE PARALLEL SAFE AS
        $$ SELECT coalesce(nullif(current_setting('contextledger.tenant', true), ''),
                           {S}.unset_tenant(current_user, session_user)) $$
    """)
    for table in _policy_tables():
        op.execute(f"ALTER TABLE {S}.{table} FORCE ROW LEVEL SECURITY")
    for table in _tables():
        op.execute(f"REVOKE TRUNCATE, TRIGGER, REFERENCES ON {S}.{table} FROM {ROLE}")
    op.execute(f"REVOKE UPDATE, DELETE ON {S}.purges FROM {ROLE}")


def downgrade() -> None:
    op.execute(f"GRANT DELETE ON {S}.purges TO {ROLE}")
    for table in _policy_tables():  # 0004 granted ALL on these
        if table not in ("events", "purges", "event_search", "event_terms"):
            op.execute(f"GRANT TRUNCATE, TRIGGER, REFERENCES ON {S}.{table} TO {ROLE}")
    for table in _policy_tables():
        op.execute(f"ALTER TABLE {S}.{table} NO FORCE ROW LEVEL SECURITY")
    op.execute(f"""
        CREATE OR REPLACE FUNCTION {S}.current_tenant() RETURNS text
        LANGUAGE sql STABLE PARALLEL SAFE AS
        $$ SELECT coalesce(nullif(current_setting('contextledger.tenant', true), ''), 'local') $$
    """)
    op.execute(f"DROP FUNCTION {S}.unset_tenant(name, name)")
