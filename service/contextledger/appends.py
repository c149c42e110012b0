"""The write path of one session: validate, close open tool calls, append, track the tail.

``WritePath`` turns messages into ``message.appended`` payloads for its ``Session``:
arguments and messages are checked first (bad input writes nothing), a tool call
left unanswered when the conversation moves on gets its synthetic error results in
the same batch, the batch is appended pinned to the chain position this process
knows (``append``: the one door every writer of the session goes through, which keeps
the request path in step), and the calls still open at the view's tail are tracked
from what was appended, so the next append needs no read. The helpers below build
the other payloads a session writes from caller input (replacements, summaries).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

from contextledger import telemetry
from contextledger._checks import check_key, check_mapping, check_seq, checked_tokens
from contextledger.core.encoding import dumps
from contextledger.core.events import (
    CheckpointCreated,
    MessageAppended,
    MessagesReplaced,
    Payload,
    SummaryRecorded,
    payload_tokens,
)
from contextledger.core.messages import validate_message
from contextledger.core.tokens import TokenCounter
from contextledger.core.units import (
    OpenCalls,
    open_calls_at_tail,
    result_ids,
    synthetic_results,
    track_open_calls,
)
from contextledger.core.view import ORD_STRIDE, ViewItem
from contextledger.errors import (
    ConcurrencyError,
    IdempotencyConflict,
    InvalidArgument,
    InvalidMessage,
)
from contextledger.session_state import SessionState
from contextledger.store.base import AppendResult, SessionInfo

__all__ = [
    "AppendingSession",
    "WritePath",
    "Written",
    "check_size",
    "replacement",
    "rewrites_view",
    "summary_payload",
    "synthetic_payloads",
    "utc_now",
]


def utc_now() -> datetime:
    """The wall clock events are stamped with (timezone-aware: hashes must not vary)."""
    return datetime.now(UTC)


class PlannedRequests(Protocol):
    """The request path, kept in step by each append (its copy of the view's tail too)."""

    def on_append(self, prior: int, result: AppendResult, payloads: Sequence[Payload]) -> None: ...
    def view_changed(self) -> None: ...
    def current_tail(self, n: int) -> list[ViewItem] | None: ...


class AppendingSession(Protocol):
    """What the write path needs of its ``Session`` (a port: no import cycle)."""

    session_id: str
    counter: TokenCounter

    async def refresh(self) -> SessionInfo: ...


class Written(NamedTuple):
    """One message as written: its seq (``None`` if ephemeral), the stored copy, tokens."""

    seq: int | None
    message: dict[str, Any]
    tokens: int


def recorded(span: Any, result: AppendResult, payloads: Sequence[Payload]) -> None:
    """An append's span attributes: the seqs written, their kinds and tokens (the
    messages only when the application opted in to content)."""
    span.set_attribute("gen_ai.memory.record.id", str(result.seqs[0]))
    span.set_attribute("gen_ai.memory.record.count", len(result.seqs))
    span.set_attribute("contextledger.seq", result.seq)
    span.set_attribute("contextledger.duplicate", result.duplicate)
    span.set_attribute("contextledger.event.types", sorted({p.TYPE for p in payloads}))
    span.set_attribute("contextledger.tokens", sum(payload_tokens(p) for p in payloads))
    if telemetry.capture_content():
        messages = [p.message for p in payloads if isinstance(p, MessageAppended)]
        if messages:
            span.set_attribute("gen_ai.memory.records", telemetry.content(messages))


def check_size(message: Mapping[str, Any], cap: int) -> None:
    """The session's ``max_message_bytes`` cap, on the message's stored JSON."""
    size = len(dumps(dict(message)).encode("utf-8", "surrogatepass"))
    if size > cap:
        raise InvalidMessage(
            f"message is {size} bytes of JSON, over this session's max_message_bytes "
            f"({cap}); split it or raise the cap in the config",
            field="message",
            size=size,
            limit=cap,
        )


def synthetic_payloads(
    open_calls: OpenCalls | None, first: Mapping[str, Any], counter: TokenCounter
) -> list[Payload]:
    """Error results for the calls still open, unless ``first`` (the next message) answers
    one of them: the conversation then moves on and they will never be answered."""
    if open_calls is None or set(result_ids(first)) & set(open_calls.missing):
        return []
    return [
        MessageAppended(dict(syn.message), syn.tokens, False, counter.name, origin="synthetic")
        for syn in synthetic_results(open_calls.call, open_calls.after, open_calls.missing, counter)
    ]


def rewrites_view(payloads: Sequence[Payload]) -> bool:
    """Whether a batch does more than append messages and checkpoints (the cold path)."""
    return not all(isinstance(p, MessageAppended | CheckpointCreated) for p in payloads)


def _appended_item(seq: int, message: Mapping[str, Any], tokens: int, critical: bool) -> ViewItem:
    return ViewItem(
        ref=(seq, 0), ord=seq * ORD_STRIDE, message=message, tokens=tokens, critical=critical
    )


def replacement(
    messages: Sequence[Mapping[str, Any]], counter: TokenCounter, cap: int
) -> MessagesReplaced:
    """The ``messages.replaced`` payload of ``Session.set_messages`` (checked, counted)."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise InvalidArgument("set_messages takes a list of messages")
    copies = [validate_message(m) for m in messages]
    for m in copies:
        check_size(m, cap)
    tokens = tuple(checked_tokens(counter.count_message(m)) for m in copies)
    return MessagesReplaced(tuple(copies), tokens, counter.name)


def summary_payload(
    from_seq: int,
    to_seq: int,
    summary: str | Mapping[str, Any],
    audit: Mapping[str, Any] | None,
    role: str,
    counter: TokenCounter,
) -> SummaryRecorded:
    """The ``summary.recorded`` payload of ``Session.record_summary`` (checked, counted)."""
    for name, v in (("from_seq", from_seq), ("to_seq", to_seq)):
        if not check_seq(v, name):
            raise InvalidArgument(f"{name} must be a positive int", field=name)
    if isinstance(summary, str):
        if not summary.strip():
            raise InvalidArgument("a summary cannot be empty")
        message: dict[str, Any] = validate_message({"role": role, "content": summary})
    else:
        message = validate_message(summary)
    return SummaryRecorded(
        from_seq,
        to_seq,
        message,
        checked_tokens(counter.count_message(message)),
        check_mapping(audit, "audit"),
    )


class WritePath:
    """Message appends for one ``Session``, with the open tool calls at the tail."""

    def __init__(self, session: AppendingSession, state: SessionState) -> None:
        self._s = session
        self._state = state
        #: the request path, kept in step by each append (``follow``)
        self._requests: PlannedRequests | None = None
        self._open: OpenCalls | None = None
        self._tail_known = False

    def follow(self, requests: PlannedRequests) -> None:
        """Keep ``requests`` in step with every append from now on (the session wires
        its request path here once both exist: each needs the other)."""
        self._requests = requests

    async def append(
        self,
        payloads: Sequence[Payload],
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[int, ...]:
        """Append; keep the session's head and the request state in step without reading
        anything back (``RequestPath.on_append``); a view rewrite resets what was cached."""
        s = self._s
        self._state.ledger.check_open()
        prior = self._state.head

        def call() -> Awaitable[AppendResult]:
            return self._state.store.append(
                s.session_id,
                payloads,
                created_at=utc_now(),
                expected_seq=expected_seq,
                idempotency_key=idempotency_key,
                known=self._state.known,
            )

        policy = getattr(self._state.ledger, "retry_appends", None)
        with telemetry.span(
            "create_memory",
            {
                "gen_ai.operation.name": "create_memory",
                "gen_ai.conversation.id": s.session_id,
                "gen_ai.memory.store.id": s.session_id,
            },
        ) as span:
            result = await (policy.run(call) if policy and idempotency_key else call())
            if span is not None:
                recorded(span, result, payloads)
        if result.duplicate:
            return result.seqs
        self._state.advance(result.seq, result.last_hash, view_tokens=result.view_tokens)
        if rewrites_view(payloads):
            if self._requests is not None:
                self._requests.view_changed()
            self.forget_tail()
        elif self._requests is not None:
            self._requests.on_append(prior, result, payloads)
        return result.seqs

    async def _same_batch(
        self, last: int, payloads: Sequence[Payload], key: str | None
    ) -> list[int]:
        """The seqs of an earlier batch written under ``key`` (its messages end at
        ``last``), if it held the same messages; the store compared the last only."""
        s = self._s
        first = last - len(payloads) + 1
        stored = []
        if first >= 1:
            stored = [
                e.payload async for e in self._state.store.read_events(s.session_id, first, last)
            ]
        if stored != list(payloads):
            raise IdempotencyConflict(
                f"idempotency key {key!r} was used for a different batch (ending at seq {last})",
                seq=last,
            )
        return list(range(first, last + 1))

    def forget_tail(self) -> None:
        """The tail may have changed under this process: derive it again when needed."""
        self._tail_known = False

    async def _ensure_tail(self) -> None:
        if not self._tail_known:
            last = self._requests.current_tail(64) if self._requests is not None else None
            if last is None:  # the last unit, whatever its size: never the whole view
                s = self._s
                last = list((await self._state.store.read_view_tail(s.session_id, 1)).items)
            self._open = open_calls_at_tail(last)
            self._tail_known = True

    async def add_one(
        self,
        message: Mapping[str, Any],
        critical: bool,
        ephemeral: bool,
        idempotency_key: str | None,
        expected_seq: int | None,
        original: Mapping[str, Any] | None,
    ) -> Written:
        """``Session.add_message`` for one OpenAI chat message, up to the append."""
        s = self._s
        copied = validate_message(message)
        key = check_key(idempotency_key)
        expected = check_seq(expected_seq, "expected_seq")
        if not isinstance(critical, bool) or not isinstance(ephemeral, bool):
            raise InvalidArgument("critical and ephemeral must be bools")
        tokens = checked_tokens(s.counter.count_message(copied))
        check_size(copied, self._state.config.max_message_bytes)
        if ephemeral:
            if key is not None or expected is not None:
                raise InvalidArgument(
                    "an ephemeral message takes no idempotency_key or "
                    "expected_seq: it is never written"
                )
            n = len(self._state.ephemeral)
            self._state.ephemeral.append(
                ViewItem(
                    ref=(-self._state.head, n),
                    ord=self._state.head * ORD_STRIDE + ORD_STRIDE // 2 + n,
                    message=copied,
                    tokens=tokens,
                    critical=critical,
                    kind="ephemeral",
                )
            )
            return Written(None, copied, tokens)
        await self._ensure_tail()
        synthetic = synthetic_payloads(self._open, copied, s.counter)
        payloads = [
            *synthetic,
            MessageAppended(copied, tokens, critical, s.counter.name, original=original),
        ]
        # Synthetic results are decided from this process's view of the tail: pin the
        # batch to the head they were decided at, and decide again if someone wrote.
        pin = self._state.head if synthetic and expected is None else expected
        try:
            seq = (await self.append(payloads, pin, key))[-1]
        except ConcurrencyError:
            if expected is not None or not synthetic:
                raise
            await s.refresh()
            return await self.add_one(message, critical, False, key, None, original)
        self._open = track_open_calls(
            None if synthetic else self._open, _appended_item(seq, copied, tokens, critical)
        )
        return Written(seq, copied, tokens)

    async def add_batch(
        self,
        messages: Sequence[Mapping[str, Any]],
        critical: bool,
        idempotency_key: str | None = None,
        expected_seq: int | None = None,
    ) -> list[int]:
        """``Session.add_messages`` up to the append: all the messages or none."""
        s = self._s
        self._state.ledger.check_open()
        if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
            raise InvalidArgument("add_messages takes a list of messages")
        if not isinstance(critical, bool):
            raise InvalidArgument("critical must be a bool")
        key = check_key(idempotency_key)
        expected = check_seq(expected_seq, "expected_seq")
        copies = [validate_message(m) for m in messages]
        for m in copies:
            check_size(m, self._state.config.max_message_bytes)
        if not copies:
            return []
        counts = [checked_tokens(s.counter.count_message(m)) for m in copies]
        await self._ensure_tail()
        synthetic = synthetic_payloads(self._open, copies[0], s.counter)
        payloads: list[Payload] = [
            *synthetic,
            *(
                MessageAppended(m, t, critical, s.counter.name)
                for m, t in zip(copies, counts, strict=True)
            ),
        ]
        pin = self._state.head if synthetic and expected is None else expected
        try:
            seqs = await self.append(payloads, pin, key)
        except ConcurrencyError:
            if expected is not None or not synthetic:
                raise
            await s.refresh()
            self._tail_known = False
            return await self.add_batch(messages, critical, key)
        if len(seqs) < len(payloads):  # a retry: the key names the batch's last event
            return await self._same_batch(seqs[-1], payloads[len(synthetic) :], key)
        tracked = None if synthetic else self._open
        for seq, m, t in zip(seqs[len(synthetic) :], copies, counts, strict=True):
            tracked = track_open_calls(tracked, _appended_item(seq, m, t, critical))
        self._open = tracked
        return list(seqs[len(synthetic) :])
