"""Full-text search over the ledger: a tsvector per event and a GIN index, for recall.

Revision ID: 0003
Revises: 0002_view_generations
Create Date: 2026-11-23

Recall (issue 11) searches the left-out part of a session's branch for what the
latest user turn needs. The searchable text of an event is every string and
number of its message (content, tool-call names and arguments, tool results) or
messages, kept in a STORED generated column, so the append statement does not
change and existing rows are backfilled by the table rewrite that adds the
column (the append-only triggers do not fire on a rewrite). The configuration is
``english`` (stemming and stop words; e-mails, hosts, paths and numbers stay
whole tokens); recall with another ``text_search_config`` computes the vector on
the fly instead. Where ``btree_gin`` is available the index leads with
``session_id``, so a search touches one session's postings only.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002_view_generations"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
#: Keep in step with contextledger.store.postgres. A message over 16 KiB (a big tool
#: output) is indexed by the first 16 KiB of its text only: the parser costs about
#: 0.6 us per byte on the test machine, and the append path must stay cheap.
SEARCH_VECTOR = (
    "CASE WHEN octet_length(data::text) <= 16384"
    " THEN jsonb_to_tsvector('english'::regconfig,"
    " coalesce(data -> 'message', data -> 'messages', '{}'::jsonb), '[\"string\", \"numeric\"]')"
    " ELSE to_tsvector('english'::regconfig, left(coalesce(data -> 'message' ->> 'content',"
    " (data -> 'messages')::text, ''), 16384)) END"
)


def upgrade() -> None:
    op.execute(
        f"ALTER TABLE {S}.events ADD COLUMN search tsvector"
        f" GENERATED ALWAYS AS (CASE WHEN type IN ('message.appended', 'messages.replaced',"
        f" 'summary.recorded') THEN {SEARCH_VECTOR} END) STORED"
    )
    bind = op.get_bind()
    has_btree_gin = bind.exec_driver_sql(
        "SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gin'"
    ).first()
    if has_btree_gin:
        op.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
        op.execute(f"CREATE INDEX events_search ON {S}.events USING gin (session_id, search)")
    else:
        op.execute(f"CREATE INDEX events_search ON {S}.events USING gin (search)")


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {S}.events_search")
    op.execute(f"ALTER TABLE {S}.events DROP COLUMN IF EXISTS search")
