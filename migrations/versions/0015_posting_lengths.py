"""Recall's postings carry a message's length in tokens, as BM25 has it.

Revision ID: 0015
Revises: 0013
Create Date: 2026-11-27

0010 stored each posting's ``dl`` as the message's number of distinct lexemes. A message
that repeats itself (a status line five times, a log) then had every word's ``tf`` at 5
and the length of one sentence, and outranked the one message that said the thing once:
on bench/recall.py's needles PostgreSQL found 49 of 60 where ``memory://`` found 60. Now
``dl`` is the sum of the message's lexeme counts (the library's ``POSTINGS`` writes new
rows so); the rows already written are set the same way here, from their own ``tf``s.

Row-level security is FORCEd on the table (0011), so even its owner sees one tenant's
rows: the update runs with FORCE lifted inside this migration's transaction.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"


def _set_lengths(length: str) -> None:
    op.execute(f"ALTER TABLE {S}.event_terms NO FORCE ROW LEVEL SECURITY")
    op.execute(
        f"""
        UPDATE {S}.event_terms t SET dl = m.dl
          FROM (SELECT session_id, seq, tenant_id, {length} AS dl
                  FROM {S}.event_terms GROUP BY session_id, seq, tenant_id) m
         WHERE t.session_id = m.session_id AND t.seq = m.seq AND t.tenant_id = m.tenant_id
           AND t.dl IS DISTINCT FROM m.dl"""
    )
    op.execute(f"ALTER TABLE {S}.event_terms FORCE ROW LEVEL SECURITY")


def upgrade() -> None:
    _set_lengths("least(sum(tf), 32767)::smallint")


def downgrade() -> None:
    # the distinct lexemes, less the empty lexeme's row that marks each indexed message
    _set_lengths("least(count(*) - 1, 32767)::smallint")
