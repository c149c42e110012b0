"""Tenants: every row carries one, row-level security keeps them apart, API keys.

Revision ID: 0004
Revises: 0002_view_generations (becomes "0003" once the recall migration lands)
Create Date: 2026-11-23

Every table gets ``tenant_id``, defaulting to the connection's
``contextledger.tenant`` setting (``'local'`` when unset), so the hot-path INSERTs
stay as they are. ``tenant_id`` is appended to every key: a session id is unique
per tenant, and one tenant creating ``"s1"`` cannot even detect another's
``"s1"``. It goes last, not first, so the library's own queries (``WHERE
session_id = $1 AND seq > $2``) stay bounded index scans on PostgreSQL 15 too,
with or without the tenant condition RLS adds.

Row-level security: each table's policy admits only rows of
``contextledger.current_tenant()``. Owners and superusers bypass it (they
administer: migrations, the CLI, embedded use); the service connects as
``contextledger_service`` (created here: NOSUPERUSER, NOBYPASSRLS, NOLOGIN —
the service logs in as the DSN's user and switches to it; ``ALTER ROLE ... LOGIN
PASSWORD`` to log in as it directly). FORCE is not needed: that role never owns
a table. ``api_keys`` holds scrypt hashes only; the service role may read it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
ROLE = "contextledger_service"
CURRENT = f"{S}.current_tenant()"
_SKIP = ("alembic_version", "api_keys")


def _tables() -> list[str]:
    rows = op.get_bind().execute(
        sa.text(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = :s AND table_type = 'BASE TABLE' ORDER BY table_name"
        ),
        {"s": S},
    )
    return [r[0] for r in rows if r[0] not in _SKIP]


def _constraints(kind: str) -> list[tuple[str, str, str]]:
    """(table, name, definition) of the schema's constraints of one kind (p, f, u)."""
    rows = op.get_bind().execute(
        sa.text(
            "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)"
            " FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE n.nspname = :s AND c.contype::text = :k ORDER BY 1, 2"
        ),
        {"s": S, "k": kind},
    )
    return [(r[0], r[1], r[2]) for r in rows if r[0].split(".")[-1] not in _SKIP]


def _unique_indexes() -> list[tuple[str, str]]:
    """(name, definition) of unique indexes that are not constraints and name session_id."""
    rows = op.get_bind().execute(
        sa.text(
            "SELECT i.indexname, i.indexdef FROM pg_indexes i"
            " WHERE i.schemaname = :s AND i.indexdef LIKE 'CREATE UNIQUE%(session_id%'"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)"
        ),
        {"s": S},
    )
    return [(r[0], r[1]) for r in rows]


def _with_tenant(columns: str) -> str:
    """``(a, b)`` → ``(a, b, tenant_id)``."""
    return columns.replace(")", ", tenant_id)", 1)


def upgrade() -> None:
    op.execute(f"""
        CREATE FUNCTION {S}.current_tenant() RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS
        $$ SELECT coalesce(nullif(current_setting('contextledger.tenant', true), ''), 'local') $$
    """)
    tables = _tables()
    for table in tables:
        op.execute(
            f"ALTER TABLE {S}.{table} ADD COLUMN tenant_id text NOT NULL DEFAULT 'local'"
        )  # existing rows: the local tenant
        op.execute(f"ALTER TABLE {S}.{table} ALTER COLUMN tenant_id SET DEFAULT {CURRENT}")
    foreign = _constraints("f")
    for table, name, _ in foreign:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    for table, name, definition in _constraints("p") + _constraints("u"):
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {_with_tenant(definition)}")
    for name, definition in _unique_indexes():
        op.execute(f"DROP INDEX {S}.{name}")
        head, _, rest = definition.partition("(session_id")
        op.execute(f"{head}(session_id{_with_tenant(rest)}")
    for table, name, definition in foreign:
        local, _, target = definition.partition(" REFERENCES ")
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {name} "
            f"{_with_tenant(local)} REFERENCES {_with_tenant(target)}"
        )
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False, server_default=""),
        sa.Column("salt", sa.LargeBinary, nullable=False),
        sa.Column("hash", sa.LargeBinary, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
        schema=S,
    )
    op.execute(f"""
        DO $$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
                CREATE ROLE {ROLE} NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
            END IF;
        END $$
    """)
    op.execute(f"GRANT USAGE ON SCHEMA {S} TO {ROLE}")
    op.execute(f"GRANT SELECT ON {S}.alembic_version, {S}.api_keys TO {ROLE}")
    op.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {S} TO {ROLE}")
    op.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {S} TO {ROLE}")
    for table in tables:
        # events: no UPDATE; DELETE only gets past the append-only trigger in a purge.
        verbs = "SELECT, INSERT, DELETE" if table in ("events", "purges") else "ALL"
        op.execute(f"GRANT {verbs} ON {S}.{table} TO {ROLE}")
        op.execute(f"ALTER TABLE {S}.{table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {S}.{table}"
            f" USING (tenant_id = {CURRENT}) WITH CHECK (tenant_id = {CURRENT})"
        )


def downgrade() -> None:
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {S} FROM {ROLE}")
    op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {S} FROM {ROLE}")
    op.execute(f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {S} FROM {ROLE}")
    op.execute(f"REVOKE ALL ON SCHEMA {S} FROM {ROLE}")
    op.drop_table("api_keys", schema=S)
    tables = _tables()
    for table in tables:
        op.execute(f"DROP POLICY IF EXISTS tenant_isolation ON {S}.{table}")
        op.execute(f"ALTER TABLE {S}.{table} DISABLE ROW LEVEL SECURITY")
    foreign = _constraints("f")
    for table, name, _ in foreign:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    for table, name, definition in _constraints("p") + _constraints("u"):
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {_without(definition)}")
    for name, definition in _unique_indexes():
        op.execute(f"DROP INDEX {S}.{name}")
        op.execute(_without(definition))
    for table, name, definition in foreign:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {_without(definition)}")
    for table in tables:
        op.execute(f"ALTER TABLE {S}.{table} DROP COLUMN tenant_id")
    op.execute(f"DROP FUNCTION {S}.current_tenant()")


def _without(definition: str) -> str:
    return definition.replace(", tenant_id)", ")")
