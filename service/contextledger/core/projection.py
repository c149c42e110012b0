"""The one pure fold ``events -> ViewState`` used by the inline projection and by replay.

``ViewState.branch`` is the current branch's messages (what ``get_messages`` returns:
summaries and compactions not applied); ``ViewState.view`` is the working view the
next request is built from. ``view_at(seq)`` is simply ``fold(events[:seq])``.

Rollback needs the state as of an earlier seq. ``fold`` keeps a snapshot at every
seq some later rollback targets (found in a first pass), so replay stays one
forward pass however rollbacks nest. Incremental callers pass ``state_at``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from contextledger.core.chain import Seal, make_event
from contextledger.core.events import (
    CheckpointCreated,
    CompactionApplied,
    ConfigChanged,
    Event,
    MessageAppended,
    MessagesReplaced,
    ModelChanged,
    Payload,
    RolledBack,
    SessionCleared,
    SessionCreated,
    SessionForked,
    SummaryRecorded,
)
from contextledger.core.view import ORD_STRIDE, ViewItem
from contextledger.errors import ConcurrencyError, InvalidArgument, SeqOutOfRange, SessionNotFound


@dataclass(frozen=True)
class ViewState:
    head: int = 0
    branch: tuple[ViewItem, ...] = ()
    view: tuple[ViewItem, ...] = ()
    model: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    counter: str = ""

    @property
    def view_tokens(self) -> int:
        return sum(item.tokens for item in self.view)


StateAt = Callable[[int], ViewState]


def message_item(seq: int, payload: MessageAppended) -> ViewItem:
    """The view item a ``message.appended`` event contributes (shared with the SQL fast path)."""
    synthetic = payload.origin == "synthetic"
    return ViewItem(
        ref=(seq, 0),
        ord=seq * ORD_STRIDE,
        message=payload.message,
        tokens=payload.tokens,
        critical=payload.critical,
        kind="synthetic" if synthetic else "message",
    )


def _replace_items(seq: int, payload: MessagesReplaced) -> tuple[ViewItem, ...]:
    return tuple(
        ViewItem(ref=(seq, i), ord=seq * ORD_STRIDE + i, message=m, tokens=t)
        for i, (m, t) in enumerate(zip(payload.messages, payload.tokens, strict=True))
    )


def _summarize(view: tuple[ViewItem, ...], seq: int, p: SummaryRecorded) -> tuple[ViewItem, ...]:
    out: list[ViewItem] = []
    slot: int | None = None
    first_ord: int | None = None
    for item in view:
        if p.covers(item.place):
            if slot is None:
                slot, first_ord = len(out), item.ord
            continue
        out.append(item)
    summary = ViewItem(
        ref=(seq, 0),
        ord=first_ord if first_ord is not None else seq * ORD_STRIDE,
        message=p.message,
        tokens=p.tokens,
        kind="summary",
    )
    out.insert(len(out) if slot is None else slot, summary)
    return tuple(out)


def _compact(view: tuple[ViewItem, ...], p: CompactionApplied) -> tuple[ViewItem, ...]:
    dropped = set(p.drop)
    pruned = {pr.ref: pr for pr in p.prune}
    out: list[ViewItem] = []
    for item in view:
        if item.ref in dropped:
            continue
        pr = pruned.get(item.ref)
        out.append(item if pr is None else replace(item, message=pr.message, tokens=pr.tokens))
    return tuple(out)


def apply(state: ViewState, event: Event, state_at: StateAt | None = None) -> ViewState:
    """The state right after ``event``; pure."""
    p: Payload = event.payload
    seq = event.seq
    if isinstance(p, MessageAppended):
        item = message_item(seq, p)
        return replace(state, head=seq, branch=(*state.branch, item), view=(*state.view, item))
    if isinstance(p, SummaryRecorded):
        return replace(state, head=seq, view=_summarize(state.view, seq, p))
    if isinstance(p, CompactionApplied):
        return replace(state, head=seq, view=_compact(state.view, p))
    if isinstance(p, MessagesReplaced):
        items = _replace_items(seq, p)
        counter = p.counter or state.counter
        return replace(state, head=seq, branch=items, view=items, counter=counter)
    if isinstance(p, SessionCleared):
        return replace(state, head=seq, branch=(), view=())
    if isinstance(p, CheckpointCreated | SessionForked):
        return replace(state, head=seq)
    if isinstance(p, RolledBack):
        if state_at is None:
            raise ValueError("a rollback needs the state as of its target (state_at)")
        return replace(state_at(p.to_seq), head=seq)
    if isinstance(p, SessionCreated):
        return ViewState(head=seq, model=p.model, config=p.config)
    if isinstance(p, ConfigChanged):
        return replace(state, head=seq, config=p.config)
    if isinstance(p, ModelChanged):
        counts = dict(p.recount)
        view = tuple(replace(i, tokens=counts[i.ref]) if i.ref in counts else i for i in state.view)
        return replace(state, head=seq, model=p.model, counter=p.counter, view=view)
    raise TypeError(f"no projection rule for {type(p).__name__}")


def rollback_targets(events: Iterable[Event]) -> set[int]:
    return {e.payload.to_seq for e in events if isinstance(e.payload, RolledBack)}


def fold(events: Sequence[Event], until: int | None = None) -> ViewState:
    """Fold ``events`` (ordered by seq, from 1) into the state right after ``until``."""
    targets = rollback_targets(events)
    snapshots: dict[int, ViewState] = {}
    state = ViewState()
    for event in events:
        if until is not None and event.seq > until:
            break
        state = apply(state, event, snapshots.__getitem__)
        if event.seq in targets:
            snapshots[event.seq] = state
    return state


def view_at(events: Sequence[Event], seq: int) -> tuple[ViewItem, ...]:
    """The working view right after ``seq``."""
    return fold(events, until=seq).view


# -- recording: payloads -> hashed events and the state they lead to


@dataclass(frozen=True)
class Recorded:
    events: tuple[Event, ...]
    state: ViewState
    #: The branch was replaced wholesale (set_messages, clear, rollback) rather than added to.
    branch_reset: bool


#: The code of the refusals of a summary or compaction whose items the view no longer holds
#: as named: a caller's mistake, or the view changed since they were read (the compactor's
#: plans are made from its own read: for them, another writer compacted or rolled back).
NOT_IN_VIEW = "NOT_IN_VIEW"


def _check_admissible(state: ViewState, payload: Payload) -> None:
    """Reject an event the projection could not apply meaningfully; nothing is written."""
    if isinstance(payload, RolledBack):
        if not 1 <= payload.to_seq <= state.head:
            raise SeqOutOfRange(
                f"cannot roll back to seq {payload.to_seq}: the session's seqs run 1..{state.head}",
                seq=payload.to_seq,
                head=state.head,
            )
    elif isinstance(payload, SummaryRecorded):
        if payload.from_seq > payload.to_seq:
            raise InvalidArgument(f"summary range {payload.from_seq}..{payload.to_seq} is empty")
        covered = [n for n, i in enumerate(state.view) if payload.covers(i.place)]
        if not covered:
            raise InvalidArgument(
                f"summary range {payload.from_seq}..{payload.to_seq} covers no item of the view",
                code=NOT_IN_VIEW,
            )
        if covered[-1] - covered[0] + 1 != len(covered):
            raise InvalidArgument(
                f"summary range {payload.from_seq}..{payload.to_seq} is not contiguous in the "
                "view (it would move the items it skips)",
                code=NOT_IN_VIEW,
            )
    elif isinstance(payload, CompactionApplied):
        refs = {i.ref for i in state.view}
        missing = [r for r in (*payload.drop, *(p.ref for p in payload.prune)) if r not in refs]
        if missing:
            raise InvalidArgument(
                f"compaction names refs not in the view: {missing[:5]}", code=NOT_IN_VIEW
            )


def record_events(
    state: ViewState,
    session_id: str,
    prev_hash: str,
    payloads: Sequence[Payload],
    *,
    created_at: datetime,
    idempotency_key: str | None,
    state_at: Callable[[int], ViewState] | None,
    seal: Seal | None = None,
) -> Recorded:
    """Turn payloads into hashed events and the state they lead to (pure).

    The idempotency key goes on the last event: it is the one the caller asked for
    (earlier ones, such as synthetic tool results, exist to make it valid).
    """
    events: list[Event] = []
    #: States reached inside this batch: a rollback may target a seq written just before it.
    reached: dict[int, ViewState] = {}

    def at(seq: int) -> ViewState:
        if seq in reached:
            return reached[seq]
        if state_at is None:
            raise ValueError("a rollback needs the state as of its target (state_at)")
        return state_at(seq)

    reset = False
    for i, payload in enumerate(payloads):
        _check_admissible(state, payload)
        key = idempotency_key if i == len(payloads) - 1 else None
        event = make_event(
            session_id,
            state.head + 1,
            payload,
            prev_hash,
            created_at=created_at,
            idempotency_key=key,
            seal=seal,
        )
        state = apply(state, event, at)
        reached[event.seq] = state
        if isinstance(payload, MessagesReplaced | SessionCleared | RolledBack):
            reset = True
        events.append(event)
        prev_hash = event.hash
    return Recorded(tuple(events), state, reset)


def view_rows(items: Iterable[ViewItem]) -> list[tuple[Any, ...]]:
    """Comparable form of view items (rebuild's unit of comparison)."""
    return [(i.ord, i.ref, i.kind, dict(i.message), i.tokens, i.critical) for i in items]


def compare_rows(expected: Sequence[ViewItem], stored: Sequence[ViewItem], what: str) -> list[str]:
    exp, got = view_rows(expected), view_rows(stored)
    if exp == got:
        return []
    diffs = [f"{what}: {len(got)} stored rows, {len(exp)} expected"] if len(exp) != len(got) else []
    for e, g in zip(exp, got, strict=False):
        if e != g:
            diffs.append(f"{what}: first difference at ord {e[0]} (stored ord {g[0]}, ref {g[1]})")
            break
    return diffs or [f"{what}: rows differ"]


def check_append_target(
    session_id: str,
    *,
    head: int,
    last_hash: str,
    known: tuple[int, str] | None,
    hash_at_known: str | None,
    expected_seq: int | None,
) -> None:
    """Decide whether an append may go onto the chain ending at (``head``, ``last_hash``).

    ``known`` is the (seq, hash) the caller's handle last saw; ``hash_at_known`` is
    the stored hash at that seq (``None`` when that seq no longer exists). If the
    chain no longer passes through ``known`` the session the handle knew was purged
    (and perhaps re-created): ``SessionNotFound``, never a write onto another chain.
    A pinned ``expected_seq`` other than the head is ``ConcurrencyError``. Both
    stores call this, so they refuse the same things.
    """
    if (
        known is not None
        and (known[0], known[1]) != (head, last_hash)
        and (known[0] > head or hash_at_known != known[1])
    ):
        raise SessionNotFound(
            f"session {session_id!r} is not the chain this handle knew (seq {known[0]} "
            "changed): it was purged and perhaps re-created. Reopen it.",
            session_id=session_id,
            known_seq=known[0],
        )
    if expected_seq is not None and expected_seq != head:
        raise ConcurrencyError(
            f"expected head {expected_seq}, session {session_id!r} is at {head}",
            expected_seq=expected_seq,
            head=head,
        )
