"""``memory://``: the same pure core with dicts for tables (tests, graceful degradation).

Events are still hashed and folded exactly as in PostgreSQL, so a session that
degrades to memory behaves the same; it just does not survive the process.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..errors import ConcurrencyError, IdempotencyConflict, SessionExists, SessionNotFound
from ..events import (
    GENESIS_HASH,
    CheckpointCreated,
    Event,
    MessageAppended,
    Payload,
    SessionCreated,
    make_event,
)
from ..projection import State, apply, fold
from ..view import ViewItem
from .store import (
    AppendResult,
    Checkpoint,
    RebuildReport,
    SessionInfo,
    Store,
    advance,
    compare_rows,
)


@dataclass
class _Stream:
    info: SessionInfo
    events: list[Event] = field(default_factory=list)
    state: State = field(default_factory=State)
    keys: dict[str, int] = field(default_factory=dict)


class MemoryStore(Store):
    kind = "memory"

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}

    def _get(self, session_id: str) -> _Stream:
        try:
            return self._streams[session_id]
        except KeyError:
            raise SessionNotFound(f"no session {session_id!r}", session_id=session_id) from None

    async def create_session(
        self, session_id: str, payload: SessionCreated, *, created_at: datetime
    ) -> SessionInfo:
        if session_id in self._streams:
            raise SessionExists(f"session {session_id!r} already exists", session_id=session_id)
        event = make_event(session_id, 1, payload, GENESIS_HASH, created_at=created_at)
        event = replace(event, data=copy.deepcopy(event.payload.to_data()), position=1)
        state = apply(State(), event)
        info = SessionInfo(session_id, created_at, payload.model, payload.config,
                           payload.metadata, 1, event.hash, 0, 0)
        self._streams[session_id] = _Stream(info, [event], state)
        return info

    async def session_info(self, session_id: str) -> SessionInfo:
        return self._get(session_id).info

    async def list_sessions(self) -> list[SessionInfo]:
        return [s.info for s in sorted(self._streams.values(), key=lambda s: s.info.created_at)]

    async def append(
        self, session_id: str, payloads: Sequence[Payload], *, created_at: datetime,
        expected_seq: int | None = None, idempotency_key: str | None = None,
    ) -> AppendResult:
        stream = self._get(session_id)
        if idempotency_key is not None and idempotency_key in stream.keys:
            seq = stream.keys[idempotency_key]
            original = stream.events[seq - 1]
            if original.payload != payloads[-1]:
                raise IdempotencyConflict(
                    f"idempotency key {idempotency_key!r} was used for a different event "
                    f"(seq {seq})", seq=seq)
            return AppendResult((seq,), True, stream.info.view_tokens)
        head = stream.state.head
        if expected_seq is not None and expected_seq != head:
            raise ConcurrencyError(f"expected head {expected_seq}, session is at {head}",
                                   expected_seq=expected_seq, head=head)
        step = advance(
            stream.state, session_id, stream.info.last_hash, payloads, created_at=created_at,
            idempotency_key=idempotency_key,
            state_at=lambda seq: fold(stream.events, until=seq),
        )
        for event in step.events:
            stream.events.append(replace(event, data=copy.deepcopy(event.payload.to_data()),
                                         position=len(stream.events) + 1))
        stream.state = step.state
        if idempotency_key is not None:
            stream.keys[idempotency_key] = step.events[-1].seq
        appended = [p.tokens for p in payloads if isinstance(p, MessageAppended)]
        # a plain append adds to the total; anything else may rewrite the view: recount
        view_tokens = (stream.info.view_tokens + sum(appended) if len(appended) == len(payloads)
                       else step.state.view_tokens)
        stream.info = replace(
            stream.info, head=step.state.head, last_hash=step.events[-1].hash,
            view_tokens=view_tokens, view_count=len(step.state.view),
            config=step.state.config, model=step.state.model,
        )
        return AppendResult(tuple(e.seq for e in step.events), False, stream.info.view_tokens)

    async def read_view(self, session_id: str) -> tuple[ViewItem, ...]:
        return self._get(session_id).state.view

    async def read_branch(self, session_id: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(dict(i.message)) for i in self._get(session_id).state.branch]

    async def read_events(
        self, session_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> AsyncIterator[Event]:
        for event in list(self._get(session_id).events):
            if event.seq >= from_seq and (to_seq is None or event.seq <= to_seq):
                yield event

    async def checkpoints(self, session_id: str) -> list[Checkpoint]:
        return [
            Checkpoint(e.seq, e.payload.label, e.created_at)
            for e in self._get(session_id).events
            if isinstance(e.payload, CheckpointCreated)
        ]

    async def rebuild(self, session_id: str, *, repair: bool = True) -> RebuildReport:
        stream = self._get(session_id)
        expected = fold(stream.events)
        diffs = compare_rows(expected.view, stream.state.view, "view") + compare_rows(
            expected.branch, stream.state.branch, "branch")
        if diffs and repair:
            stream.state = expected
        return RebuildReport(session_id, tuple(diffs), bool(diffs) and repair)

    async def close(self) -> None:
        self._streams.clear()

    # Test seam for the in-memory store only: lets tests corrupt the projection to
    # prove rebuild notices (there is no SQL to do it with here).
    def _corrupt_view_for_tests(self, session_id: str, view: tuple[ViewItem, ...]) -> None:
        stream = self._get(session_id)
        stream.state = replace(stream.state, view=view)
