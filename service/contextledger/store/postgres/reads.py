"""View, branch and event reads of the PostgreSQL store: primary-key range scans."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

from contextledger.core.events import Event
from contextledger.core.units import is_human_turn
from contextledger.core.view import ORD_STRIDE, ViewItem
from contextledger.errors import (
    SessionNotFound,
)
from contextledger.store.base import (
    ViewTail,
)
from contextledger.store.errors import translated, translated_iter
from contextledger.store.lineage import segments
from contextledger.store.postgres.forks import Lineages, StaleLineage
from contextledger.store.postgres.statements import (
    _TAIL_ROW,
    BRANCH_SEQ,
    EVENT_COLUMNS,
    LAST_USERS,
    READ_BRANCH,
    READ_BRANCH_REFS,
    READ_VIEW,
    VIEW_COLUMNS,
    S,
    _erased,
    _event,
    _is_result,
    _item,
)
from contextledger.store.sealing import is_sealed_message


class Reads(Lineages):
    """Reads of the view, its tail, the branch and the events."""

    @translated
    async def read_view(self, session_id: str) -> tuple[ViewItem, ...]:
        lineage = await self._lineage(session_id)
        if lineage:
            try:
                return await self._fork_view(self._pool, session_id, lineage)
            except StaleLineage:  # made again elsewhere: read as it is now
                return await self.read_view(session_id)
        sealer = await self._sealer(session_id, fresh=True)
        rows = await self._pool.fetch(READ_VIEW, session_id)
        if not rows:
            await self.session_info(session_id)  # raises SessionNotFound
        return tuple(_item(r, sealer) for r in rows)

    @translated
    async def read_view_tail(self, session_id: str, max_tokens: int) -> ViewTail:
        """The tail of the view from the end, a page at a time (primary-key range scans):
        O(max_tokens) rows, whatever the history; then the pinned items before it.
        A fork's is cut from its whole view (``read_view``, O(view))."""
        if await self._lineage(session_id):
            return await super().read_view_tail(session_id, max_tokens)
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            row = await conn.fetchrow(
                f"SELECT head, view_tokens, view_gen, view_base, last_hash, erased_at"
                f" FROM {S}.sessions WHERE session_id = $1",
                session_id,
            )
            if row is None:
                raise SessionNotFound.for_session(session_id)
            head, total, gen, base = row[0], row[1], row[2], row[3]
            # The data key as of this snapshot: an erasure sets ``erased_at`` with the
            # key's destruction, so the row says it; the key kept here serves while the
            # chain is the one this store last saw (another writer's head, or a session
            # purged and made again under the id, asks for the key again).
            if row[5] is not None:
                self._forget(session_id)
                raise _erased(session_id)
            if self._heads.get(session_id) != (head, row[4]):
                self._sealers.pop(session_id, None)
            sealer = await self._sealer(session_id, conn=conn)
            got: list[ViewItem] = []  # newest first
            size = 0

            async def older() -> AsyncIterator[ViewItem]:
                cursor = 2**62
                while True:  # message events after the watermark, newest first
                    rows = await conn.fetch(
                        f"SELECT {_TAIL_ROW} FROM {S}.events e WHERE e.session_id = $1"
                        " AND e.seq > $2 AND e.seq < $3 AND e.type = 'message.appended'"
                        " ORDER BY e.seq DESC LIMIT 128",
                        session_id,
                        base,
                        cursor,
                    )
                    for r in rows:
                        yield _item(r, sealer)
                    if len(rows) < 128:
                        break
                    cursor = rows[-1][1]
                cursor = 2**62
                while True:  # then the materialized rows of the current generation
                    rows = await conn.fetch(
                        f"SELECT {VIEW_COLUMNS} FROM {S}.view_items WHERE session_id = $1"
                        " AND gen = $2 AND ord < $3 ORDER BY ord DESC LIMIT 128",
                        session_id,
                        gen,
                        cursor,
                    )
                    for r in rows:
                        yield _item(r)
                    if len(rows) < 128:
                        return
                    cursor = rows[-1][0]

            async for item in older():
                if size + item.tokens > max_tokens and got and not _is_result(got[-1]):
                    break  # full, and the tail does not start inside a tool unit
                got.append(item)
                size += item.tokens
            tail = tuple(reversed(got))
            start = tail[0].ord if tail else 2**62
            # pinned items, then the last few user messages (the latest human turn is
            # among them): both by index, never every message before the tail
            args = (session_id, gen, start, base)
            pinned_rows = await conn.fetch(
                f"SELECT {VIEW_COLUMNS} FROM {S}.view_items WHERE session_id = $1 AND gen = $2"
                " AND ord < $3 AND (critical OR kind = 'summary' OR message ->> 'role' = 'system')"
                f" UNION ALL SELECT {_TAIL_ROW} FROM {S}.events e WHERE e.session_id = $1"
                f" AND e.seq > $4 AND e.seq * {ORD_STRIDE} < $3 AND e.type = 'message.appended'"
                " AND (coalesce((e.data ->> 'critical')::boolean, false)"
                " OR e.data -> 'message' ->> 'role' = 'system')",
                *args,
            )
            user_rows = await conn.fetch(
                f"(SELECT {VIEW_COLUMNS} FROM {S}.view_items WHERE session_id = $1 AND gen = $2"
                " AND ord < $3 AND message ->> 'role' = 'user' ORDER BY ord DESC LIMIT $5)"
                f" UNION ALL (SELECT {_TAIL_ROW} FROM {S}.events e WHERE e.session_id = $1"
                f" AND e.seq > $4 AND e.seq < $3 / {ORD_STRIDE} + 1"
                f" AND e.seq * {ORD_STRIDE} < $3 AND e.type = 'message.appended'"
                " AND e.data -> 'message' ->> 'role' = 'user' ORDER BY e.seq DESC LIMIT $5)"
                " ORDER BY 1 DESC LIMIT $5",
                *args,
                LAST_USERS,
            )
        human = next(
            (i for i in (_item(r, sealer) for r in user_rows) if is_human_turn(i.message)), None
        )  # newest first
        found = {i.ref: i for i in (_item(r, sealer) for r in pinned_rows)}
        if human is not None:
            found.setdefault(human.ref, human)
        pinned = tuple(sorted(found.values(), key=lambda i: i.ord))
        return ViewTail(tail, pinned, total - size, head)

    @translated
    async def read_branch(self, session_id: str) -> list[dict[str, Any]]:
        lineage = await self._lineage(session_id)
        if lineage:
            async with (
                self._pool.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                return [
                    json.loads(r[3]) for r in await self._fork_branch(conn, session_id, lineage)
                ]
        sealer = await self._sealer(session_id, fresh=True)
        rows = await self._pool.fetch(READ_BRANCH, session_id)
        if not rows:
            await self.session_info(session_id)
        messages = [json.loads(r[1]) for r in rows]
        if sealer is None:
            return messages
        return [
            sealer.open_message(r[2], m, part=r[3] if r[4] == "messages.replaced" else None)
            if is_sealed_message(m)
            else m
            for r, m in zip(rows, messages, strict=True)
        ]

    @translated
    async def branch_seq(self, session_id: str, index: int) -> int | None:
        if index < 0:
            return None
        seq = await self._pool.fetchval(BRANCH_SEQ, session_id, index)
        if seq is None:
            await self.session_info(session_id)  # SessionNotFound for an unknown session
        return cast(int | None, seq)

    @translated
    async def branch_seqs(self, session_id: str) -> list[int]:
        lineage = await self._lineage(session_id)
        if lineage:
            async with (
                self._pool.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                rows = await self._fork_branch(conn, session_id, lineage)
        else:
            rows = await self._pool.fetch(READ_BRANCH_REFS, session_id)
            if not rows:
                await self.session_info(session_id)  # SessionNotFound for an unknown session
        return [r[1] for r in rows if r[2] == 0]

    @translated_iter
    async def read_events(
        self,
        session_id: str,
        from_seq: int = 1,
        to_seq: int | None = None,
        *,
        page: int = 2000,
        opened: bool = True,
    ) -> AsyncIterator[Event]:
        # an erased session: SessionErased; each event is opened with the key of the
        # session that holds it (its own, asked once here; an ancestor's, per segment)
        own = await self._opener(session_id) if opened else None
        upper = to_seq if to_seq is not None else 2**62
        lineage = await self._lineage(session_id)
        for owner, lo, hi in segments(session_id, lineage, from_seq, upper):
            if not opened or owner == session_id:
                sealer = own
            else:
                sealer = await self._opener(owner)
            cursor = lo
            while True:
                rows = await self._pool.fetch(
                    f"SELECT {EVENT_COLUMNS} FROM {S}.events WHERE session_id = $1"
                    " AND seq >= $2 AND seq <= $3 ORDER BY seq LIMIT $4",
                    owner,
                    cursor,
                    hi,
                    page,
                )
                for row in rows:
                    yield _event(owner, row, sealer)
                if len(rows) < page:
                    break
                cursor = rows[-1][0] + 1
