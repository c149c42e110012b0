"""One ``Ledger`` per tenant, each on connections scoped to that tenant.

Every transaction of a tenant ledger's connections sets ``contextledger.tenant``
(``store/scoped.py``: per transaction, so PgBouncer's transaction mode keeps it) and
acts as the service role (no superuser, no BYPASSRLS, no table owner: checked on each
new connection), so PostgreSQL's row-level security, not only this code, keeps
tenants apart. Sessions are cached per tenant so an append is one
round trip, as in the library.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import structlog

from contextledger import Ledger, Session
from contextledger.errors import ConfigError
from contextledger.http.keys import KeyRing
from contextledger.http.settings import Settings
from contextledger.store.dsn import asyncpg_dsn, with_user
from contextledger.store.scoped import check_role

log = structlog.get_logger(__name__)
LOCAL_TENANT = "local"
SESSION_CACHE = 4096
#: How long ``close`` waits for deferred writes (a reply's record: one append each).
DRAIN_S = 30.0


class Tenants:
    """Opens tenant ledgers on demand and closes them all at shutdown."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dsn: str | None = None
        self.keys: KeyRing | None = None
        self._pool: asyncpg.Pool | None = None
        self._ledgers: dict[str, Ledger] = {}
        #: open sessions, least recently used first, across tenants; with the bytes each
        #: was estimated at when last used (``Session.footprint``) and their sum
        self._sessions: OrderedDict[tuple[str, str], tuple[Session, int]] = OrderedDict()
        self.cached_bytes = 0
        self._opening = asyncio.Lock()
        self._head: str | None = None
        self._login: str | None = None  # the DSN logging in as the service role, if it can
        self.on_session: list[Any] = []  # callbacks(session) when a session is first opened
        #: (tenant, session id) -> the last write deferred past a response (``defer``)
        self._deferred: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._pending: set[asyncio.Task[None]] = set()  # every deferred write not done

    @property
    def memory(self) -> bool:
        return self.dsn == "memory://"

    async def start(self) -> None:
        """Resolve the DSN (starting the embedded server), migrate, open the key ring."""
        s = self.settings
        dsn = s.dsn
        if dsn is None:
            from contextledger.store import embedded

            dsn = await asyncio.to_thread(embedded.start, Path(s.home) if s.home else None)
        self.dsn = dsn
        if self.memory:
            return
        if s.migrate:
            from contextledger.store import migrate

            await migrate.upgrade(dsn)
        self._login = await self._service_login(dsn) if s.service_role else None
        settings = {} if s.pgbouncer else {"application_name": "contextledger-service"}
        if s.service_role and self._login is None:
            if s.pgbouncer:
                raise ConfigError(
                    f"behind PgBouncer the service must log in as {s.service_role} itself "
                    "(a role switch is a startup parameter): let it log in (migration 0008, "
                    "CONTEXTLEDGER_SERVICE_PASSWORD where the server asks for one)",
                    key="service_role",
                )
            settings["role"] = s.service_role
        self._pool = await asyncpg.create_pool(
            self._login or asyncpg_dsn(dsn),
            min_size=1,
            max_size=2,
            server_settings=settings,
            statement_cache_size=0 if s.pgbouncer else 100,
        )
        async with self._pool.acquire() as conn:  # as tenant connections will act
            await check_role(conn)  # a superuser, BYPASSRLS or owner: refuse to start
        self.keys = KeyRing(self._pool, cache_seconds=s.key_cache_seconds)
        from contextledger.store.migrate import head_revision

        self._head = head_revision()  # parsing the migration scripts takes ~15 ms

    async def _service_login(self, dsn: str) -> str | None:
        """The DSN that logs in as the service role itself, if the server lets it (0008).

        A connection switched to the role from another user keeps that session user, and
        ``RESET ROLE`` takes it back: from a superuser, to every tenant's rows. Logged in
        as the role, there is nothing to reset to. Else: the switch, and a warning."""
        role = self.settings.service_role
        login = with_user(asyncpg_dsn(dsn), role, self.settings.service_password)
        try:
            conn = await asyncpg.connect(
                login, timeout=10, statement_cache_size=0 if self.settings.pgbouncer else 100
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning(
                "service_role_switched",
                role=role,
                reason=f"{type(exc).__name__}: {exc}",
                hint=f"let {role} log in (migration 0008, a password where the server asks "
                "for one: CONTEXTLEDGER_SERVICE_PASSWORD), or RLS relies on no statement "
                "resetting the role",
            )
            return None
        try:
            privileged = await conn.fetchval(
                "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
            )
        finally:
            await conn.close()
        if privileged:
            raise ConfigError(
                f"the service role {role} is a superuser or bypasses row-level security",
                key="service_role",
            )
        return login

    @property
    def logged_in_as_role(self) -> bool:
        """Whether tenant connections log in as the service role (not switch to it)."""
        return self._login is not None

    async def keys_required(self) -> bool:
        return self.keys is not None and await self.keys.keys_required()

    async def ready(self) -> tuple[bool, str]:
        """Database reachable and at the code's schema revision."""
        if self.memory:
            return True, "memory"
        assert self._pool is not None
        try:
            current = await self._pool.fetchval(
                "SELECT version_num FROM contextledger.alembic_version"
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            return False, f"database unreachable: {type(exc).__name__}"
        head = self._head
        if current != head:
            return False, f"schema at {current}, code needs {head}"
        return True, str(current)

    async def ledger(self, tenant: str) -> Ledger:
        found = self._ledgers.get(tenant)
        if found is not None:
            return found
        async with self._opening:
            found = self._ledgers.get(tenant)
            if found is None:
                switch = self.settings.service_role or None
                found = await Ledger.open(
                    self._login or self.dsn,
                    migrate=False,
                    pool_size=self.settings.pool_size,
                    tenant=None if self.memory else tenant,
                    role=None if self.memory or self._login else switch,
                    pgbouncer=self.settings.pgbouncer,
                )
                self._ledgers[tenant] = found
                log.info("tenant_opened", tenant=tenant)
        return found

    async def session(
        self,
        tenant: str,
        session_id: str,
        *,
        create: bool = False,
        model: str | None = None,
        config: Any = None,
        metadata: Any = None,
    ) -> Session:
        """An existing session (``SessionNotFound`` otherwise), or a new one if ``create``.

        Writes to it deferred by earlier requests (``defer``) have landed by then."""
        if self._deferred:
            await self.settle(tenant, session_id)
        ledger = await self.ledger(tenant)
        key = (tenant, session_id)
        cached = self._sessions.get(key)
        if cached is not None:
            self._cache(key, cached[0])
            return cached[0]
        session = await ledger.session(
            session_id, create=create, model=model, config=config, metadata=metadata
        )
        self._cache(key, session)
        for callback in self.on_session:
            callback(session)
        return session

    def _cache(self, key: tuple[str, str], session: Session) -> None:
        """(Re)enter ``session`` as the most recently used, at its current footprint, and
        drop the least recently used while the cache is over its count or its bytes (the
        newest always stays: a request holds it)."""
        old = self._sessions.pop(key, None)
        if old is not None:
            self.cached_bytes -= old[1]
        size = session.footprint
        self._sessions[key] = (session, size)
        self.cached_bytes += size
        cap = self.settings.session_cache_bytes
        while len(self._sessions) > 1 and (
            len(self._sessions) > SESSION_CACHE or self.cached_bytes > cap
        ):
            _, (_, dropped) = self._sessions.popitem(last=False)
            self.cached_bytes -= dropped

    def cached(self, tenant: str, session_id: str) -> bool:
        return (tenant, session_id) in self._sessions

    def defer(self, tenant: str, session_id: str, write: Callable[[], Awaitable[None]]) -> None:
        """Run ``write`` (to the session) once the current response is on its way.

        Every later use of the session through this process (``session``) waits for it,
        so what a client does after seeing the response comes after the write, and
        ``close`` waits for all of them. Deferred writes to one session run in order.
        A write that fails is logged: nothing awaits it.
        """
        key = (tenant, session_id)
        task = asyncio.get_running_loop().create_task(
            _after(self._deferred.get(key), write, tenant, session_id)
        )
        self._deferred[key] = task
        self._pending.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._pending.discard(finished)
            if self._deferred.get(key) is finished:
                del self._deferred[key]

        task.add_done_callback(done)

    async def settle(self, tenant: str, session_id: str) -> None:
        """Wait for the writes to the session deferred so far (``defer``)."""
        task = self._deferred.get((tenant, session_id))
        if task is not None:
            await asyncio.wait([task])  # a cancelled waiter leaves the write running

    async def settled(self) -> None:
        """Wait until no deferred write is pending (for every session)."""
        while self._deferred:
            await asyncio.wait(list(self._deferred.values()))

    def forget(self, tenant: str, session_id: str) -> None:
        dropped = self._sessions.pop((tenant, session_id), None)
        if dropped is not None:
            self.cached_bytes -= dropped[1]

    def pool_stats(self) -> dict[str, tuple[int, int]]:
        """Per tenant: (connections open, connections idle) of its ledger's pool."""
        stats: dict[str, tuple[int, int]] = {}
        for tenant, ledger in self._ledgers.items():
            counts = ledger.store.connections()
            if counts is not None:
                stats[tenant] = counts
        return stats

    async def close(self) -> None:
        """Close every ledger once the deferred writes have landed (``DRAIN_S`` at
        most: a reply whose record is cut off is appended when the client resends its
        history): each ledger waits for its in-flight appends to come home."""
        try:
            async with asyncio.timeout(DRAIN_S):
                await self.settled()
        except TimeoutError:  # every pending write, not only each session's last
            late = list(self._pending)
            log.warning("deferred_writes_abandoned", pending=len(late))
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        ledgers, self._ledgers = list(self._ledgers.values()), {}
        for ledger in ledgers:
            await ledger.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


async def _after(
    before: asyncio.Task[None] | None,
    write: Callable[[], Awaitable[None]],
    tenant: str,
    session_id: str,
) -> None:
    if before is not None:
        await asyncio.wait([before])
    try:
        await write()
    except Exception:
        log.exception("deferred_write_failed", tenant=tenant, session_id=session_id)
