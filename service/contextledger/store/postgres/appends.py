"""Appends to the PostgreSQL store: one statement per message (batched across sessions),
one per run of messages, one transaction for everything else.

Appending a message is a single statement: a conditional ``UPDATE sessions ...
WHERE head = seq - 1`` feeding the INSERTs of the event and its view and branch
rows. If another writer advanced the head first, the UPDATE matches nothing, so
nothing is inserted; we re-read the head and retry (or raise
``ConcurrencyError`` when the caller pinned ``expected_seq``). Appends to
different sessions touch different rows only: no table locks, no counters.

Everything else (summaries, compactions, rollbacks, set_messages) is a cold
path: one transaction that locks the session row, loads the view (O(view)),
runs the pure ``record_events`` and writes the difference.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import asyncpg

from contextledger.core.chain import Seal, make_event
from contextledger.core.encoding import dumps
from contextledger.core.events import Event, MessageAppended, Payload
from contextledger.core.projection import (
    ViewState,
    check_append_target,
    fold,
    record_events,
)
from contextledger.core.view import ViewItem
from contextledger.errors import (
    ConcurrencyError,
    IdempotencyConflict,
    SessionNotFound,
)
from contextledger.store.base import (
    AppendResult,
)
from contextledger.store.batching import AppendBatcher
from contextledger.store.errors import translated
from contextledger.store.lineage import owner_of
from contextledger.store.postgres.connections import _idempotency_violation
from contextledger.store.postgres.forks import Lineages
from contextledger.store.postgres.statements import (
    _RETRIES,
    APPEND_MESSAGE,
    APPEND_MESSAGE_CALL,
    APPEND_MESSAGES,
    APPEND_MESSAGES_CALL,
    APPEND_SESSION_MESSAGES,
    APPEND_SESSION_MESSAGES_CALL,
    EVENT_COLUMNS,
    READ_VIEW,
    S,
    _erased,
    _event,
    _item,
    _stored,
    insert_view,
)
from contextledger.store.postgres.warm import Appended, lexed


class Appends(Lineages):
    """The three append paths and the view writes they share with ``rebuild``."""

    _batcher: AppendBatcher
    _call_appends: bool  # the append functions, not the statements (Citus, PgBouncer)

    async def _append_one(self, row: tuple[Any, ...]) -> Appended | None:
        if self._call_appends:  # (the functions take the first nine: nothing is lexed)
            tokens = await self._hot(lambda conn: conn.fetchval(APPEND_MESSAGE_CALL, *row[:9]))
            return None if tokens is None else (tokens, None)
        record = await self._hot(lambda conn: conn.fetchrow(APPEND_MESSAGE, *row))
        return None if record is None else (record[0], lexed(row[10], record[1:]))

    async def _append_many(self, rows: Sequence[tuple[Any, ...]]) -> dict[str, Appended]:
        columns = [list(c) for c in zip(*rows, strict=True)]
        if self._call_appends:
            records = await self._hot(lambda conn: conn.fetch(APPEND_MESSAGES_CALL, *columns[:9]))
            return {r[0]: (r[1], None) for r in records}
        records = await self._hot(lambda conn: conn.fetch(APPEND_MESSAGES, *columns))
        asked = {row[0]: row for row in rows}
        return {r[0]: (r[1], lexed(asked[r[0]][10], r[2:])) for r in records}

    def _lexes(self, session_id: str, seal: Seal | None, count: int) -> bool:
        """Whether an append of ``count`` messages computes their postings for recall
        (``warm.py``): a session searched here, in clear, on a server the statements
        reach (not the append functions), unless its searches are skipped (``_closed``)."""
        return (
            seal is None
            and not self._call_appends
            and session_id not in self._closed
            and self._warm.lexes(session_id, count)
        )

    @translated
    async def append(
        self,
        session_id: str,
        payloads: Sequence[Payload],
        *,
        created_at: datetime,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
        known: tuple[int, str] | None = None,
    ) -> AppendResult:
        async with self._lock(session_id):
            if len(payloads) == 1 and isinstance(payloads[0], MessageAppended):
                return await self._append_message(
                    session_id, payloads[0], created_at, expected_seq, idempotency_key, known
                )
            if payloads and all(isinstance(p, MessageAppended) for p in payloads):
                return await self._append_messages(
                    session_id, payloads, created_at, expected_seq, idempotency_key, known
                )
            return await self._append_general(
                session_id, payloads, created_at, expected_seq, idempotency_key, known
            )

    async def _check_target(
        self,
        conn: asyncpg.Connection | asyncpg.Pool,
        session_id: str,
        head: int,
        last_hash: str,
        known: tuple[int, str] | None,
        expected_seq: int | None,
    ) -> None:
        """The shared pure decision (``check_append_target``) with the stored hash it needs."""
        at = None
        if known is not None and known != (head, last_hash) and 0 < known[0] <= head:
            lineage = await self._lineage(session_id)
            at = await conn.fetchval(
                f"SELECT hash FROM {S}.events WHERE session_id = $1 AND seq = $2",
                owner_of(session_id, lineage, known[0]),
                known[0],
            )
        check_append_target(
            session_id,
            head=head,
            last_hash=last_hash,
            known=known,
            hash_at_known=at,
            expected_seq=expected_seq,
        )

    async def _append_message(
        self,
        session_id: str,
        payload: MessageAppended,
        created_at: datetime,
        expected_seq: int | None,
        key: str | None,
        known: tuple[int, str] | None,
    ) -> AppendResult:
        head, last_hash = await self._head(session_id)
        checked: tuple[int, str] | None = None  # the chain state last found admissible
        for _ in range(_RETRIES):
            if (head, last_hash) != checked and (
                (known is not None and known != (head, last_hash))
                or (expected_seq is not None and expected_seq != head)
            ):
                if checked is None:  # the cached head may be stale: decide on the stored one
                    head, last_hash = await self._head(session_id, fresh=True)
                if (
                    expected_seq is not None
                    and expected_seq != head
                    and key is not None
                    and await self._pool.fetchval(
                        f"SELECT 1 FROM {S}.events WHERE session_id = $1 AND idempotency_key = $2",
                        session_id,
                        key,
                    )
                ):
                    return await self._duplicate(session_id, key, payload.to_data())
                await self._check_target(
                    self._pool, session_id, head, last_hash, known, expected_seq
                )
                checked = (head, last_hash)
            seal = await self._seal(session_id)  # kept: a dict lookup; fresh after a move
            event = make_event(
                session_id,
                head + 1,
                payload,
                last_hash,
                created_at=created_at,
                idempotency_key=key,
                seal=seal,
            )
            data_json = event.encoded.decode() if event.encoded is not None else _stored(event)
            lex = self._lexes(session_id, seal, 1)
            try:
                appended = await self._batcher.submit(
                    (
                        session_id,
                        event.seq,
                        event.version,
                        data_json,
                        event.tokens,
                        created_at,
                        key,
                        event.hash,
                        last_hash,
                        lex,
                        self._warm.queries(session_id, [payload.message])[0] if lex else None,
                    )
                )
            except asyncpg.UniqueViolationError as exc:
                if key is not None and _idempotency_violation(exc):
                    return await self._duplicate(session_id, key, payload.to_data())
                raise
            except asyncpg.ForeignKeyViolationError:
                raise SessionNotFound.for_session(session_id) from None
            except asyncpg.DeadlockDetectedError:  # our one row lock queued behind a cycle
                appended = None
            if appended is not None:
                view_tokens, lexemes = appended
                self._remember_head(session_id, (event.seq, event.hash))
                self._advance(session_id, (head, last_hash), (event.seq, event.hash), lexemes)
                return AppendResult((event.seq,), False, view_tokens, event.hash)
            # The head moved under us (another process) or the session is gone.
            head, last_hash = await self._head(session_id, fresh=True)
        raise ConcurrencyError(f"gave up appending to {session_id!r} after {_RETRIES} tries")

    async def _append_messages(
        self,
        session_id: str,
        payloads: Sequence[Payload],
        created_at: datetime,
        expected_seq: int | None,
        key: str | None,
        known: tuple[int, str] | None,
    ) -> AppendResult:
        """Many messages, one statement: the conditional head UPDATE (head and last hash,
        so the chain is pinned) gates every INSERT."""
        head, last_hash = await self._head(session_id)
        for _ in range(_RETRIES):
            if known is not None and known != (head, last_hash):
                head, last_hash = await self._head(session_id, fresh=True)
                await self._check_target(
                    self._pool, session_id, head, last_hash, known, expected_seq
                )
            if expected_seq is not None and expected_seq != head:
                head, last_hash = await self._head(session_id, fresh=True)
                if expected_seq != head:
                    if key is not None and await self._pool.fetchval(
                        f"SELECT 1 FROM {S}.events WHERE session_id = $1 AND idempotency_key = $2",
                        session_id,
                        key,
                    ):
                        return await self._duplicate(session_id, key, payloads[-1].to_data())
                    raise ConcurrencyError(
                        f"expected head {expected_seq}, session {session_id!r} is at {head}",
                        expected_seq=expected_seq,
                        head=head,
                    )
            events: list[Event] = []
            prev = last_hash
            seal = await self._seal(session_id)
            for n, payload in enumerate(payloads):
                event = make_event(
                    session_id,
                    head + 1 + n,
                    payload,
                    prev,
                    created_at=created_at,
                    idempotency_key=key if n == len(payloads) - 1 else None,
                    seal=seal,
                )
                events.append(event)
                prev = event.hash
            lex = self._lexes(session_id, seal, len(payloads))
            messages = [cast(MessageAppended, p).message for p in payloads]
            queries = self._warm.queries(session_id, messages) if lex else []
            values = [
                session_id,
                head,
                [e.seq for e in events],
                [e.version for e in events],
                [e.encoded.decode() if e.encoded is not None else _stored(e) for e in events],
                [e.tokens for e in events],
                created_at,
                [e.hash for e in events],
                prev,
                sum(e.tokens for e in events),
                [e.idempotency_key for e in events],
                last_hash,
            ]
            rows: list[Any]  # (view_tokens, seq, lexemes, tfs, query lexemes)
            try:
                if self._call_appends:
                    tokens = await self._pool.fetchval(APPEND_SESSION_MESSAGES_CALL, *values)
                    rows = [] if tokens is None else [(tokens, None, None, None, None)]
                else:
                    rows = await self._pool.fetch(APPEND_SESSION_MESSAGES, *values, lex, queries)
            except asyncpg.UniqueViolationError as exc:
                if key is not None and _idempotency_violation(exc):
                    return await self._duplicate(session_id, key, payloads[-1].to_data())
                raise
            if rows:
                view_tokens = rows[0][0]
                got = {r[1]: lexed(queries[r[1] - head - 1], r[2:5]) for r in rows if r[1]}
                self._remember_head(session_id, (events[-1].seq, events[-1].hash))
                at = (head, last_hash)
                for event in events:  # linked one by one, as appended
                    self._advance(session_id, at, (event.seq, event.hash), got.get(event.seq))
                    at = (event.seq, event.hash)
                return AppendResult(tuple(e.seq for e in events), False, view_tokens, prev)
            head, last_hash = await self._head(session_id, fresh=True)
        raise ConcurrencyError(f"gave up appending to {session_id!r} after {_RETRIES} tries")

    async def _duplicate(self, session_id: str, key: str, data: dict[str, Any]) -> AppendResult:
        row = await self._pool.fetchrow(
            f"SELECT seq, data::text FROM {S}.events WHERE session_id = $1"
            " AND idempotency_key = $2",
            session_id,
            key,
        )
        assert row is not None
        sealer = await self._sealer(session_id)
        stored = json.loads(row[1])
        if sealer is not None:
            stored = sealer.open(row[0], "message.appended", stored)
        if stored != data:
            raise IdempotencyConflict(
                f"idempotency key {key!r} was used for a different event (seq {row[0]})", seq=row[0]
            )
        tokens = await self._pool.fetchval(
            f"SELECT view_tokens FROM {S}.sessions WHERE session_id = $1", session_id
        )
        return AppendResult((row[0],), True, tokens)

    async def _append_general(
        self,
        session_id: str,
        payloads: Sequence[Payload],
        created_at: datetime,
        expected_seq: int | None,
        key: str | None,
        known: tuple[int, str] | None,
    ) -> AppendResult:
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT head, last_hash, model, config::text, view_gen, view_base, branch_base,"
                f" erased_at FROM {S}.sessions WHERE session_id = $1 FOR UPDATE",
                session_id,
            )
            if row is None:
                raise SessionNotFound.for_session(session_id)
            if row[7] is not None:
                self._forget(session_id)
                raise _erased(session_id)
            sealer = await self._sealer(session_id, conn=conn, fresh=True)
            head, last_hash = row[0], row[1]
            if key is not None:
                dup = await conn.fetchrow(
                    f"SELECT seq, data::text, type FROM {S}.events WHERE session_id = $1"
                    " AND idempotency_key = $2",
                    session_id,
                    key,
                )
                if dup is not None:
                    was = json.loads(dup[1])
                    if sealer is not None:
                        was = sealer.open(dup[0], dup[2], was)
                    if was != payloads[-1].to_data():
                        raise IdempotencyConflict(
                            f"idempotency key {key!r} was used for a different event "
                            f"(seq {dup[0]})",
                            seq=dup[0],
                        )
                    return AppendResult((dup[0],), True)
            await self._check_target(conn, session_id, head, last_hash, known, expected_seq)
            lineage = await self._lineage(session_id, conn)
            if lineage:  # each part opened with its own session's key
                view = await self._fork_view(conn, session_id, lineage)
            else:
                view = tuple(_item(r, sealer) for r in await conn.fetch(READ_VIEW, session_id))
            state = ViewState(head=head, view=view, model=row[2], config=json.loads(row[3]))
            history: list[Event] | None = None

            def state_at(seq: int) -> ViewState:
                assert history is not None
                return fold(history, until=seq)

            if any(p.TYPE == "session.rolled_back" for p in payloads):
                history = (
                    await self._lineage_events(conn, session_id, lineage, 1, head)
                    if lineage
                    else [
                        _event(session_id, r, sealer)
                        for r in await conn.fetch(
                            f"SELECT {EVENT_COLUMNS} FROM {S}.events"
                            " WHERE session_id = $1 ORDER BY seq",
                            session_id,
                        )
                    ]
                )
            step = record_events(
                state,
                session_id,
                last_hash,
                payloads,
                created_at=created_at,
                idempotency_key=key,
                state_at=state_at if history else None,
                seal=sealer.seal if sealer is not None else None,
            )
            await conn.executemany(
                f"INSERT INTO {S}.events (session_id, seq, type, version, data, tokens,"
                " created_at, idempotency_key, hash) VALUES ($1,$2,$3,$4,$5::jsonb,$6,$7,$8,$9)",
                [
                    (
                        session_id,
                        e.seq,
                        e.type,
                        e.version,
                        _stored(e),
                        e.tokens,
                        e.created_at,
                        e.idempotency_key,
                        e.hash,
                    )
                    for e in step.events
                ],
            )
            last = step.events[-1]
            gen, view_base = await self._write_view(
                conn, session_id, row[4], row[5], last.seq, view, step.state.view, step.events
            )
            branch_base = row[6]
            if step.branch_reset:
                await conn.execute(
                    f"DELETE FROM {S}.branch_items WHERE session_id = $1", session_id
                )
                await conn.executemany(
                    f"INSERT INTO {S}.branch_items (session_id, ord, seq, part)"
                    " VALUES ($1, $2, $3, $4)",
                    [(session_id, i.ord, i.ref[0], i.ref[1]) for i in step.state.branch],
                )
                branch_base = last.seq
            await conn.execute(
                f"UPDATE {S}.sessions SET head = $2, last_hash = $3, view_tokens = $4,"
                " view_count = $5, config = $6::jsonb, model = $7, view_gen = $8,"
                " view_base = $9, branch_base = $10 WHERE session_id = $1",
                session_id,
                last.seq,
                last.hash,
                step.state.view_tokens,
                len(step.state.view),
                dumps(dict(step.state.config)),
                step.state.model,
                gen,
                view_base,
                branch_base,
            )
        self._remember_head(session_id, (last.seq, last.hash))
        self._closed.pop(session_id, None)  # not a message: the gate is probed again
        return AppendResult(
            tuple(e.seq for e in step.events), False, step.state.view_tokens, last.hash
        )

    @staticmethod
    async def _write_view(
        conn: asyncpg.Connection,
        session_id: str,
        gen: int,
        base: int,
        head: int,
        old: Sequence[ViewItem],
        new: Sequence[ViewItem],
        events: Sequence[Event],
    ) -> tuple[int, int]:
        """Bring the stored view from ``old`` to ``new``; return (generation, watermark).

        If the new view is the old one plus this batch's appended messages, those
        are already its implicit tail: nothing to write. Otherwise the whole view is
        materialized under the next generation (the old one deleted, its dead rows
        outside the range reads scan) and the watermark moves to ``head``.
        """
        appended = {e.seq for e in events if isinstance(e.payload, MessageAppended)}
        grown = new[len(old) :]
        if (
            len(new) >= len(old)
            and tuple(new[: len(old)]) == tuple(old)
            and all(i.seq in appended and i.ref[1] == 0 for i in grown)
        ):
            return gen, base
        await conn.execute(
            f"DELETE FROM {S}.view_items WHERE session_id = $1 AND gen = $2", session_id, gen
        )
        await insert_view(conn, session_id, gen + 1, new)
        return gen + 1, head

    # -- reads ------------------------------------------------------------------------
