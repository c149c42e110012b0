"""View rows carry a generation and a tail watermark: O(view) reads, two-row appends.

Revision ID: 0002_view_generations
Revises: 0001_ledger
Create Date: 2026-11-21

A summary or compaction replaces most of a view at once. Deleting those rows in
place leaves dead index entries in the very key range the next read scans, so
view reads grew with history until a VACUUM (measured: 12.8x slower at 100,000
events). Now a view-rewriting event writes the surviving view under the next
generation and the read scans ``(session_id, gen, ord)`` of the current one only.

Appends no longer write view or branch rows at all: every ``message.appended``
event after the session's ``view_base`` (``branch_base``) seq is implicitly the
tail of the view (branch), read straight from ``events`` by primary key. Only an
event that rewrites the view materializes rows and moves the watermark, so a
plain append is one event row plus the session head (bench/ledger.py).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_view_generations"
down_revision: str | None = "0001_ledger"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"


def upgrade() -> None:
    op.add_column(
        "sessions",
        sa.Column("view_gen", sa.BigInteger, nullable=False, server_default="0"),
        schema=S,
    )
    op.add_column(
        "sessions",
        sa.Column("view_base", sa.BigInteger, nullable=False, server_default="0"),
        schema=S,
    )
    op.add_column(
        "sessions",
        sa.Column("branch_base", sa.BigInteger, nullable=False, server_default="0"),
        schema=S,
    )
    op.add_column(
        "view_items", sa.Column("gen", sa.BigInteger, nullable=False, server_default="0"), schema=S
    )
    # Rows written by 0001 stay valid: base 0 with existing rows would double-count
    # the messages, so existing sessions start with their whole history materialized.
    op.execute(f"UPDATE {S}.sessions SET view_base = head, branch_base = head")
    op.execute(f"ALTER TABLE {S}.view_items DROP CONSTRAINT view_items_pkey")
    op.execute(
        f"ALTER TABLE {S}.view_items ADD CONSTRAINT view_items_pkey"
        " PRIMARY KEY (session_id, gen, ord)"
    )
    # Old generations are deleted as soon as they are replaced; vacuum them promptly.
    op.execute(
        f"ALTER TABLE {S}.view_items SET (autovacuum_vacuum_scale_factor = 0.02,"
        " autovacuum_analyze_scale_factor = 0.02)"
    )


def downgrade() -> None:
    # Materialize the implicit tails, as 0001 expects every view and branch row stored.
    op.execute(f"""
        INSERT INTO {S}.view_items (session_id, gen, ord, seq, part, kind, message, tokens,
                                    critical)
        SELECT e.session_id, s.view_gen, e.seq * 1000000, e.seq, 0,
               CASE WHEN e.data ->> 'origin' = 'synthetic' THEN 'synthetic' ELSE 'message' END,
               e.data -> 'message', e.tokens, coalesce((e.data ->> 'critical')::boolean, false)
          FROM {S}.events e JOIN {S}.sessions s ON s.session_id = e.session_id
         WHERE e.seq > s.view_base AND e.type = 'message.appended'""")
    op.execute(f"""
        INSERT INTO {S}.branch_items (session_id, ord, seq, part)
        SELECT e.session_id, e.seq * 1000000, e.seq, 0
          FROM {S}.events e JOIN {S}.sessions s ON s.session_id = e.session_id
         WHERE e.seq > s.branch_base AND e.type = 'message.appended'""")
    op.execute(
        f"ALTER TABLE {S}.view_items RESET (autovacuum_vacuum_scale_factor,"
        " autovacuum_analyze_scale_factor)"
    )
    op.execute(
        f"DELETE FROM {S}.view_items v USING {S}.sessions s"
        " WHERE v.session_id = s.session_id AND v.gen <> s.view_gen"
    )
    op.execute(f"ALTER TABLE {S}.view_items DROP CONSTRAINT view_items_pkey")
    op.execute(
        f"ALTER TABLE {S}.view_items ADD CONSTRAINT view_items_pkey PRIMARY KEY (session_id, ord)"
    )
    op.drop_column("view_items", "gen", schema=S)
    op.drop_column("sessions", "branch_base", schema=S)
    op.drop_column("sessions", "view_base", schema=S)
    op.drop_column("sessions", "view_gen", schema=S)
