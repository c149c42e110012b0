"""Forks: copy-on-write sessions that read their prefix from their ancestors.

A fork's seqs continue its parent's: seqs 1..s are the parent's events (read by the
parent's id, one statement per session of the lineage, so each names one session), the
fork's own start at s+1 with a ``session.forked`` event pointing at (parent, s, hash).
Every other mixin reads through ``_lineage``.

Sealed sessions fork too: each event is opened with the data key of the session that
holds it (``_opener``), and a fork made with a key-encryption key configured has a data
key of its own. So erasing a session destroys the key its forks' prefix needs, and the
store erases the forks with it (``descendants``): their materialized rows hold plaintext
of that prefix."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg

from contextledger.core.chain import make_event
from contextledger.core.encoding import dumps
from contextledger.core.events import Event, SessionForked
from contextledger.core.projection import fold
from contextledger.core.view import ViewItem
from contextledger.errors import ConcurrencyError, SeqOutOfRange, SessionExists, SessionNotFound
from contextledger.store.base import SessionInfo
from contextledger.store.errors import translated
from contextledger.store.lineage import Lineage, owner_of, segments
from contextledger.store.postgres.statements import (
    EVENT_COLUMNS,
    READ_FORK_VIEW,
    SEGMENT_TAIL,
    S,
    _erased,
    _event,
    _item,
    insert_view,
)
from contextledger.store.postgres.tips import ChainTips
from contextledger.store.sealing import Sealer, is_sealed_message

#: A fork at its parent's head takes the parent's materialized view and branch rows,
#: copied inside the server (through the client, 479 view rows cost a fork ~12 ms).
COPY_VIEW_ROWS = f"""
INSERT INTO {S}.view_items (session_id, gen, ord, seq, part, kind, message, tokens, critical)
SELECT $1, gen, ord, seq, part, kind, message, tokens, critical FROM {S}.view_items
 WHERE session_id = $2 AND gen = $3"""
COPY_BRANCH_ROWS = f"""
INSERT INTO {S}.branch_items (session_id, ord, seq, part)
SELECT $1, ord, seq, part FROM {S}.branch_items WHERE session_id = $2"""


class StaleLineage(ConcurrencyError):
    """A fork's remembered ancestry is not the session's any more (purged and made
    again under its id elsewhere): forgotten here, so a read reads it again, and a
    write in flight fails typed and retryable (a retry finds the session as it is)."""


class Lineages(ChainTips):
    """Each session's ancestry, the reads that follow it, and ``fork_session``."""

    async def _lineage(
        self, session_id: str, conn: asyncpg.Connection | asyncpg.Pool | None = None
    ) -> Lineage:
        """``session_id``'s ancestors, root first: one primary-key read per ancestor the
        first time, then remembered (a fork point never moves)."""
        known = self._lineages.get(session_id)
        if known is not None:
            return known
        db = conn if conn is not None else self._pool
        row = await db.fetchrow(
            f"SELECT parent_session_id, parent_seq FROM {S}.sessions WHERE session_id = $1",
            session_id,
        )
        if row is None:
            raise SessionNotFound.for_session(session_id)
        lineage: Lineage = ()
        if row[0] is not None:
            lineage = (*await self._lineage(row[0], conn), (row[0], row[1]))
        self._lineages[session_id] = lineage
        return lineage

    async def _lineage_events(
        self, conn: asyncpg.Connection, session_id: str, lineage: Lineage, lo: int, hi: int
    ) -> list[Event]:
        """Events ``lo..hi`` of ``session_id`` (a fork's prefix from its ancestors)."""
        out: list[Event] = []
        for owner, a, b in segments(session_id, lineage, lo, hi):
            rows = await conn.fetch(
                f"SELECT {EVENT_COLUMNS} FROM {S}.events WHERE session_id = $1"
                " AND seq BETWEEN $2 AND $3 ORDER BY seq",
                owner,
                a,
                b,
            )
            sealer = await self._opener(owner, conn)
            out.extend(_event(owner, r, sealer) for r in rows)
        return out

    async def _opener(
        self, owner: str, conn: asyncpg.Connection | asyncpg.Pool | None = None
    ) -> Sealer | None:
        """The data key that opens ``owner``'s events (None: written in clear), asked
        afresh for a sealed session (a key another process destroyed opens nothing)."""
        db = conn if isinstance(conn, asyncpg.Connection) else None
        return await self._sealer(owner, conn=db, fresh=True)

    async def descendants(self, session_id: str, conn: asyncpg.Connection) -> list[str]:
        """The forks standing on ``session_id``, theirs, and so on, nearest first (by the
        index on the parent column, a level a statement): what an erasure takes with it.

        Each fork found is locked ``FOR UPDATE`` (by its id: one shard on Citus) before
        the next level is read: a fork being made of it holds it ``FOR SHARE``, so the
        lock waits for that fork to commit and the next read sees it (read unlocked, a
        fork of a fork made meanwhile was missed, left standing on a destroyed key with
        the prefix in its rows)."""
        found: list[str] = []
        level = [session_id]
        while level:
            rows = await conn.fetch(
                f"SELECT session_id FROM {S}.sessions WHERE parent_session_id = ANY($1::text[])"
                " ORDER BY session_id",
                level,
            )
            level = [r[0] for r in rows]
            for fork in level:
                await conn.execute(
                    f"SELECT 1 FROM {S}.sessions WHERE session_id = $1 FOR UPDATE", fork
                )
            found.extend(level)
        return found

    async def _fork_view(
        self, db: asyncpg.Connection | asyncpg.Pool, session_id: str, lineage: Lineage
    ) -> tuple[ViewItem, ...]:
        """A fork's view: its own materialized rows, then the message events after its
        watermark: its own with them (``READ_FORK_VIEW``, one snapshot), the ancestors'
        up to the fork point by each ancestor's id (a fresh fork: two statements)."""
        own = await self._opener(session_id, db)
        rows = await db.fetch(READ_FORK_VIEW, session_id)
        if not rows:
            raise SessionNotFound.for_session(session_id)
        if (rows[0][4], rows[0][5]) != (lineage[-1][0], min(lineage[-1][1], 2**31 - 1)):
            # not the fork this store remembers: the session was purged and made again
            # under the id (by another process); its ancestry is read afresh
            self._lineages.pop(session_id, None)
            raise StaleLineage(
                f"session {session_id!r} was made again under its id since this process"
                " read its ancestry; try again",
                session_id=session_id,
            )
        base = rows[0][1]
        items = [_item(r, own) for r in rows[1:]]
        older: list[ViewItem] = []
        for owner, a, b in segments(session_id, lineage, base + 1, lineage[-1][1]):
            sealer = await self._opener(owner, db)
            older.extend(_item(r, sealer) for r in await db.fetch(SEGMENT_TAIL, owner, a, b))
        if older:
            items = sorted(items + older, key=lambda i: i.ord)
        return tuple(items)

    async def _fork_branch(
        self, conn: asyncpg.Connection, session_id: str, lineage: Lineage
    ) -> list[tuple[int, int, int, Any]]:
        """A fork's branch as ``(ord, seq, part, message JSON text)``: its own rows'
        messages and the message events after its branch watermark, each read from the
        session of its lineage that holds it (and opened with that session's key)."""
        row = await conn.fetchrow(
            f"SELECT branch_base, head FROM {S}.sessions WHERE session_id = $1", session_id
        )
        if row is None:
            raise SessionNotFound.for_session(session_id)
        base, head = row
        refs = await conn.fetch(
            f"SELECT ord, seq, part FROM {S}.branch_items WHERE session_id = $1 ORDER BY ord",
            session_id,
        )
        texts: dict[tuple[int, int], str] = {}
        wanted = sorted({r[1] for r in refs})
        for owner, a, b in segments(session_id, lineage, 1, base):
            seqs = [q for q in wanted if a <= q <= b]
            if not seqs:
                continue
            sealer = await self._opener(owner, conn)
            for r in await conn.fetch(
                f"SELECT e.seq, p.part, p.message::text, e.type FROM {S}.events e,"
                " LATERAL (SELECT 0 AS part, e.data -> 'message' AS message"
                "          WHERE e.type <> 'messages.replaced'"
                "          UNION ALL SELECT (n - 1)::int, m FROM jsonb_array_elements("
                "            CASE WHEN e.type = 'messages.replaced' THEN e.data -> 'messages'"
                "            ELSE '[]'::jsonb END) WITH ORDINALITY AS x(m, n)) p"
                " WHERE e.session_id = $1 AND e.seq = ANY($2::bigint[])",
                owner,
                seqs,
            ):
                replaced = r[3] == "messages.replaced"
                texts[(r[0], r[1])] = _opened_text(sealer, r[0], r[2], r[1] if replaced else None)
        out = [(r[0], r[1], r[2], texts.get((r[1], r[2]))) for r in refs]
        for owner, a, b in segments(session_id, lineage, base + 1, head):
            sealer = await self._opener(owner, conn)
            out.extend(
                (r[0], r[1], 0, _opened_text(sealer, r[1], r[4]))
                for r in await conn.fetch(SEGMENT_TAIL, owner, a, b)
            )
        return out

    @translated
    async def fork_session(
        self,
        session_id: str,
        parent_id: str,
        parent_seq: int,
        *,
        created_at: datetime,
        metadata: Mapping[str, Any],
    ) -> SessionInfo:
        """One transaction: the parent's row read ``FOR SHARE`` (a purge of it waits, and
        then sees the fork), the fork's row and its ``session.forked`` event written.

        At the parent's head the fork takes the parent's watermarks and its materialized
        rows (none until the parent's first compaction, rollback or replacement; at most
        its view after it), copied by one ``INSERT ... SELECT`` each: the messages after
        the watermarks are read from the parent.
        At an earlier seq the parent's rows may have moved on: the view as of that seq is
        folded from the prefix once and materialized for the fork.

        With a key-encryption key configured the fork gets a data key of its own, as a
        new session does; a sealed parent needs one (``KeyUnavailable`` without), and an
        erased one is refused (``SessionErased``).
        """
        lineage = await self._lineage(parent_id)
        await self._opener(parent_id)  # an erased parent, or a sealed one with no KEK: refused
        owner = owner_of(parent_id, lineage, parent_seq)
        if owner != parent_id:  # the seq is an ancestor's event: stand on that ancestor
            return await self.fork_session(
                session_id, owner, parent_seq, created_at=created_at, metadata=metadata
            )
        sealer: Sealer | None = None
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                p = await conn.fetchrow(
                    f"SELECT head, last_hash, model, config::text, view_gen, view_base,"
                    f" branch_base, view_tokens, view_count, erased_at FROM {S}.sessions"
                    " WHERE session_id = $1 FOR SHARE",
                    parent_id,
                )
                if p is None:
                    raise SessionNotFound.for_session(parent_id)
                if p[9] is not None:  # erased since the key was read
                    self._forget(parent_id)
                    raise _erased(parent_id)
                head = p[0]
                if not 1 <= parent_seq <= head:
                    raise SeqOutOfRange(
                        f"cannot fork at seq {parent_seq}: session {parent_id!r} runs 1..{head}",
                        seq=parent_seq,
                        head=head,
                    )
                view: tuple[ViewItem, ...] = ()
                branch_rows: list[tuple[Any, ...]] = []
                copied = False  # at the head: the parent's rows, copied by the server
                if parent_seq == head:
                    prev, model, config = p[1], p[2], json.loads(p[3])
                    gen, view_base, branch_base, tokens, count = p[4], p[5], p[6], p[7], p[8]
                    copied = True
                else:
                    events = await self._lineage_events(conn, parent_id, lineage, 1, parent_seq)
                    state = fold(events)
                    prev, model, config = events[-1].hash, state.model, dict(state.config)
                    gen, view_base = 1, parent_seq
                    branch_base, tokens, count = parent_seq, state.view_tokens, len(state.view)
                    view = state.view
                    branch_rows = [(session_id, i.ord, i.ref[0], i.ref[1]) for i in state.branch]
                sealer = await self._new_key(conn, session_id)
                payload = SessionForked(parent_id, parent_seq, prev, dict(metadata))
                event = make_event(session_id, parent_seq + 1, payload, prev, created_at=created_at)
                await conn.execute(
                    f"INSERT INTO {S}.sessions (session_id, created_at, model, config, metadata,"
                    " head, last_hash, view_gen, view_base, branch_base, view_tokens, view_count,"
                    " parent_session_id, parent_seq)"
                    " VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, $6, $7, $8, $9, $10, $11, $12,"
                    " $13, $14)",
                    session_id,
                    created_at,
                    model,
                    dumps(config),
                    dumps(dict(metadata)),
                    event.seq,
                    event.hash,
                    gen,
                    view_base,
                    branch_base,
                    tokens,
                    count,
                    parent_id,
                    parent_seq,
                )
                await conn.execute(
                    f"INSERT INTO {S}.events (session_id, seq, type, version, data, tokens,"
                    " created_at, hash) VALUES ($1, $2, $3, $4, $5::jsonb, 0, $6, $7)",
                    session_id,
                    event.seq,
                    event.type,
                    event.version,
                    dumps(payload.to_data()),
                    created_at,
                    event.hash,
                )
                if copied:  # one statement each, no row through the client
                    await conn.execute(COPY_VIEW_ROWS, session_id, parent_id, gen)
                    await conn.execute(COPY_BRANCH_ROWS, session_id, parent_id)
                await insert_view(conn, session_id, gen, view)
                if branch_rows:
                    await conn.executemany(
                        f"INSERT INTO {S}.branch_items (session_id, ord, seq, part)"
                        " VALUES ($1, $2, $3, $4)",
                        branch_rows,
                    )
        except asyncpg.UniqueViolationError:
            raise SessionExists(
                f"session {session_id!r} already exists", session_id=session_id
            ) from None
        self._remember_head(session_id, (event.seq, event.hash))
        self._sealers[session_id] = sealer
        self._lineages[session_id] = (*lineage, (parent_id, parent_seq))
        return SessionInfo(
            session_id,
            created_at,
            model,
            config,
            dict(metadata),
            event.seq,
            event.hash,
            tokens,
            count,
            parent=(parent_id, parent_seq),
            sealed=sealer is not None,
        )

    @translated
    async def forks(self, session_id: str) -> list[str]:
        """By the index on the parent column (migration 0012): the one statement here that
        is not about one session, as listing a session's forks cannot be."""
        rows = await self._pool.fetch(
            f"SELECT session_id FROM {S}.sessions WHERE parent_session_id = $1 ORDER BY session_id",
            session_id,
        )
        if not rows:
            await self.session_info(session_id)  # SessionNotFound for an unknown id
        return [r[0] for r in rows]

    async def _fork_branch_seqs(self, session_id: str, lineage: Lineage) -> set[int]:
        """The seqs of a fork's current branch (what a live search's ``_BRANCH_SEQS`` reads
        for a session of its own), to search each session of its lineage as a replay does."""
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            row = await conn.fetchrow(
                f"SELECT branch_base, head FROM {S}.sessions WHERE session_id = $1", session_id
            )
            if row is None:
                raise SessionNotFound.for_session(session_id)
            seqs = {
                r[0]
                for r in await conn.fetch(
                    f"SELECT seq FROM {S}.branch_items WHERE session_id = $1 AND part = 0",
                    session_id,
                )
            }
        seqs.update(range(row[0] + 1, row[1] + 1))
        return seqs


def _opened_text(sealer: Sealer | None, seq: int, text: str, part: int | None = None) -> str:
    """A message's JSON text as read by SQL, opened with ``sealer`` when it is sealed."""
    if sealer is None:
        return text
    message = json.loads(text)
    if not is_sealed_message(message):
        return text
    return dumps(sealer.open_message(seq, message, part=part))
