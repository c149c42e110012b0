"""Purge and erase act on the current tenant's session only.

Revision ID: 0016
Revises: 0014
Create Date: 2026-11-27

``purge_session`` and ``erase_session`` named their session by id alone. Under row-level
security (the service role, FORCEd since 0011) that is one tenant's session; but a role
the policies do not hold (a superuser, the tables' owner: an operator running
``contextledger purge ID`` with an administrator's DSN) purged or erased every tenant's
session of that id at once, audited as one tenant's. Each statement of both functions
now also names ``tenant_id = current_tenant()``: the tenant the transaction set
(``--tenant``), else ``local`` for the owner. Another tenant's session of the same id is
"no session" to them.

The live bodies are rewritten in place (whichever migration defined them last: 0013, or
0014's Citus variant of the purge), as 0014 does, so this stays right on both.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
#: A scalar subquery, not the bare call: ``current_tenant()`` is inlined as a COALESCE of
#: non-immutable calls, which Citus refuses in an UPDATE or DELETE (as a subquery it is
#: one InitPlan, on one server and in the shard's task alike).
TENANT = f" AND tenant_id = (SELECT {S}.current_tenant())"
#: (function, what names the session in its body, the same with the tenant)
REWRITES: tuple[tuple[str, str, str], ...] = tuple(
    (fn, old, old.replace(end, TENANT + end))
    for fn in ("purge_session(text, text)", "erase_session(text, text, text)")
    for old, end in (
        ("WHERE session_id = p_session_id;", ";"),
        ("WHERE session_id = p_session_id FOR UPDATE;", " FOR UPDATE;"),
        ("WHERE session_id = $1' USING p_session_id", "' USING"),
    )
)


def _rewrite(forward: bool) -> None:
    bind = op.get_bind()
    for fn in dict.fromkeys(fn for fn, _, _ in REWRITES):
        body = bind.exec_driver_sql(
            f"SELECT pg_get_functiondef('{S}.{fn}'::regprocedure)"
        ).scalar_one()
        for name, old, new in REWRITES:
            if name == fn:
                body = body.replace(old, new) if forward else body.replace(new, old)
        if forward and "WHERE session_id = p_session_id" + TENANT not in body:
            raise RuntimeError(f"{S}.{fn} no longer names its session as 0016 expects")
        op.execute(body)


def upgrade() -> None:
    _rewrite(forward=True)


def downgrade() -> None:
    _rewrite(forward=False)
