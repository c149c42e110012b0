"""Distribution on Citus: every session table by ``session_id``, co-located; the rest as
reference tables. On plain PostgreSQL only the portable part runs.

Revision ID: 0014
Revises: 0015
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
  never a ``set_config()`` call;
- ``append_message`` / ``append_session_messages``: the store's two append statements as
  functions (``APPEND_FUNCTIONS``), which the store calls on Citus only.

Where the ``citus`` extension is installed in the database (``CREATE EXTENSION citus``
and ``citus_add_node`` done by the operator first, see docs/deploy/citus.md):

- the database's default ``citus.propagate_set_commands`` becomes ``local`` (the tenant
  of a transaction and the purge mark reach the workers; the store checks it at start);
- the schema's functions are propagated to the workers (the row-level security policy,
  the tenant default and the trigger call them there): first those that take or return
  no table's row type, after the tables the others (0013's ``erase_session``);
- ``session_tables()``, discovered (any table of the schema with a ``session_id``
  column, so 0012/0013's tables are included), are distributed by ``session_id``,
  co-located with ``sessions`` (its foreign-key target, distributed first);
- ``REFERENCE_TABLES`` (small, read everywhere) are copied to every node;
- the append functions are distributed by their session argument, co-located, with
  ``force_delegation`` (Citus runs each call whole on the session's worker);
- the append-only trigger is kept (``citus.enable_unsafe_triggers`` while distributing:
  its body only reads its own row and a setting, both local to the shard).

``alembic_version`` stays a plain table on the coordinator (only it reads it).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0015"
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


#: The message appends as functions, for Citus: there the store calls them and Citus
#: runs the whole call on the worker holding the session's shard (``force_delegation``:
#: inside a transaction block too), one hop, where the statements of
#: ``store/postgres.py`` (a modifying CTE feeding an INSERT ... SELECT) would be planned
#: as two steps with the rows passing through the coordinator (and refused under
#: row-level security: Citus moves them with COPY). Same arguments, same answer (the new
#: ``view_tokens``, or NULL when the head check failed or the session was erased (0013),
#: nothing written).
APPEND_FUNCTIONS = {
    "append_message(text, bigint, smallint, text, integer, timestamptz, text, text, text)": f"""
    CREATE FUNCTION {S}.append_message(
        p_session text, p_seq bigint, p_version smallint, p_data text, p_tokens integer,
        p_created timestamptz, p_key text, p_hash text, p_prev text)
    RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE v bigint;
    BEGIN
        UPDATE {S}.sessions
           SET head = p_seq, last_hash = p_hash, view_tokens = view_tokens + p_tokens,
               view_count = view_count + 1
         WHERE session_id = p_session AND head = p_seq - 1 AND last_hash = p_prev
           AND erased_at IS NULL
        RETURNING view_tokens INTO v;
        IF FOUND THEN
            INSERT INTO {S}.events (session_id, seq, type, version, data, tokens, created_at,
                                    idempotency_key, hash)
            VALUES (p_session, p_seq, 'message.appended', p_version, p_data::jsonb, p_tokens,
                    p_created, p_key, p_hash);
        END IF;
        RETURN v;
    END $$""",
    "append_session_messages(text, bigint, bigint[], smallint[], text[], integer[],"
    " timestamptz, text[], text, bigint, text[], text)": f"""
    CREATE FUNCTION {S}.append_session_messages(
        p_session text, p_head bigint, p_seqs bigint[], p_versions smallint[],
        p_datas text[], p_tokens integer[], p_created timestamptz, p_hashes text[],
        p_last text, p_total bigint, p_keys text[], p_prev text)
    RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE v bigint;
    BEGIN
        UPDATE {S}.sessions
           SET head = p_head + cardinality(p_seqs), last_hash = p_last,
               view_tokens = view_tokens + p_total,
               view_count = view_count + cardinality(p_seqs)
         WHERE session_id = p_session AND head = p_head AND last_hash = p_prev
           AND erased_at IS NULL
        RETURNING view_tokens INTO v;
        IF FOUND THEN
            FOR i IN 1 .. cardinality(p_seqs) LOOP
                INSERT INTO {S}.events (session_id, seq, type, version, data, tokens,
                                        created_at, idempotency_key, hash)
                VALUES (p_session, p_seqs[i], 'message.appended', p_versions[i],
                        p_datas[i]::jsonb, p_tokens[i], p_created, p_keys[i], p_hashes[i]);
            END LOOP;
        END IF;
        RETURN v;
    END $$""",
}
ROLE = "contextledger_service"
#: The schema's functions not yet known to Citus (the append functions are distributed
#: by their session argument instead).
_DISTRIBUTE_FUNCTIONS = (
    f"SELECT create_distributed_function(p.oid::regprocedure)"
    f"  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
    f" WHERE n.nspname = '{S}' AND p.prokind = 'f'"
    f"   AND p.proname NOT IN ('append_message', 'append_session_messages')"
    f"   AND p.oid NOT IN (SELECT objid FROM pg_catalog.pg_dist_object"
    f"                      WHERE classid = 'pg_proc'::regclass)"
)
#: Before the tables are distributed, only functions that take or return no table's row
#: type: Citus refuses to propagate a function depending on a table it does not know yet
#: (0013's ``erase_session`` returns an ``erasures`` row). The others follow the tables.
_NO_TABLE_TYPE = (
    "   AND NOT EXISTS (SELECT FROM pg_depend d JOIN pg_type t ON t.oid = d.refobjid"
    "                    WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid"
    "                      AND d.refclassid = 'pg_type'::regclass AND t.typrelid <> 0)"
)


def upgrade() -> None:
    bind = op.get_bind()
    op.execute(f"DROP INDEX IF EXISTS {S}.events_position")
    for signature, create in APPEND_FUNCTIONS.items():
        op.execute(create)
        op.execute(f"GRANT EXECUTE ON FUNCTION {S}.{signature} TO {ROLE}")
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
    op.execute(_DISTRIBUTE_FUNCTIONS + _NO_TABLE_TYPE)  # what the tables' DDL calls
    for table in REFERENCE_TABLES:
        op.execute(f"SELECT create_reference_table('{S}.{table}')")
    for table in session_tables(bind):
        colocate = "none" if table == ANCHOR else f"{S}.{ANCHOR}"
        op.execute(
            f"SELECT create_distributed_table('{S}.{table}', '{DISTRIBUTION_COLUMN}',"
            f" colocate_with => '{colocate}')"
        )
    op.execute(_DISTRIBUTE_FUNCTIONS)  # the rest: those taking or returning a table's row
    for signature in APPEND_FUNCTIONS:  # run where the session's shard is (see above)
        op.execute(
            f"SELECT create_distributed_function('{S}.{signature}', 'p_session',"
            f" colocate_with => '{S}.{ANCHOR}', force_delegation => true)"
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
    for signature in APPEND_FUNCTIONS:
        op.execute(f"DROP FUNCTION {S}.{signature}")
