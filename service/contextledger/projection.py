"""The one pure fold ``events -> State`` used by the inline projection and by replay.

``State.branch`` is the current branch's messages (what ``get_messages`` returns:
summaries and compactions not applied); ``State.view`` is the working view the
next request is built from. ``view_at(seq)`` is simply ``fold(events[:seq])``.

Rollback needs the state as of an earlier seq. ``fold`` keeps a snapshot at every
seq some later rollback targets (found in a first pass), so replay stays one
forward pass however rollbacks nest. Incremental callers pass ``state_at``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .events import (
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
    SummaryRecorded,
)
from .view import ORD_STRIDE, ViewItem


@dataclass(frozen=True)
class State:
    head: int = 0
    branch: tuple[ViewItem, ...] = ()
    view: tuple[ViewItem, ...] = ()
    model: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    counter: str = ""

    @property
    def view_tokens(self) -> int:
        return sum(item.tokens for item in self.view)


StateAt = Callable[[int], State]


def message_item(seq: int, payload: MessageAppended) -> ViewItem:
    """The view item a ``message.appended`` event contributes (shared with the SQL fast path)."""
    synthetic = payload.origin == "synthetic"
    return ViewItem(
        ref=(seq, 0), ord=seq * ORD_STRIDE, message=payload.message, tokens=payload.tokens,
        critical=payload.critical, kind="synthetic" if synthetic else "message",
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
        ref=(seq, 0), ord=first_ord if first_ord is not None else seq * ORD_STRIDE,
        message=p.message, tokens=p.tokens, kind="summary",
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


def apply(state: State, event: Event, state_at: StateAt | None = None) -> State:
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
    if isinstance(p, CheckpointCreated):
        return replace(state, head=seq)
    if isinstance(p, RolledBack):
        if state_at is None:
            raise ValueError("a rollback needs the state as of its target (state_at)")
        return replace(state_at(p.to_seq), head=seq)
    if isinstance(p, SessionCreated):
        return State(head=seq, model=p.model, config=p.config)
    if isinstance(p, ConfigChanged):
        return replace(state, head=seq, config=p.config)
    if isinstance(p, ModelChanged):
        counts = dict(p.recount)
        view = tuple(
            replace(i, tokens=counts[i.ref]) if i.ref in counts else i for i in state.view
        )
        return replace(state, head=seq, model=p.model, counter=p.counter, view=view)
    raise TypeError(f"no projection rule for {type(p).__name__}")


def rollback_targets(events: Iterable[Event]) -> set[int]:
    return {e.payload.to_seq for e in events if isinstance(e.payload, RolledBack)}


def fold(events: Sequence[Event], until: int | None = None) -> State:
    """Fold ``events`` (ordered by seq, from 1) into the state right after ``until``."""
    targets = rollback_targets(events)
    snapshots: dict[int, State] = {}
    state = State()
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
