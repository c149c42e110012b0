"""Citus: what the store checks at start where the ``citus`` extension is installed.

Migration 0014 distributes every session table by ``session_id`` (co-located), so each
of our statements is a single-shard query. Two things it cannot settle for every
connection, checked here (``ConfigError`` naming the setting, before anything runs):

- ``citus.propagate_set_commands`` must be ``local``: the tenant of a transaction
  (``store/scoped.py``) and the purge's mark for the append-only trigger are
  ``SET LOCAL`` on the coordinator, and reach the workers, where row-level security and
  the trigger run, only so (0014 makes it the database's default; a role or a DSN may
  override it);
- the session tables must be distributed (0014 ran after ``CREATE EXTENSION citus``):
  otherwise they are plain tables on the coordinator and nothing is spread.

Cross-session batching of appends is off on Citus (``PostgresStore``): one statement
for many sessions would be a multi-shard transaction (two-phase commit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg

from contextledger.errors import ConfigError

#: The settings each connection needs on Citus, and the value it needs.
REQUIRED_SETTINGS: Mapping[str, str] = {"citus.propagate_set_commands": "local"}


@dataclass(frozen=True)
class Citus:
    """What the probe found on a server with Citus."""

    version: str
    settings: Mapping[str, str | None]
    distributed: bool | None  # None: the schema is not there yet (migrations pending)
    #: The connection's transactions are read-only (a standby, or
    #: ``default_transaction_read_only``). The search's catch-up runs in a call delegated
    #: to a worker, which never sees the coordinator's read-only transaction: a read-only
    #: store searches without storing (``Search``), as a standby does on one server.
    read_only: bool = False


def problems(found: Citus, *, schema: bool = True) -> list[str]:
    """Why ``found`` cannot run the ledger (empty: it can); ``schema``: whether the
    tables must already be distributed (not before the migrations ran)."""
    out = [
        f"{name} is {found.settings.get(name)!r}, contextledger needs {want!r} on Citus "
        f"(`ALTER DATABASE ... SET {name} = {want}`, done by migration 0014, or in the "
        "server's configuration): the tenant and the purge mark are SET LOCAL and must "
        "reach the workers"
        for name, want in REQUIRED_SETTINGS.items()
        if found.settings.get(name) != want
    ]
    if schema and found.distributed is False:
        out.append(
            "the citus extension is installed but contextledger's tables are not distributed:"
            " run migration 0014 after `CREATE EXTENSION citus` (see docs/deploy/citus.md)"
        )
    return out


async def probe(conn: asyncpg.Connection) -> Citus | None:
    """Citus as this connection sees it, or None where the extension is not installed."""
    version = await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
    if version is None:
        return None
    settings = {
        name: await conn.fetchval("SELECT current_setting($1, true)", name)
        for name in REQUIRED_SETTINGS
    }
    distributed: bool | None = None
    if await conn.fetchval("SELECT to_regclass('contextledger.sessions') IS NOT NULL"):
        distributed = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition"
            " WHERE logicalrelid = 'contextledger.sessions'::regclass)"
        )
    read_only = await conn.fetchval("SELECT current_setting('transaction_read_only') = 'on'")
    return Citus(str(version), settings, distributed, bool(read_only))


async def check(conn: asyncpg.Connection, *, schema: bool = True) -> Citus | None:
    """``probe``, refused with a ``ConfigError`` when Citus is there but not ready."""
    found = await probe(conn)
    if found is None:
        return None
    why = problems(found, schema=schema)
    if why:
        bad = [n for n, want in REQUIRED_SETTINGS.items() if found.settings.get(n) != want]
        raise ConfigError("Citus: " + "; ".join(why), key=bad[0] if bad else "schema")
    return found
