"""The ledger: sessions, append-only events, and the inline projection's rows.

Revision ID: 0001_ledger
Revises:
Create Date: 2026-11-21

Every key starts with session_id so the schema can later be distributed by
session. ``events`` rejects UPDATE, DELETE and TRUNCATE in the database itself;
the one way to remove a session is ``contextledger.purge_session(id, reason)``,
which leaves a row in ``purges`` saying who removed what, when and why.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0001_ledger"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("session_id", sa.Text, primary_key=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("model", sa.Text),
        sa.Column("config", pg.JSONB, nullable=False, server_default="{}"),
        sa.Column("metadata", pg.JSONB, nullable=False, server_default="{}"),
        sa.Column("head", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("last_hash", sa.Text, nullable=False),
        sa.Column("view_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("view_count", sa.Integer, nullable=False, server_default="0"),
        schema=S,
    )
    op.create_table(
        "events",
        sa.Column("session_id", sa.Text, sa.ForeignKey(f"{S}.sessions.session_id"), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("position", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("version", sa.SmallInteger, nullable=False),
        sa.Column("data", pg.JSONB, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("hash", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("session_id", "seq", name="events_pkey"),
        sa.CheckConstraint("seq >= 1", name="events_seq_positive"),
        schema=S,
    )
    op.create_index(
        "events_idempotency",
        "events",
        ["session_id", "idempotency_key"],
        unique=True,
        schema=S,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_index("events_position", "events", ["position"], unique=True, schema=S)
    op.create_index(
        "events_checkpoints",
        "events",
        ["session_id", "seq"],
        schema=S,
        postgresql_where=sa.text("type = 'checkpoint.created'"),
    )
    # The inline projection: the working view (messages as the model sees them) ...
    op.create_table(
        "view_items",
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("ord", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("message", pg.JSONB, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("critical", sa.Boolean, nullable=False, server_default="false"),
        sa.PrimaryKeyConstraint("session_id", "ord", name="view_items_pkey"),
        schema=S,
    )
    # ... and the current branch (references into events; get_messages joins them).
    op.create_table(
        "branch_items",
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("ord", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("session_id", "ord", name="branch_items_pkey"),
        schema=S,
    )
    op.create_table(
        "purges",
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column(
            "purged_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("purged_by", sa.Text, nullable=False, server_default=sa.text("current_user")),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("events", sa.BigInteger, nullable=False),
        sa.Column("last_hash", sa.Text),
        sa.PrimaryKeyConstraint("session_id", "purged_at", name="purges_pkey"),
        schema=S,
    )
    op.execute(f"""
        CREATE FUNCTION {S}.events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE'
               AND current_setting('contextledger.purging', true) = OLD.session_id THEN
                RETURN OLD;
            END IF;
            RAISE EXCEPTION 'contextledger.events is append-only: % rejected', TG_OP
                USING ERRCODE = 'P0001', HINT = 'use contextledger.purge_session(id, reason)';
        END $$;
    """)
    op.execute(f"""
        CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON {S}.events
        FOR EACH ROW EXECUTE FUNCTION {S}.events_append_only();
    """)
    op.execute(f"""
        CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON {S}.events
        FOR EACH STATEMENT EXECUTE FUNCTION {S}.events_append_only();
    """)
    op.execute(f"""
        CREATE FUNCTION {S}.purge_session(p_session_id text, p_reason text)
        RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE n bigint; h text;
        BEGIN
            IF coalesce(btrim(p_reason), '') = '' THEN
                RAISE EXCEPTION 'a purge needs a reason';
            END IF;
            SELECT head, last_hash INTO n, h FROM {S}.sessions
                WHERE session_id = p_session_id FOR UPDATE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'no session %', p_session_id;
            END IF;
            INSERT INTO {S}.purges (session_id, reason, events, last_hash)
                VALUES (p_session_id, p_reason, n, h);
            PERFORM set_config('contextledger.purging', p_session_id, true);
            DELETE FROM {S}.view_items WHERE session_id = p_session_id;
            DELETE FROM {S}.branch_items WHERE session_id = p_session_id;
            DELETE FROM {S}.events WHERE session_id = p_session_id;
            DELETE FROM {S}.sessions WHERE session_id = p_session_id;
            PERFORM set_config('contextledger.purging', '', true);
            RETURN n;
        END $$;
    """)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {S}.purge_session(text, text)")
    op.drop_table("purges", schema=S)
    op.drop_table("branch_items", schema=S)
    op.drop_table("view_items", schema=S)
    op.execute(f"DROP TRIGGER IF EXISTS events_no_truncate ON {S}.events")
    op.execute(f"DROP TRIGGER IF EXISTS events_append_only ON {S}.events")
    op.drop_table("events", schema=S)
    op.execute(f"DROP FUNCTION IF EXISTS {S}.events_append_only()")
    op.drop_table("sessions", schema=S)
