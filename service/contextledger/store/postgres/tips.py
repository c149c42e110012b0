"""Per-session state a PostgreSQL store keeps: chain tips, write locks, closed gates.

Appends and the search share it (an append advances a remembered closed gate), so it
lives in one mixin the others build on."""

from __future__ import annotations

import asyncio
import weakref
from typing import NamedTuple

import asyncpg

from contextledger.core.chain import Seal
from contextledger.errors import KeyUnavailable
from contextledger.store.lineage import Lineage
from contextledger.store.postgres.connections import Connections
from contextledger.store.postgres.statements import S, _erased
from contextledger.store.postgres.warm import Lexed, WarmIndexes
from contextledger.store.sealing import KEK_ENV, KEK_FILE_ENV, KeyRing, Sealer

#: Chain tips remembered (``_remember_head``): ~200 bytes each.
MAX_HEADS = 65536


class _ClosedGate(NamedTuple):
    """A live search whose gate found nothing left out, remembered by the store."""

    seq: int  # the seq that search was taken at
    gaps: frozenset[int]  # the seqs it left out (none a branch message)
    tip: tuple[int, str]  # (seq, hash) of the chain as this store has extended it since


class ChainTips(Connections):
    """The chain tips this store extended, its per-session locks, the closed-gate memo."""

    _heads: dict[str, tuple[int, str]]
    _locks: weakref.WeakValueDictionary[str, asyncio.Lock]
    _closed: dict[str, _ClosedGate]
    _warm: WarmIndexes
    #: KEKs that wrap new sessions' data keys, the tenant that binds them, and each
    #: session's sealer as appends last used it (None: written in clear)
    _keyring: KeyRing | None
    _tenant: str
    _sealers: dict[str, Sealer | None]
    _lineages: dict[str, Lineage]

    def _remember_head(self, session_id: str, head: tuple[int, str]) -> None:
        """Note the chain's tip as this store extended it (a miss is one read, and the
        next request of the session catches its postings up): the least recently noted
        go first past ``MAX_HEADS``, so a process serving many sessions over months holds
        a bounded map and its busiest sessions stay in it."""
        heads = self._heads
        if heads.pop(session_id, None) is None and len(heads) >= MAX_HEADS:
            del heads[next(iter(heads))]
        heads[session_id] = head

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    # -- sessions ---------------------------------------------------------------------

    async def _head(self, session_id: str, *, fresh: bool = False) -> tuple[int, str]:
        cached = None if fresh else self._heads.get(session_id)
        if cached is None:
            info = await self.session_info(session_id)
            cached = (info.head, info.last_hash)
        return cached

    def _advance(
        self,
        session_id: str,
        base: tuple[int, str],
        tip: tuple[int, str],
        lexed: Lexed | None = None,
    ) -> None:
        """An append through this store linked ``tip`` onto ``base`` (the statement checks the
        link): a remembered closed gate follows the chain only while it is extended here,
        and so do the postings held of the session (``WarmIndexes.appended``: ``lexed``,
        what the append computed of them; None, a gap they catch up over)."""
        closed = self._closed.get(session_id)
        if closed is not None:
            if closed.tip == base:
                self._closed[session_id] = closed._replace(tip=tip)
            else:
                del self._closed[session_id]
        self._warm.appended(session_id, base, tip, lexed)

    # -- sealing and erasure (store/sealing.py, migration 0013) -----------------------

    def _forget(self, session_id: str) -> None:
        """Drop what this store keeps of a session (head, gate, data key, postings)."""
        self._warm.forget(session_id)
        self._heads.pop(session_id, None)
        self._closed.pop(session_id, None)
        self._sealers.pop(session_id, None)
        self._lineages.pop(session_id, None)

    async def _seal(self, session_id: str) -> Seal | None:
        sealer = await self._sealer(session_id)
        return sealer.seal if sealer is not None else None

    async def _new_key(self, conn: asyncpg.Connection, session_id: str) -> Sealer | None:
        """With a KEK configured, a data key for a new session (a fork too), its wrapped
        form stored in the caller's transaction (a taken id fails on the key's primary
        key as on the session's); None without a KEK."""
        if self._keyring is None:
            return None
        sealer, kid, wrapped = self._keyring.new_key(tenant=self._tenant, session_id=session_id)
        await conn.execute(
            f"INSERT INTO {S}.session_keys (session_id, kek_id, wrapped_dek) VALUES ($1, $2, $3)",
            session_id,
            kid,
            wrapped,
        )
        return sealer

    async def _sealer(
        self,
        session_id: str,
        *,
        conn: asyncpg.Connection | None = None,
        fresh: bool = False,
    ) -> Sealer | None:
        """The session's data key, unwrapped (None: written in clear). Appends use the
        one kept here (the statement itself refuses an erased session); reads of a sealed
        session ask again (``fresh``), so a key another process destroyed opens nothing."""
        if session_id in self._sealers and not (fresh and self._sealers[session_id] is not None):
            return self._sealers[session_id]
        row = await (conn or self._pool).fetchrow(
            f"SELECT kek_id, wrapped_dek FROM {S}.session_keys WHERE session_id = $1",
            session_id,
        )
        if row is None:
            sealer = None
        elif row[1] is None:
            self._forget(session_id)
            raise _erased(session_id)
        elif self._keyring is None:
            raise KeyUnavailable(
                f"session {session_id!r} is sealed and no key-encryption key is configured "
                f"(${KEK_ENV} or ${KEK_FILE_ENV})",
                session_id=session_id,
            )
        else:
            dek = self._keyring.unwrap(row[0], row[1], tenant=self._tenant, session_id=session_id)
            sealer = Sealer(dek, self._tenant, session_id)
        self._sealers[session_id] = sealer
        return sealer
