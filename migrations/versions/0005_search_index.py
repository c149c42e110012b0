"""Recall's full-text index on the search vector alone.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

0003 indexed ``(session_id, search)`` through ``btree_gin`` so a search would touch
one session's postings. PostgreSQL's planner never picks that index for
``session_id = $1 AND search @@ q``: it costs the scan of the ``session_id`` entry's
whole posting tree, so a search fell back to reading every event of the session
(2.7 ms at 6,000 events, growing with the history). A GIN index on ``search`` alone
is costed from the lexemes' statistics and used: 0.03 ms for the same query.

``fastupdate = off``: with GIN's pending list (the default), every append lands in an
unsorted list that each search scans whole and the planner costs as such, so until
autovacuum cleans it up searches again read every event (bench at 3,000 turns: search
11.5 ms with the pending list, 3.2 ms without; appends not measurably slower).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"


def upgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {S}.events_search")
    op.execute(
        f"CREATE INDEX events_search ON {S}.events USING gin (search) WITH (fastupdate = off)"
    )


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {S}.events_search")
    has_btree_gin = (
        op.get_bind()
        .exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'btree_gin'")
        .first()
    )
    columns = "session_id, search" if has_btree_gin else "search"
    op.execute(f"CREATE INDEX events_search ON {S}.events USING gin ({columns})")
