"""``PostgresStore``: the mixins of this package assembled, with the session lifecycle
(create, info, list), checkpoints, rebuild, purge and close."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg
import structlog

from contextledger.core.chain import GENESIS_HASH, make_event
from contextledger.core.encoding import dumps
from contextledger.core.events import Event, SessionCreated
from contextledger.core.projection import (
    compare_rows,
    fold,
)
from contextledger.errors import (
    ConfigError,
    InvalidArgument,
    KeyUnavailable,
    SessionExists,
    SessionHasForks,
    SessionNotFound,
)
from contextledger.store import distributed
from contextledger.store.base import (
    Checkpoint,
    Erasure,
    RebuildReport,
    SessionInfo,
    created_info,
)
from contextledger.store.batching import AppendBatcher
from contextledger.store.distributed import Citus
from contextledger.store.dsn import asyncpg_dsn, connect_timeout, redact
from contextledger.store.errors import translate, translated
from contextledger.store.lineage import Lineage, segments
from contextledger.store.pipelined import PoolerConnection
from contextledger.store.postgres.appends import Appends
from contextledger.store.postgres.connections import _SEARCH_CONNECTION, NO_JIT, _keep_session
from contextledger.store.postgres.reads import Reads
from contextledger.store.postgres.search import Search
from contextledger.store.postgres.statements import (
    ERASED_STATE,
    EVENT_COLUMNS,
    NOT_SEALED_STATE,
    ONE_SESSION_COLUMNS,
    READ_BRANCH_REFS,
    READ_VIEW,
    SESSION_COLUMNS,
    S,
    _erased,
    _event,
    _info,
    _item,
    _not_sealed,
    insert_view,
)
from contextledger.store.postgres.tips import _ClosedGate
from contextledger.store.postgres.vectors import Vectors
from contextledger.store.postgres.warm import WarmIndexes
from contextledger.store.scoped import TENANT_SETTING, TenantConnection, scoped
from contextledger.store.sealing import KEK_ENV, KeyRing, Sealer

log = structlog.get_logger(__name__)


#: One session's erasure (migration 0013's function), its audit row back.
_ERASE = (
    "SELECT session_id, erased_at, erased_by, actor, reason, events, last_hash,"
    f" removed::text FROM {S}.erase_session($1, $2, $3)"
)


class PostgresStore(Appends, Reads, Search, Vectors):
    kind = "postgres"
    concurrent_search = True

    def __init__(
        self,
        pool: asyncpg.Pool,
        dsn: str,
        *,
        hot_connections: int = 4,
        search_pool: asyncpg.Pool | None = None,
        keyring: KeyRing | None = None,
        tenant: str = "local",
        citus: Citus | None = None,
        pgbouncer: bool = False,
    ) -> None:
        self._pool = pool
        self.citus = citus  # the Citus the store found at start (None: plain PostgreSQL)
        #: Appends call the server's functions (migration 0014), as on Citus: behind a
        #: transaction-mode pooler a statement is parsed and planned at every run (no
        #: named prepared statements), a function's plans are kept by the server session.
        self._call_appends = citus is not None or pgbouncer
        #: KEKs that wrap new sessions' data keys; the tenant binds them (sealing.py).
        self._keyring = keyring
        self._tenant = tenant
        #: Each session's sealer (None: written in clear), as appends last used it.
        self._sealers: dict[str, Sealer | None] = {}
        self._search_pool = search_pool  # live searches (``_SEARCH_CONNECTION``), if any
        self._warm = WarmIndexes()  # sessions' postings held here (``warm.py``)
        self._search_refused_at: float | None = None  # when the server last refused it one
        self._indexing: dict[str, asyncio.Task[None]] = {}  # postings being stored (search.py)
        self._index_again: set[str] = set()
        self._unstored: dict[str, None] = {}  # sessions whose postings wait for a batch
        self._index_refused_at: float | None = None
        self._dsn = dsn
        self._heads: dict[str, tuple[int, str]] = {}  # bounded: _remember_head
        #: a lock lives while a writer holds or awaits it: one per session in use, not ever seen
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # Appends run on connections kept out of the pool: acquiring and releasing a
        # pooled connection per statement cost ~40-55 µs (bench/ledger.py). At most half
        # the pool (none of a pool of one: kept out, it left reads none and they waited
        # forever).
        self._idle: list[asyncpg.Connection] = []
        self._lent = 0
        self._closing = False
        # On Citus, no batch across sessions (a multi-shard transaction, two-phase commit):
        # each append is its own single-shard statement, as many in flight as connections.
        # Behind a pooler, one statement in flight: each costs a hop each way and a parse
        # and plan at the server (no prepared statements), and a second one in flight
        # mostly carried a lone append (bench/service.py at 16 clients, 2 processes: 0.46
        # statements per append, 0.32 with one in flight).
        self._batcher = AppendBatcher(
            self._append_one,
            self._append_many,
            max_batch=1 if citus is not None else 256,
            max_inflight=(max(2, hot_connections) if citus is not None else 1 if pgbouncer else 2),
            rolled_back=lambda exc: (
                isinstance(exc, asyncpg.PostgresError)
                and not isinstance(exc, asyncpg.PostgresConnectionError)
            ),
        )
        self._hot_max = hot_connections
        self._vectors: bool | None = None  # pgvector present? (asked once)
        self._closed: dict[str, _ClosedGate] = {}  # each session's last closed gate
        #: each session's ancestry (``()``: no fork); a fork point never moves, so it is
        #: read once (refreshed by ``session_info``, dropped by ``purge``)
        self._lineages: dict[str, Lineage] = {}

    @classmethod
    @translated
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        tenant: str | None = None,
        role: str | None = None,
        pgbouncer: bool = False,
        keyring: KeyRing | None = None,
    ) -> PostgresStore:
        """``tenant`` scopes every transaction to that tenant's rows: ``SET LOCAL
        contextledger.tenant`` at its start, or ``set_config(..., true)`` sent in front of
        a lone statement (``store/scoped.py``; the row-level security key, and the
        default of every ``tenant_id`` column), never a startup parameter, and a tenant
        connection whose role row-level security would not hold (superuser, BYPASSRLS, a
        member of the tables' owner) is refused.
        ``role`` makes the connections act as that database role (a startup parameter:
        not behind PgBouncer, where the DSN logs in as the role itself).

        ``pgbouncer``: the server is reached through PgBouncer in transaction mode:
        asyncpg's statement cache is off (``statement_cache_size=0``: named prepared
        statements do not survive a server connection change; each statement's types are
        kept instead, ``store/pipelined.py``) and no setting travels as a startup
        parameter (the search pool's go into each transaction).
        """
        settings: dict[str, str] = (
            {} if pgbouncer else {"application_name": "contextledger", **NO_JIT}
        )
        if role is not None:
            if pgbouncer:
                raise ConfigError(
                    "behind PgBouncer the DSN must log in as the role itself: a role switch "
                    "is a startup parameter PgBouncer refuses",
                    key="role",
                )
            settings["role"] = role
        if tenant is None and not pgbouncer:
            # No tenant: the local one, said outright. Left unset, ``current_tenant()``
            # (0011) asks a plpgsql function who may mean 'local', once per call: per row
            # of every insert's ``tenant_id`` default and per index probe of a search.
            settings[TENANT_SETTING] = "local"
        search_settings = dict(settings)
        if not pgbouncer:
            search_settings.update(_SEARCH_CONNECTION, application_name="contextledger-search")
        options: dict[str, Any] = {"reset": _keep_session}
        search_options: dict[str, Any] = {"reset": _keep_session}
        timeout = connect_timeout(dsn)  # libpq's connect_timeout: asyncpg's own is 60 s
        if timeout is not None:
            options["timeout"] = search_options["timeout"] = timeout
        if pgbouncer:
            options["statement_cache_size"] = search_options["statement_cache_size"] = 0
            # each statement described once per connection, then one round trip a run
            options["connection_class"] = search_options["connection_class"] = PoolerConnection
        if tenant is not None:
            options.update(
                connection_class=TenantConnection,
                init=scoped(tenant, per_transaction=pgbouncer),
            )
            search_options.update(
                connection_class=TenantConnection,
                init=scoped(
                    tenant, _SEARCH_CONNECTION if pgbouncer else None, per_transaction=pgbouncer
                ),
            )
        pool = search_pool = None
        try:
            pool = await asyncpg.create_pool(
                asyncpg_dsn(dsn),
                min_size=min_size,
                max_size=max_size,
                server_settings=settings,
                **options,
            )
            search_pool = await asyncpg.create_pool(  # connects at the first search
                asyncpg_dsn(dsn),
                min_size=0,
                max_size=max(1, max_size // 2),
                server_settings=search_settings,
                max_inactive_connection_lifetime=30,  # slots go back soon after a burst
                **search_options,
            )
        except Exception as exc:
            if pool is not None:
                await pool.close()
            typed = translate(exc)
            if typed is None:
                raise
            typed.args = (f"cannot connect to {redact(dsn)}: {typed.args[0]}",)
            raise typed from exc
        assert pool is not None and search_pool is not None
        try:
            async with pool.acquire() as conn:
                citus = await distributed.check(conn, schema=False)
        except BaseException:
            await pool.close()
            await search_pool.close()
            raise
        if citus is not None and "plan_cache_mode" in search_settings:
            # Citus plans a query with a CTE or subqueries on distributed tables only
            # with its parameters' values: no generic plan for the search (it has no
            # connection yet, so all of them get this).
            search_settings.pop("plan_cache_mode")
            cache = {
                k: v for k, v in search_options.items() if k in ("statement_cache_size", "timeout")
            }
            search_pool.set_connect_args(asyncpg_dsn(dsn), server_settings=search_settings, **cache)
        return cls(
            pool,
            dsn,
            hot_connections=max_size // 2,
            search_pool=search_pool,
            keyring=keyring,
            tenant=tenant or "local",
            citus=citus,
            pgbouncer=pgbouncer,
        )

    @translated
    async def create_session(
        self, session_id: str, payload: SessionCreated, *, created_at: datetime
    ) -> SessionInfo:
        event = make_event(session_id, 1, payload, GENESIS_HASH, created_at=created_at)
        sealer: Sealer | None = None
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                sealer = await self._new_key(conn, session_id)
                await conn.execute(
                    f"INSERT INTO {S}.sessions (session_id, created_at, model, config, metadata,"
                    " head, last_hash) VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, 1, $6)",
                    session_id,
                    created_at,
                    payload.model,
                    dumps(dict(payload.config)),
                    dumps(dict(payload.metadata)),
                    event.hash,
                )
                await conn.execute(
                    f"INSERT INTO {S}.events (session_id, seq, type, version, data, tokens,"
                    " created_at, hash) VALUES ($1, 1, $2, $3, $4::jsonb, 0, $5, $6)",
                    session_id,
                    event.type,
                    event.version,
                    dumps(event.payload.to_data()),
                    created_at,
                    event.hash,
                )
        except asyncpg.UniqueViolationError:
            raise SessionExists(
                f"session {session_id!r} already exists", session_id=session_id
            ) from None
        self._remember_head(session_id, (1, event.hash))
        self._sealers[session_id] = sealer
        self._lineages[session_id] = ()
        return created_info(session_id, created_at, payload, event.hash, sealed=sealer is not None)

    async def _stored_info(self, session_id: str) -> SessionInfo:
        """The session's row as stored (erased or not), this store's caches untouched."""
        row = await self._pool.fetchrow(
            f"SELECT {ONE_SESSION_COLUMNS} FROM {S}.sessions WHERE session_id = $1", session_id
        )
        if row is None:
            raise SessionNotFound.for_session(session_id)
        return _info(row)

    @translated
    async def session_info(self, session_id: str) -> SessionInfo:
        info = await self._stored_info(session_id)
        known = self._lineages.get(session_id)
        if info.parent is None:
            self._lineages[session_id] = ()
        elif not known or known[-1] != info.parent:
            self._lineages.pop(session_id, None)  # read again when needed
        if info.erased_at is not None:
            self._forget(session_id)
            raise _erased(session_id)
        if self._heads.get(session_id) != (info.head, info.last_hash):
            self._closed.pop(session_id, None)  # another writer moved the chain
            # (or purged it and made another under the id: never seal with its old key;
            # the postings appends here lexed end at the old tip: ``warm._caught_up``)
            self._sealers.pop(session_id, None)
        self._remember_head(session_id, (info.head, info.last_hash))
        return info

    @translated
    async def list_sessions(
        self, *, after: tuple[datetime, str] | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """A page by keyset (migration 0009's index, under row-level security): the rows
        after the last one shown, not an OFFSET past every earlier one."""
        where = "WHERE (created_at, session_id) > ($1, $2)" if after is not None else ""
        args: list[Any] = list(after) if after is not None else []
        page = f" LIMIT ${len(args) + 1}" if limit is not None else ""
        if limit is not None:
            args.append(limit)
        rows = await self._pool.fetch(
            f"SELECT {SESSION_COLUMNS} FROM {S}.sessions {where}"
            f" ORDER BY created_at, session_id{page}",
            *args,
        )
        return [_info(r) for r in rows]

    # -- appends ----------------------------------------------------------------------

    @translated
    async def checkpoints(self, session_id: str) -> list[Checkpoint]:
        """The session's checkpoints (a fork's: its ancestors' up to each fork point too)."""
        lineage = await self._lineage(session_id)
        out: list[Checkpoint] = []
        for owner, lo, hi in segments(session_id, lineage, 1, 2**62):
            rows = await self._pool.fetch(
                f"SELECT seq, data ->> 'label', created_at FROM {S}.events"
                " WHERE session_id = $1 AND type = 'checkpoint.created'"
                " AND seq BETWEEN $2 AND $3 ORDER BY seq",
                owner,
                lo,
                hi,
            )
            out.extend(Checkpoint(r[0], r[1], r[2]) for r in rows)
        return out

    @translated
    async def rebuild(self, session_id: str, *, repair: bool = True) -> RebuildReport:
        async with self._lock(session_id), self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT view_tokens, view_count, view_gen, head FROM {S}.sessions"
                " WHERE session_id = $1 FOR UPDATE",
                session_id,
            )
            if row is None:
                raise SessionNotFound.for_session(session_id)
            sealer = await self._sealer(session_id, conn=conn, fresh=True)
            lineage = await self._lineage(session_id, conn)
            if lineage:  # each part opened with its own session's key
                events = await self._lineage_events(conn, session_id, lineage, 1, row[3])
            else:
                events = [
                    _event(session_id, r, sealer)
                    for r in await conn.fetch(
                        f"SELECT {EVENT_COLUMNS} FROM {S}.events WHERE session_id = $1"
                        " ORDER BY seq",
                        session_id,
                    )
                ]
            expected = fold(events)
            if lineage:
                view = await self._fork_view(conn, session_id, lineage)
                branch = [r[:3] for r in await self._fork_branch(conn, session_id, lineage)]
            else:
                view = tuple(_item(r, sealer) for r in await conn.fetch(READ_VIEW, session_id))
                branch = [
                    (r[0], r[1], r[2]) for r in await conn.fetch(READ_BRANCH_REFS, session_id)
                ]
            diffs = compare_rows(expected.view, view, "view")
            if branch != [(i.ord, i.ref[0], i.ref[1]) for i in expected.branch]:
                diffs.append(
                    f"branch: {len(branch)} stored rows differ from the "
                    f"{len(expected.branch)} expected"
                )
            if (row[0], row[1]) != (expected.view_tokens, len(expected.view)):
                diffs.append(
                    f"session totals: stored {row[0]} tokens / {row[1]} items, "
                    f"expected {expected.view_tokens} / {len(expected.view)}"
                )
            if diffs and repair:
                await conn.execute(f"DELETE FROM {S}.view_items WHERE session_id = $1", session_id)
                await conn.execute(
                    f"DELETE FROM {S}.branch_items WHERE session_id = $1", session_id
                )
                gen = row[2] + 1
                await insert_view(conn, session_id, gen, expected.view)
                await conn.executemany(
                    f"INSERT INTO {S}.branch_items (session_id, ord, seq, part)"
                    " VALUES ($1, $2, $3, $4)",
                    [(session_id, i.ord, i.ref[0], i.ref[1]) for i in expected.branch],
                )
                await conn.execute(
                    f"UPDATE {S}.sessions SET view_tokens = $2, view_count = $3, view_gen = $4,"
                    " view_base = $5, branch_base = $5 WHERE session_id = $1",
                    session_id,
                    expected.view_tokens,
                    len(expected.view),
                    gen,
                    row[3],
                )
        if diffs:
            log.warning(
                "projection_rebuilt", session_id=session_id, differences=diffs, repaired=repair
            )
        return RebuildReport(session_id, tuple(diffs), bool(diffs) and repair)

    @translated
    async def purge(self, session_id: str, reason: str) -> int:
        """The audited purge path (see the migration): removes a session entirely."""
        await self.wait_indexed(session_id, store=False)  # (and INDEX_BEHIND's row lock)
        async with self._lock(session_id), self._pool.acquire() as conn, conn.transaction():
            # the row locked first: a fork being created (its parent read FOR SHARE)
            # either committed before, and is listed, or finds the parent gone
            await conn.execute(
                f"SELECT 1 FROM {S}.sessions WHERE session_id = $1 FOR UPDATE", session_id
            )
            forks = [
                r[0]
                for r in await conn.fetch(
                    f"SELECT session_id FROM {S}.sessions WHERE parent_session_id = $1"
                    " ORDER BY session_id",
                    session_id,
                )
            ]
            if forks:
                raise SessionHasForks(
                    f"session {session_id!r} has forks standing on it ({', '.join(forks)}):"
                    " purge them first",
                    session_id=session_id,
                    forks=forks,
                )
            try:
                n: int = await conn.fetchval(
                    f"SELECT {S}.purge_session($1, $2)", session_id, reason
                )
            except asyncpg.RaiseError as exc:
                if "no session" in str(exc):
                    raise SessionNotFound.for_session(session_id) from None
                if "reason" in str(exc):
                    raise InvalidArgument(
                        "a purge needs a non-blank reason", field="reason"
                    ) from None
                raise
        self._forget(session_id)
        return n

    # -- sealing and erasure (store/sealing.py, migration 0013) -----------------------

    @translated
    async def chain_info(self, session_id: str) -> SessionInfo:
        return await self._stored_info(session_id)

    def stored_events(
        self, session_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> AsyncIterator[Event]:
        return self.read_events(session_id, from_seq, to_seq, opened=False)

    @translated
    async def erase(
        self, session_id: str, reason: str, *, actor: str | None = None
    ) -> list[Erasure]:
        """One transaction (``erase_session``): the data key destroyed, the derived rows
        deleted, the audit row written; and the same for every fork standing on the
        session (its prefix was this session's content, opened with the key destroyed
        here, and its materialized rows hold it in clear), each with an audit row of its
        own. Then this store forgets them."""
        target = session_id
        erased = [session_id]
        async with self._lock(session_id):
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    rows = [await conn.fetchrow(_ERASE, session_id, reason, actor)]
                    for fork in await self.descendants(session_id, conn):
                        gone = await conn.fetchval(
                            f"SELECT erased_at FROM {S}.sessions WHERE session_id = $1", fork
                        )
                        if gone is None:
                            target = fork
                            erased.append(fork)
                            why = f"{reason} (a fork of {session_id!r}, erased with it)"
                            rows.append(await conn.fetchrow(_ERASE, fork, why, actor))
            except asyncpg.PostgresError as exc:
                state = getattr(exc, "sqlstate", None)
                if state == "P0002":
                    raise SessionNotFound.for_session(target) from None
                if state == ERASED_STATE:
                    raise _erased(target) from None
                if state == NOT_SEALED_STATE:
                    raise _not_sealed(target) from None
                if state == "22023":
                    raise InvalidArgument(
                        "an erasure needs a non-blank reason", field="reason"
                    ) from None
                raise
            finally:
                for sid in erased:
                    self._forget(sid)
        return [
            Erasure(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7]))
            for r in rows
            if r is not None
        ]

    @translated
    async def erasures(self) -> list[Erasure]:
        rows = await self._pool.fetch(
            f"SELECT session_id, erased_at, erased_by, actor, reason, events, last_hash,"
            f" removed::text FROM {S}.erasures ORDER BY erased_at, session_id"
        )
        return [Erasure(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7])) for r in rows]

    @translated
    async def rotate_keys(self) -> int:
        """Re-wrap every live data key not under the primary KEK (one statement per
        session); returns how many. The old KEK must still be listed to unwrap them."""
        if self._keyring is None:
            raise KeyUnavailable(f"no key-encryption key configured (${KEK_ENV})")
        primary = self._keyring.primary_id
        ids = await self._pool.fetch(
            f"SELECT session_id FROM {S}.session_keys"
            " WHERE kek_id <> $1 AND wrapped_dek IS NOT NULL ORDER BY session_id",
            primary,
        )
        done = 0
        for (session_id,) in ids:
            async with self._pool.acquire() as conn, conn.transaction():
                row = await conn.fetchrow(
                    f"SELECT kek_id, wrapped_dek FROM {S}.session_keys WHERE session_id = $1"
                    " FOR UPDATE",
                    session_id,
                )
                if row is None or row[1] is None or row[0] == primary:
                    continue  # erased, purged or rotated meanwhile
                dek = self._keyring.unwrap(
                    row[0], row[1], tenant=self._tenant, session_id=session_id
                )
                kid, wrapped = self._keyring.wrap(dek, tenant=self._tenant, session_id=session_id)
                await conn.execute(
                    f"UPDATE {S}.session_keys SET kek_id = $2, wrapped_dek = $3,"
                    " rotated_at = now() WHERE session_id = $1",
                    session_id,
                    kid,
                    wrapped,
                )
                done += 1
        return done

    @translated
    async def other_tenant(self) -> str | None:
        """A tenant other than this store's whose sessions its connections see (None:
        row-level security holds them, or there is no other): a superuser's or the
        tables' owner's connection sees every tenant's rows, and an operator's sweep
        over them (retention) would act on all of them as this one's."""
        other: str | None = await self._pool.fetchval(
            f"SELECT tenant_id FROM {S}.sessions WHERE tenant_id <> {S}.current_tenant() LIMIT 1"
        )
        return other

    @translated
    async def purges(self) -> list[dict[str, Any]]:
        """The audit records of every purge: who removed which session, when and why."""
        rows = await self._pool.fetch(
            f"SELECT session_id, purged_at, purged_by, reason, events, last_hash "
            f"FROM {S}.purges ORDER BY purged_at, session_id"
        )
        return [dict(r) for r in rows]

    @translated
    async def close(self) -> None:
        await self._batcher.wait_idle()  # appends already accepted get their answer
        self._closing = True
        await self._warm.aclose()  # (a session's older postings being read: not needed)
        await self.wait_indexed()  # postings a search found missing, stored
        while self._idle:
            self._lent -= 1
            await self._pool.release(self._idle.pop())
        try:
            if self._search_pool is not None:
                await self._search_pool.close()
        finally:
            await self._pool.close()
