"""Per-session state a PostgreSQL store keeps: chain tips, write locks, closed gates.

Appends and the search share it (an append advances a remembered closed gate), so it
lives in one mixin the others build on."""

from __future__ import annotations

import asyncio
import weakref
from typing import NamedTuple

from contextledger.store.postgres.connections import Connections

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

    def _remember_head(self, session_id: str, head: tuple[int, str]) -> None:
        """Note the chain's tip as this store extended it (a miss is one read): the
        oldest noted go first past ``MAX_HEADS``, so a process serving many sessions
        over months holds a bounded map."""
        heads = self._heads
        if session_id not in heads and len(heads) >= MAX_HEADS:
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

    def _advance(self, session_id: str, base: tuple[int, str], tip: tuple[int, str]) -> None:
        """An append through this store linked ``tip`` onto ``base`` (the statement checks the
        link): a remembered closed gate follows the chain only while it is extended here."""
        closed = self._closed.get(session_id)
        if closed is not None:
            if closed.tip == base:
                self._closed[session_id] = closed._replace(tip=tip)
            else:
                del self._closed[session_id]
