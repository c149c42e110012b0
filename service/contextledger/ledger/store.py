"""What every store provides, and the pure steps they share.

A store persists events and keeps the inline projection in step with them. The
decisions (which seq, which hash, what the view becomes, whether an event is
admissible at all) are made by ``advance`` — pure, so the in-memory store and
the PostgreSQL store cannot drift apart.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..errors import InvalidArgument, SeqOutOfRange
from ..events import (
    GENESIS_HASH,
    CompactionApplied,
    Event,
    MessagesReplaced,
    Payload,
    RolledBack,
    SessionCleared,
    SessionCreated,
    SummaryRecorded,
    make_event,
    rehash,
)
from ..projection import State, apply
from ..view import ViewItem


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    created_at: datetime
    model: str | None
    config: Mapping[str, Any]
    metadata: Mapping[str, Any]
    head: int
    last_hash: str
    view_tokens: int
    view_count: int


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    label: str | None
    created_at: datetime


@dataclass(frozen=True)
class AppendResult:
    seqs: tuple[int, ...]
    #: True when an idempotency key matched an earlier append: nothing was written.
    duplicate: bool = False
    view_tokens: int = 0

    @property
    def seq(self) -> int:
        return self.seqs[-1]


@dataclass(frozen=True)
class VerifyReport:
    session_id: str
    ok: bool
    events: int
    first_bad_seq: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class RebuildReport:
    session_id: str
    differences: tuple[str, ...] = ()
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not self.differences


@dataclass(frozen=True)
class Advance:
    events: tuple[Event, ...]
    state: State
    #: The branch was replaced wholesale (set_messages, clear, rollback) rather than added to.
    branch_reset: bool


def _check_admissible(state: State, payload: Payload) -> None:
    """Reject an event the projection could not apply meaningfully; nothing is written."""
    if isinstance(payload, RolledBack):
        if not 1 <= payload.to_seq <= state.head:
            raise SeqOutOfRange(
                f"cannot roll back to seq {payload.to_seq}: the session's seqs run 1..{state.head}",
                seq=payload.to_seq, head=state.head,
            )
    elif isinstance(payload, SummaryRecorded):
        if payload.from_seq > payload.to_seq:
            raise InvalidArgument(f"summary range {payload.from_seq}..{payload.to_seq} is empty")
        covered = [n for n, i in enumerate(state.view)
                   if payload.covers(i.place)]
        if not covered:
            raise InvalidArgument(
                f"summary range {payload.from_seq}..{payload.to_seq} covers no item of the view"
            )
        if covered[-1] - covered[0] + 1 != len(covered):
            raise InvalidArgument(
                f"summary range {payload.from_seq}..{payload.to_seq} is not contiguous in the "
                "view (it would move the items it skips)")
    elif isinstance(payload, CompactionApplied):
        refs = {i.ref for i in state.view}
        missing = [r for r in (*payload.drop, *(p.ref for p in payload.prune)) if r not in refs]
        if missing:
            raise InvalidArgument(f"compaction names refs not in the view: {missing[:5]}")


def advance(
    state: State,
    session_id: str,
    prev_hash: str,
    payloads: Sequence[Payload],
    *,
    created_at: datetime,
    idempotency_key: str | None,
    state_at: Callable[[int], State] | None,
) -> Advance:
    """Turn payloads into hashed events and the state they lead to (pure).

    The idempotency key goes on the last event: it is the one the caller asked for
    (earlier ones, such as synthetic tool results, exist to make it valid).
    """
    events: list[Event] = []
    #: States reached inside this batch: a rollback may target a seq written just before it.
    reached: dict[int, State] = {}

    def at(seq: int) -> State:
        if seq in reached:
            return reached[seq]
        if state_at is None:
            raise ValueError("a rollback needs the state as of its target (state_at)")
        return state_at(seq)

    reset = False
    for i, payload in enumerate(payloads):
        _check_admissible(state, payload)
        key = idempotency_key if i == len(payloads) - 1 else None
        event = make_event(session_id, state.head + 1, payload, prev_hash,
                           created_at=created_at, idempotency_key=key)
        state = apply(state, event, at)
        reached[event.seq] = state
        if isinstance(payload, MessagesReplaced | SessionCleared | RolledBack):
            reset = True
        events.append(event)
        prev_hash = event.hash
    return Advance(tuple(events), state, reset)


def verify_chain(
    session_id: str, events: Iterable[Event], head: int, last_hash: str
) -> VerifyReport:
    """Walk the hash chain; report the first seq whose hash or numbering is wrong."""
    prev = GENESIS_HASH
    count = 0
    for event in events:
        count += 1
        if event.seq != count:
            return VerifyReport(session_id, False, count, count,
                                f"expected seq {count}, found {event.seq} (gap or duplicate)")
        data = event.data if event.data is not None else event.payload.to_data()
        if rehash(event, prev, data) != event.hash:
            return VerifyReport(session_id, False, count, event.seq,
                                "hash mismatch: the event or an earlier one was altered")
        prev = event.hash
    if count != head:
        return VerifyReport(session_id, False, count, min(count, head) + 1,
                            f"session head is {head} but {count} events exist")
    if count and prev != last_hash:
        return VerifyReport(session_id, False, count, count,
                            "session's last_hash does not match the last event")
    return VerifyReport(session_id, True, count)


def view_rows(items: Iterable[ViewItem]) -> list[tuple[Any, ...]]:
    """Comparable form of view items (rebuild's unit of comparison)."""
    return [(i.ord, i.ref, i.kind, dict(i.message), i.tokens, i.critical) for i in items]


def compare_rows(
    expected: Sequence[ViewItem], stored: Sequence[ViewItem], what: str
) -> list[str]:
    exp, got = view_rows(expected), view_rows(stored)
    if exp == got:
        return []
    diffs = [f"{what}: {len(got)} stored rows, {len(exp)} expected"] if len(exp) != len(got) else []
    for e, g in zip(exp, got, strict=False):
        if e != g:
            diffs.append(f"{what}: first difference at ord {e[0]} (stored ord {g[0]}, ref {g[1]})")
            break
    return diffs or [f"{what}: rows differ"]


class Store(abc.ABC):
    """Persistence for sessions, their events and the inline projection."""

    kind: str = "abstract"

    @abc.abstractmethod
    async def create_session(
        self, session_id: str, payload: SessionCreated, *, created_at: datetime
    ) -> SessionInfo: ...

    @abc.abstractmethod
    async def session_info(self, session_id: str) -> SessionInfo: ...

    @abc.abstractmethod
    async def list_sessions(self) -> list[SessionInfo]: ...

    @abc.abstractmethod
    async def append(
        self, session_id: str, payloads: Sequence[Payload], *, created_at: datetime,
        expected_seq: int | None = None, idempotency_key: str | None = None,
    ) -> AppendResult: ...

    @abc.abstractmethod
    async def read_view(self, session_id: str) -> tuple[ViewItem, ...]: ...

    @abc.abstractmethod
    async def read_branch(self, session_id: str) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def read_events(
        self, session_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> AsyncIterator[Event]: ...

    @abc.abstractmethod
    async def checkpoints(self, session_id: str) -> list[Checkpoint]: ...

    @abc.abstractmethod
    async def rebuild(self, session_id: str, *, repair: bool = True) -> RebuildReport: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def verify(self, session_id: str) -> VerifyReport:
        info = await self.session_info(session_id)
        # up to the head we read: a writer appending meanwhile is not "extra events"
        events = [e async for e in self.read_events(session_id, 1, info.head)]
        return verify_chain(session_id, events, info.head, info.last_hash)
