"""Forks: a session may stand on another's chain (copy-on-write, nothing copied).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27

A fork's row names its parent and the parent's seq it stands on; its seqs up to that
one are the parent's events, read from the parent by the parent's id (a statement
never joins two sessions, so the schema stays distributable by ``session_id``). The
index lists a session's direct forks cheaply: a purge of a parent with forks is
refused, and erasure follows a parent to its forks.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"


def upgrade() -> None:
    op.execute(
        f"ALTER TABLE {S}.sessions ADD COLUMN IF NOT EXISTS parent_session_id text,"
        " ADD COLUMN IF NOT EXISTS parent_seq bigint"
    )
    op.execute(
        f"ALTER TABLE {S}.sessions ADD CONSTRAINT sessions_fork_point CHECK ("
        "(parent_session_id IS NULL) = (parent_seq IS NULL) AND coalesce(parent_seq, 1) >= 1)"
    )
    op.execute(
        f"CREATE INDEX IF NOT EXISTS sessions_forks ON {S}.sessions"
        " (tenant_id, parent_session_id) WHERE parent_session_id IS NOT NULL"
    )


def downgrade() -> None:
    # A fork's events start after its fork point: without the parent columns its chain
    # would no longer verify. Refused while any fork stands (purge the forks first).
    op.execute(f"""
        DO $$ BEGIN
            IF EXISTS (SELECT 1 FROM {S}.sessions WHERE parent_session_id IS NOT NULL) THEN
                RAISE EXCEPTION 'contextledger: forks exist; purge them before downgrading'
                    USING ERRCODE = 'P0001';
            END IF;
        END $$""")
    op.execute(f"DROP INDEX IF EXISTS {S}.sessions_forks")
    op.execute(f"ALTER TABLE {S}.sessions DROP CONSTRAINT IF EXISTS sessions_fork_point")
    op.execute(
        f"ALTER TABLE {S}.sessions DROP COLUMN IF EXISTS parent_seq,"
        " DROP COLUMN IF EXISTS parent_session_id"
    )
