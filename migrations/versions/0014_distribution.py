"""Distribution on Citus: every session table by ``session_id``, co-located; the rest as
reference tables. On plain PostgreSQL only the portable part runs.

Revision ID: 0014
Revises: 0011 (the integrator re-chains it after 0012/0013)
Create Date: 2026-11-27

Every statement of ours names one session, so with every session table distributed by
``session_id`` and co-located, each is a single-shard (router) query on Citus and an
append stays one round trip with no two-phase commit. What Citus needs, done on any
server so that the schema is the same everywhere (``tests/unit/store`` has no Citus;
``tests/integration/test_portability.py`` checks the rules on the migrated schema):

- the global unique index on ``events.position`` goes (a unique index must contain the
  distribution column; ``position`` is an identity, never used for order or lookup);
- the purge function marks its deletes with ``SET LOCAL contextledger.purging`` instead
  of ``set_config()``: the append-only trigger runs on the worker holding the shard, and
  Citus sends ``SET LOCAL`` to the workers (``citus.propagate_set_commands = local``),
  never a ``set_config()`` call.

Where the ``citus`` extension is installed in the database (``CREATE EXTENSION citus``
and ``citus_add_node`` done by the operator first, see docs/deploy/citus.md):

- the database's default ``citus.propagate_set_commands`` becomes ``local`` (the tenant
  of a transaction and the purge mark reach the workers; the store checks it at start);
- the schema's functions are propagated to the workers (the row-level security policy,
  the tenant default and the trigger call them there);
- ``session_tables()``, discovered (any table of the schema with a ``session_id``
  column, so 0012/0013's tables are included), are distributed by ``session_id``,
  co-located with ``sessions`` (its foreign-key target, distributed first);
- ``REFERENCE_TABLES`` (small, read everywhere) are copied to every node;
- the append-only trigger is kept (``citus.enable_unsafe_triggers`` while distributing:
  its body only reads its own row and a setting, both local to the shard).

``alembic_version`` stays a plain table on the coordinator (only it reads it).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "contextledger"
#: The distribution column of every session table, and what co-locates them.
DISTRIBUTION_COLUMN = "session_id"
#: Distributed first: the others' foreign keys point at it.
ANCHOR = "sessions"
#: Small tables every node reads (API keys: the tenant check on a worker reads them).
REFERENCE_TABLES = ("api_keys",)
#: Never distributed: read by the coordinator only.
LOCAL_TABLES = ("alembic_version",)

_SET_PURGING = "PERFORM set_config('contextledger.purging', p_session_id, true);"
_SET_PURGING_LOCAL = "EXECUTE format('SET LOCAL contextledger.purging = %L', p_session_id);"
_CLEAR_PURGING = "PERFORM set_config('contextledger.purging', '', true);"
_CLEAR_PURGING_LOCAL = "SET LOCAL contextledger.purging = '';"


def session_tables(bind: sa.Connection) -> list[str]:
    """The schema's tables with a ``session_id`` column, ``sessions`` first."""
    rows = bind.execute(
        sa.text(
            "SELECT c.table_name FROM information_schema.columns c"
            " JOIN information_schema.tables t"
            "   ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
            " WHERE c.table_schema = :s AND c.column_name = :col"
            "   AND t.table_type = 'BASE TABLE'"
            " ORDER BY c.table_name <> :anchor, c.table_name"
        ),
        {"s": S, "col": DISTRIBUTION_COLUMN, "anchor": ANCHOR},
    )
    return [r[0] for r in rows]


def has_citus(bind: sa.Connection) -> bool:
    found = bind.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'citus'").first()
    return found is not None


def _replace_in_purge(old: str, new: str, *, other: tuple[str, str]) -> None:
    """Rewrites the live ``purge_session`` (whichever migration defined it last)."""
    bind = op.get_bind()
    body = bind.exec_driver_sql(
        f"SELECT pg_get_functiondef('{S}.purge_session(text, text)'::regprocedure)"
    ).scalar_one()
    if old not in body or other[0] not in body:
        raise RuntimeError(
            f"{S}.purge_session no longer marks its deletes as 0014 expects ({old!r}):"
            " update migration 0014 with the new body"
        )
    body = body.replace(old, new).replace(other[0], other[1])
    op.execute(body)


def upgrade() -> None:
    bind = op.get_bind()
    op.execute(f"DROP INDEX IF EXISTS {S}.events_position")
    _replace_in_purge(
        _SET_PURGING, _SET_PURGING_LOCAL, other=(_CLEAR_PURGING, _CLEAR_PURGING_LOCAL)
    )
    if not has_citus(bind):
        return
    op.execute(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET citus.propagate_set_commands"
        " = local', current_database()); END $$"
    )
    op.execute("SET LOCAL citus.propagate_set_commands = local")
    op.execute("SET LOCAL citus.enable_unsafe_triggers = on")
    # DDL in this transaction has already touched the workers: one connection per node.
    op.execute("SET LOCAL citus.multi_shard_modify_mode = sequential")
    op.execute(
        f"SELECT create_distributed_function(p.oid::regprocedure::text)"
        f"  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        f" WHERE n.nspname = '{S}' AND p.prokind = 'f'"
        f"   AND p.oid NOT IN (SELECT objid FROM pg_catalog.pg_dist_object"
        f"                      WHERE classid = 'pg_proc'::regclass)"
    )
    for table in REFERENCE_TABLES:
        op.execute(f"SELECT create_reference_table('{S}.{table}')")
    for table in session_tables(bind):
        colocate = "none" if table == ANCHOR else f"{S}.{ANCHOR}"
        op.execute(
            f"SELECT create_distributed_table('{S}.{table}', '{DISTRIBUTION_COLUMN}',"
            f" colocate_with => '{colocate}')"
        )


def downgrade() -> None:
    bind = op.get_bind()
    if has_citus(bind):
        op.execute("SET LOCAL citus.enable_unsafe_triggers = on")
        op.execute("SET LOCAL citus.multi_shard_modify_mode = sequential")
        distributed = bind.exec_driver_sql(
            f"SELECT logicalrelid::regclass::text FROM pg_dist_partition"
            f" WHERE logicalrelid::regclass::text LIKE '{S}.%'"
        ).all()
        if distributed:
            op.execute(
                f"SELECT undistribute_table('{S}.{ANCHOR}', cascade_via_foreign_keys => true)"
            )
        for (table,) in bind.exec_driver_sql(
            f"SELECT logicalrelid::regclass::text FROM pg_dist_partition"
            f" WHERE logicalrelid::regclass::text LIKE '{S}.%'"
        ).all():
            op.execute(f"SELECT undistribute_table('{table}')")
        op.execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET"
            " citus.propagate_set_commands', current_database()); END $$"
        )
    _replace_in_purge(
        _SET_PURGING_LOCAL, _SET_PURGING, other=(_CLEAR_PURGING_LOCAL, _CLEAR_PURGING)
    )
    op.execute(f"CREATE UNIQUE INDEX events_position ON {S}.events (position)")
