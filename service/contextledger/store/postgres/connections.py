"""Connection holding for the PostgreSQL store: the pools, the hot append connections,
the schema revision check."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import structlog

from contextledger.errors import (
    MigrationRequired,
)
from contextledger.store import distributed
from contextledger.store.base import (
    Store,
)
from contextledger.store.distributed import Citus
from contextledger.store.dsn import redact
from contextledger.store.errors import translated
from contextledger.store.postgres.statements import S

log = structlog.get_logger(__name__)

#: The same settings for the connections kept for live searches (``connect``'s second
#: pool), so a search is one autocommit statement: the transaction block and its SET
#: cost three more round trips (~0.5 ms of a ~3 ms search, measured at 20,000 turns).
#: JIT off (``NO_JIT``), as on every connection of the store.
_SEARCH_CONNECTION = {
    "synchronous_commit": "off",
    "plan_cache_mode": "force_generic_plan",
    "jit": "off",
}
#: Every connection of the store runs without JIT compilation. Where the server has it
#: (Debian's and most distributions' packages; not the embedded server), a statement whose
#: estimated cost passes ``jit_above_cost`` is compiled first: the recall search's
#: generic plan crossed it at ~16,000 turns and each search then spent ~480 ms compiling
#: for ~15 ms of work (PostgreSQL 15 here). Our statements each read a session's rows by
#: key: compilation never pays for itself.
NO_JIT = {"jit": "off"}


def _idempotency_violation(exc: asyncpg.UniqueViolationError) -> bool:
    """The unique violation is the idempotency index's. Citus relays a worker's error
    without its constraint field (and names the shard's index, ``events_idempotency_N``):
    the message names it then."""
    return "events_idempotency" in f"{exc.constraint_name or ''} {exc}"


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing to undo (we never SET, LISTEN or take advisory locks).

    asyncpg still rolls back an open transaction before calling this; its default
    reset (``RESET ALL; CLOSE ALL; UNLISTEN *; ...``) cost a second round trip per
    append (~136 µs, measured by bench/ledger.py).
    """


class Connections(Store):
    """The main and search pools and the connections kept hot for appends."""

    citus: Citus | None  # the Citus the store found at start (None: plain PostgreSQL)

    _pool: asyncpg.Pool
    _search_pool: asyncpg.Pool | None
    _search_refused_at: float | None
    _dsn: str
    _idle: list[asyncpg.Connection]
    _lent: int
    _closing: bool
    _hot_max: int

    @translated
    async def schema_revision(self) -> str | None:
        try:
            revision: str | None = await self._pool.fetchval(
                f"SELECT version_num FROM {S}.alembic_version"
            )
            return revision
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return None

    @translated
    async def require_revision(self, head: str) -> None:
        current = await self.schema_revision()
        if current == head and self.citus is not None:
            async with self._pool.acquire() as conn:
                self.citus = await distributed.check(conn)  # the tables distributed, too
        if current != head:
            raise MigrationRequired(
                f"the database at {redact(self._dsn)} is at schema revision {current!r}, this "
                f"code needs {head!r}. Run `contextledger migrate --dsn '{redact(self._dsn)}'`"
                + (" with the real password" if redact(self._dsn) != self._dsn else "")
                + " (or open the ledger with migrate=True).",
                current=current,
                required=head,
            )

    async def _hot(self, call: Callable[[asyncpg.Connection], Awaitable[Any]]) -> Any:
        """``fetchval`` on a kept connection; falls back to the pool when all are busy.

        A server-side error leaves the connection usable; anything else (a dropped
        connection, a cancellation mid-query) hands it back to the pool, which
        resets or replaces it.
        """
        if self._idle:
            conn = self._idle.pop()
        elif self._lent < self._hot_max:
            self._lent += 1
            try:
                conn = await self._pool.acquire()
            except BaseException:
                self._lent -= 1
                raise
        else:
            async with self._pool.acquire() as pooled:
                return await call(pooled)
        try:
            result = await call(conn)
        except asyncpg.PostgresError as exc:
            if not isinstance(exc, asyncpg.PostgresConnectionError):
                await self._give_back(conn)
                raise
            await self._drop(conn)
            raise
        except BaseException:
            await self._drop(conn)
            raise
        await self._give_back(conn)
        return result

    async def _drop(self, conn: asyncpg.Connection) -> None:
        """Hand a connection in an unknown state back to the pool, which resets or
        replaces it."""
        self._lent -= 1
        try:
            await self._pool.release(conn)
        except Exception as exc:  # already broken: the pool has terminated it
            log.debug("hot_connection_dropped", error=str(exc))

    async def _give_back(self, conn: asyncpg.Connection) -> None:
        if self._closing:  # close() is waiting for every connection to come home
            self._lent -= 1
            await self._pool.release(conn)
        else:
            self._idle.append(conn)

    def connections(self) -> tuple[int, int]:
        pools = [p for p in (self._pool, self._search_pool) if p is not None]
        return sum(p.get_size() for p in pools), sum(p.get_idle_size() for p in pools)
