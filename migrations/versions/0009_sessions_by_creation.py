"""Sessions listed a page at a time: an index in listing order, per tenant.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26

``GET /v1/sessions`` read every session of the tenant and paged in Python. It now asks
for the rows after the last one shown (``(created_at, session_id) > ($1, $2) ORDER BY
created_at, session_id LIMIT n``); under row-level security the tenant is an equality,
so this index makes a page O(page), whatever the tenant holds.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS sessions_by_creation"
        " ON contextledger.sessions (tenant_id, created_at, session_id)"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS contextledger.sessions_by_creation")
