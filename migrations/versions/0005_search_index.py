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

A small pending list (64 kB, not the default 4 MB): with GIN's default, every append
lands in an unsorted list that each search scans whole and the planner costs as such, so
until autovacuum cleaned it up searches again read every event (bench at 3,000 turns:
11.5 ms a search). Measured A/B on sequential appends, same run: 64 kB pending list
0.96x the append without the index, ``fastupdate = off`` 1.09-1.14x, the default 0.97-0.99x;
searches at 3,000 turns ~1.8 ms with either of the first two.
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
        f"CREATE INDEX events_search ON {S}.events USING gin (search)"
        " WITH (gin_pending_list_limit = 64)"
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
