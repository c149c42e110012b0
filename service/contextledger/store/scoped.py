"""Tenant connections: the tenant set in every transaction, never for the session.

A tenant's rows are the ones row-level security admits for ``contextledger.tenant``
(migration 0004). That setting used to travel as a startup parameter: PgBouncer in
transaction mode refuses one it does not track, and with ``ignore_startup_parameters``
drops it, so the setting was empty and ``current_tenant()`` meant ``'local'``. Here it
is ``SET LOCAL contextledger.tenant = <tenant>``, local to the transaction, in every
transaction the connection runs, whichever server connection a pooler lends it:

- a transaction (``conn.transaction()``) starts with ``BEGIN; SET LOCAL ...``, one
  simple-protocol round trip, as asyncpg's own ``BEGIN`` was;
- a statement outside one gets the same settings from ``set_config(..., true)`` sent
  in front of it, before the same ``Sync`` (``store/pipelined.py``): one implicit
  transaction on one server connection, and one round trip, as the statement alone
  (it took four: ``BEGIN; SET LOCAL``, asyncpg's ``Describe``, the statement, ``COMMIT``).
  If the tenant cannot be set, the statement does not run.

``SET LOCAL``, not ``set_config(..., true)``, on Citus: the row-level security policy runs
on the worker holding the shard, and Citus forwards a transaction's ``SET LOCAL`` to the
workers (``citus.propagate_set_commands = local``), never a ``set_config()`` call. There a
lone statement runs inside ``BEGIN; SET LOCAL ...`` … ``COMMIT``. For the same reason a
direct connection to a server with Citus is scoped per transaction too (``scoped``), not
once for its session.

``check_role`` refuses a tenant connection whose role would not be held by row-level
security at all: a superuser, a BYPASSRLS role, or a member of a table's owner (owners
bypass RLS unless FORCE, and FORCE still exempts superusers and BYPASSRLS).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import asyncpg

from contextledger.errors import ConfigError
from contextledger.store.pipelined import PoolerConnection, prefix

SCHEMA = "contextledger"
TENANT_SETTING = "contextledger.tenant"
_SETTING_NAME = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?")

#: Whether the connection's role is kept apart by row-level security (asked once per
#: new connection, not per statement).
PRIVILEGED = f"""
SELECT r.rolsuper, r.rolbypassrls,
       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = '{SCHEMA}' AND c.relkind IN ('r', 'p')
                  AND pg_has_role(current_user, c.relowner, 'MEMBER')) AS owner,
       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') AS citus
  FROM pg_roles r WHERE r.rolname = current_user
"""


def literal(value: str) -> str:
    """``value`` as a PostgreSQL escape-string literal (``E'...'``): backslashes and quotes
    escaped, so it reads back the same whatever the server's ``standard_conforming_strings``
    (a plain ``'...'`` with only quotes doubled let ``\'`` end it where that setting is off).
    The scope is sent as text, not bound, because it rides on asyncpg's own ``BEGIN``."""
    if "\x00" in value:
        raise ConfigError("a tenant cannot contain NUL", key="tenant")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def scope_sql(tenant: str, settings: Mapping[str, str] | None = None) -> str:
    """The statements that scope a transaction: the tenant and ``settings``, local."""
    parts = {TENANT_SETTING: tenant, **(settings or {})}
    return "; ".join(f"SET LOCAL {_name(name)} = {literal(v)}" for name, v in parts.items())


def prefix_sql(tenant: str, settings: Mapping[str, str] | None = None) -> str:
    """A statement that sets the tenant and ``settings`` for the rest of its transaction
    and returns no row (``set_config`` never returns NULL; ``concat`` calls each)."""
    parts = {TENANT_SETTING: tenant, **(settings or {})}
    calls = ", ".join(
        f"set_config({literal(_name(name))}, {literal(v)}, true)" for name, v in parts.items()
    )
    return f"SELECT 1 WHERE concat({calls}) IS NULL"


def session_scope_sql(tenant: str) -> str:
    """The statement that scopes a direct connection's whole session (plain PostgreSQL
    only: a worker of Citus would not see it)."""
    return f"SELECT set_config({literal(TENANT_SETTING)}, {literal(tenant)}, false)"


def _name(setting: str) -> str:
    """A setting's name, checked: it is spliced into ``SET LOCAL`` (no bind there)."""
    if not _SETTING_NAME.fullmatch(setting):
        raise ConfigError(f"not a setting name: {setting!r}", key="settings")
    return setting


class TenantConnection(PoolerConnection):
    """An asyncpg connection whose every transaction is scoped to one tenant
    (``scope``, set by ``scoped``; None: a plain connection). ``prefix``: the scope
    sent in front of a lone statement, before its ``Sync`` (None: on Citus, the lone
    statement is wrapped in a scoped transaction instead)."""

    _scope: str | None = None
    _prefix: bytes | None = None
    _lone = False  # a lone statement of this connection is under way

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:  # noqa: ASYNC109
        scope = self._scope
        if scope is not None and not args and query.startswith("BEGIN"):
            query = f"{query.rstrip().rstrip(';')}; {scope}"  # asyncpg's transaction()
        status: str = await super().execute(query, *args, timeout=timeout)
        return status

    async def _execute(self, query: Any, args: Any, limit: Any, timeout: Any, **kw: Any) -> Any:  # noqa: ASYNC109
        if self._scope is None or self.is_in_transaction():
            return await super()._execute(query, args, limit, timeout, **kw)
        if self._prefix is not None:
            self._lone = True
            try:
                return await super()._execute(query, args, limit, timeout, **kw)
            finally:
                self._lone = False
        return await self._scoped(super()._execute, query, args, limit, timeout, **kw)

    def _lead(self) -> bytes | None:
        """A lone statement's run (asyncpg's retry and its type introspection too) goes
        out with the scope in front, before the same ``Sync`` (``OneSegment``, which
        closes the connection if the statement fails to follow it)."""
        return self._prefix if self._lone else None

    async def _executemany(self, query: Any, args: Any, timeout: Any, **kw: Any) -> Any:  # noqa: ASYNC109
        if self._scope is None or self.is_in_transaction():
            return await super()._executemany(query, args, timeout, **kw)
        return await self._scoped(super()._executemany, query, args, timeout, **kw)

    async def _scoped(self, call: Any, *args: Any, **kw: Any) -> Any:
        """``call`` in a transaction of its own that starts scoped."""
        await self.execute("BEGIN")
        try:
            result = await call(*args, **kw)
        except asyncpg.PostgresError:
            if self.is_in_transaction() and not self.is_closed():
                await super().execute("ROLLBACK")
            raise
        # anything else (a cancellation, a dropped connection) leaves the connection to
        # the pool, which rolls back or replaces it
        await super().execute("COMMIT")
        return result


async def check_role(conn: asyncpg.Connection) -> bool:
    """Refuse (``ConfigError``) a tenant connection that row-level security would not
    hold: whichever way it was made (logged in as the role, or switched to it). True
    where the server has Citus (the scope must then be per transaction)."""
    row = await conn.fetchrow(PRIVILEGED)
    if row is None:
        raise ConfigError("cannot read the tenant connection's role", key="service_role")
    if row["rolsuper"] or row["rolbypassrls"] or row["owner"]:
        why = (
            "a superuser"
            if row["rolsuper"]
            else "BYPASSRLS"
            if row["rolbypassrls"]
            else "a member of the tables' owner"
        )
        user = await conn.fetchval("SELECT current_user")
        raise ConfigError(
            f"tenant connections act as {user!r}, which is {why}: row-level security would "
            "not keep tenants apart. Use a role without those (contextledger_service).",
            key="service_role",
        )
    return bool(row["citus"])


def scoped(
    tenant: str, settings: Mapping[str, str] | None = None, *, per_transaction: bool = True
) -> Any:
    """A pool ``init`` callback: the connection checked (``check_role``), then scoped:
    every transaction (``per_transaction``: behind a transaction-mode pooler, where the
    server connection changes between transactions), or once for the connection's
    session (a direct connection is its server session: the same scope, without two
    more round trips per lone statement; not on Citus, whose workers would not see it).
    Either way after the connection is made, never a startup parameter, and checked
    before."""
    scope = scope_sql(tenant, settings)
    lone = prefix(prefix_sql(tenant, settings))
    # Citus plans a query with a CTE or subqueries on distributed tables only with its
    # parameters' values: no forced generic plan there.
    citus_scope = scope_sql(
        tenant, {k: v for k, v in (settings or {}).items() if k != "plan_cache_mode"}
    )

    async def init(conn: asyncpg.Connection) -> None:
        citus = await check_role(conn)  # before the scope: a plain statement
        assert isinstance(conn, TenantConnection)
        if per_transaction or citus:
            conn._scope = citus_scope if citus else scope
            conn._prefix = None if citus else lone
        else:
            await conn.execute(session_scope_sql(tenant))

    return init
