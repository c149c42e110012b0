"""``Ledger`` and ``Session``: the async API that glues the pure core to a store.

A ``Session`` satisfies the Amplifier ``ContextManager`` protocol (``add_message``,
``get_messages_for_request``, ``get_messages``, ``set_messages``, ``clear``) and
adds the ledger's own verbs: checkpoints, rollback, replay and audit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog

from .errors import (
    CheckpointNotFound,
    InvalidArgument,
    LedgerClosed,
    SessionExists,
    SessionNotFound,
)
from .events import (
    CheckpointCreated,
    ConfigChanged,
    Event,
    MessageAppended,
    MessagesReplaced,
    Payload,
    RolledBack,
    SessionCleared,
    SessionCreated,
    SummaryRecorded,
)
from .ledger.dsn import is_postgres, redact
from .ledger.memory import MemoryStore
from .ledger.store import Checkpoint, RebuildReport, SessionInfo, Store, VerifyReport
from .messages import copy_json, validate_message
from .projection import fold
from .tokens import CharsCounter, TokenCounter
from .view import ORD_STRIDE, ViewItem

log = structlog.get_logger(__name__)
MAX_SESSION_ID = 200


def _now() -> datetime:
    return datetime.now(UTC)


def _check_session_id(session_id: Any) -> str:
    if not isinstance(session_id, str) or not session_id.strip():
        raise InvalidArgument("session_id must be a non-empty string", field="session_id")
    if len(session_id) > MAX_SESSION_ID or "\x00" in session_id:
        raise InvalidArgument(
            f"session_id must be at most {MAX_SESSION_ID} characters, without NUL",
            field="session_id")
    return session_id


def _check_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > 200 or "\x00" in key:
        raise InvalidArgument("idempotency_key must be a non-empty string of at most 200 "
                              "characters", field="idempotency_key")
    return key


def _check_seq(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{name} must be a non-negative int", field=name)
    return value


class Session:
    """One conversation's memory. Obtain it from ``Ledger.session``."""

    def __init__(self, ledger: Ledger, info: SessionInfo, counter: TokenCounter) -> None:
        self._ledger = ledger
        self._store = ledger.store
        self.session_id = info.session_id
        self._info = info
        self._head = info.head
        self._view_tokens = info.view_tokens
        self.counter = counter
        self._ephemeral: list[ViewItem] = []

    def __repr__(self) -> str:
        return f"<Session {self.session_id!r} head={self._head} store={self._store.kind}>"

    # -- state ------------------------------------------------------------------------

    @property
    def head(self) -> int:
        """The last seq this process wrote or read (``refresh`` re-reads it)."""
        return self._head

    @property
    def model(self) -> str | None:
        return self._info.model

    @property
    def config(self) -> Mapping[str, Any]:
        return self._info.config

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._info.metadata

    async def refresh(self) -> SessionInfo:
        self._info = await self._store.session_info(self.session_id)
        self._head, self._view_tokens = self._info.head, self._info.view_tokens
        return self._info

    async def get_token_count(self) -> int:
        """Tokens in the working view (persisted + ephemeral); O(1), never re-tokenizes."""
        return self._view_tokens + sum(i.tokens for i in self._ephemeral)

    # -- writing ----------------------------------------------------------------------

    async def _append(
        self, payloads: Sequence[Payload], *, expected_seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        self._ledger._check_open()
        result = await self._store.append(
            self.session_id, payloads, created_at=_now(), expected_seq=expected_seq,
            idempotency_key=idempotency_key)
        if not result.duplicate:
            self._head = result.seq
            self._view_tokens = result.view_tokens
        return result.seq

    async def add_message(
        self, message: Mapping[str, Any], *, critical: bool = False, ephemeral: bool = False,
        idempotency_key: str | None = None, expected_seq: int | None = None,
    ) -> int | None:
        """Append ``message``; return its seq (``None`` for an ephemeral message).

        ``expected_seq`` is the head the caller believes current: if another writer
        got there first, ``ConcurrencyError`` and nothing is written. A retry with
        the same ``idempotency_key`` returns the original seq and writes nothing.
        """
        copied = validate_message(message)
        key = _check_key(idempotency_key)
        expected = _check_seq(expected_seq, "expected_seq")
        if not isinstance(critical, bool) or not isinstance(ephemeral, bool):
            raise InvalidArgument("critical and ephemeral must be bools")
        tokens = self.counter.count_message(copied)
        if ephemeral:
            if key is not None or expected is not None:
                raise InvalidArgument("an ephemeral message takes no idempotency_key or "
                                      "expected_seq: it is never written")
            slot = self._head * ORD_STRIDE + ORD_STRIDE // 2 + len(self._ephemeral)
            self._ephemeral.append(ViewItem(ref=(-self._head, len(self._ephemeral)), ord=slot,
                                            message=copied, tokens=tokens, critical=critical,
                                            kind="ephemeral"))
            return None
        payload = MessageAppended(copied, tokens, critical, self.counter.name)
        return await self._append([payload], expected_seq=expected,
                                  idempotency_key=key)

    async def set_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Replace the branch and the view with ``messages`` (session restore)."""
        if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
            raise InvalidArgument("set_messages takes a list of messages")
        copies = [validate_message(m) for m in messages]
        tokens = tuple(self.counter.count_message(m) for m in copies)
        self._ephemeral.clear()
        return await self._append([MessagesReplaced(tuple(copies), tokens, self.counter.name)])

    async def clear(self) -> int:
        self._ephemeral.clear()
        return await self._append([SessionCleared()])

    async def checkpoint(self, label: str | None = None) -> Checkpoint:
        if label is not None and (not isinstance(label, str) or not label or len(label) > 200):
            raise InvalidArgument("a checkpoint label must be a non-empty string (≤ 200 chars)")
        if isinstance(label, str) and label.isdigit():
            raise InvalidArgument("a checkpoint label cannot be all digits (it would read as "
                                  "a seq in rollback)")
        seq = await self._append([CheckpointCreated(label)])
        return Checkpoint(seq, label, _now())

    async def checkpoints(self) -> list[Checkpoint]:
        return await self._store.checkpoints(self.session_id)

    async def rollback(self, to: Checkpoint | str | int) -> int:
        """Make the view exactly what it was right after a checkpoint (or any seq).

        Events after it stay in the ledger; a rollback can itself be rolled back.
        """
        label: str | None = None
        checkpoint_seq: int | None = None
        if isinstance(to, Checkpoint):
            to_seq, checkpoint_seq, label = to.seq, to.seq, to.label
        elif isinstance(to, bool):
            raise InvalidArgument("rollback takes a Checkpoint, a label or a seq")
        elif isinstance(to, int):
            to_seq = to
        elif isinstance(to, str):
            matches = [c for c in await self.checkpoints() if c.label == to]
            if not matches:
                raise CheckpointNotFound(f"no checkpoint labelled {to!r} in session "
                                         f"{self.session_id!r}", label=to)
            to_seq, checkpoint_seq, label = matches[-1].seq, matches[-1].seq, to
        else:
            raise InvalidArgument("rollback takes a Checkpoint, a label or a seq")
        if checkpoint_seq is not None and isinstance(to, Checkpoint):
            known = {c.seq for c in await self.checkpoints()}
            if checkpoint_seq not in known:
                raise CheckpointNotFound(f"seq {checkpoint_seq} is not a checkpoint of "
                                         f"session {self.session_id!r}")
        self._ephemeral.clear()
        return await self._append([RolledBack(to_seq, checkpoint_seq, label)])

    async def record_summary(
        self, from_seq: int, to_seq: int, summary: str | Mapping[str, Any], *,
        audit: Mapping[str, Any] | None = None, role: str = "user",
    ) -> int:
        """Low-level: one summary item replaces the view items with seq in the range."""
        for name, v in (("from_seq", from_seq), ("to_seq", to_seq)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgument(f"{name} must be a positive int")
        if isinstance(summary, str):
            if not summary.strip():
                raise InvalidArgument("a summary cannot be empty")
            message: dict[str, Any] = validate_message({"role": role, "content": summary})
        else:
            message = validate_message(summary)
        payload = SummaryRecorded(from_seq, to_seq, message, self.counter.count_message(message),
                                  copy_json(dict(audit or {}), "audit"))
        return await self._append([payload])

    async def update_config(self, config: Mapping[str, Any]) -> int:
        """Record new settings; replay then knows which were in force at every seq."""
        copied = copy_json(dict(config), "config")
        seq = await self._append([ConfigChanged(copied)])
        await self.refresh()
        return seq

    # -- reading ----------------------------------------------------------------------

    async def view_items(self) -> tuple[ViewItem, ...]:
        """The working view as items (refs, tokens, kinds), ephemeral ones merged in."""
        items = await self._store.read_view(self.session_id)
        if not self._ephemeral:
            return items
        return tuple(sorted((*items, *self._ephemeral), key=lambda i: i.ord))

    async def view(self) -> list[dict[str, Any]]:
        """The working view: summaries and persisted compactions applied."""
        return [dict(i.message) for i in await self.view_items()]

    async def get_messages(self) -> list[dict[str, Any]]:
        """The current branch's messages in order: no compaction, no summaries."""
        branch = await self._store.read_branch(self.session_id)
        if not self._ephemeral:
            return branch
        return branch + [dict(i.message) for i in self._ephemeral]

    async def get_messages_for_request(
        self, token_budget: int | None = None, provider: Any | None = None
    ) -> list[dict[str, Any]]:
        """Messages for the next model request (budgeting is the compaction engine's seam)."""
        return await self.view()

    def events(self, from_seq: int = 1, to_seq: int | None = None) -> AsyncIterator[Event]:
        """The session's events in seq order (an async iterator; pages under the hood)."""
        _check_seq(from_seq, "from_seq")
        _check_seq(to_seq, "to_seq")
        return self._store.read_events(self.session_id, from_seq, to_seq)

    async def view_at(self, seq: int) -> list[dict[str, Any]]:
        """The working view right after ``seq`` (replayed from the events)."""
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= self._head:
            await self.refresh()
            if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= self._head:
                raise InvalidArgument(f"seq must be an int in 1..{self._head}")
        events = [e async for e in self._store.read_events(self.session_id, 1, seq)]
        return [dict(i.message) for i in fold(events).view]

    async def verify(self) -> VerifyReport:
        return await self._store.verify(self.session_id)


class Ledger:
    """A handle on one store. ``async with Ledger.open(dsn) as ledger: ...``"""

    def __init__(self, store: Store, *, config: Mapping[str, Any] | None = None,
                 dsn: str | None = None) -> None:
        self.store = store
        self.dsn = dsn
        self.default_config: dict[str, Any] = dict(config or {})
        self._closed = False

    def __repr__(self) -> str:
        where = redact(self.dsn) if self.dsn else self.store.kind
        return f"<Ledger {where}>"

    @classmethod
    def open(
        cls, dsn: str | None = None, *, home: str | None = None, migrate: bool | None = None,
        config: Mapping[str, Any] | None = None, pool_size: int = 10,
    ) -> _Opener:
        """Open a ledger: ``None`` → embedded PostgreSQL, ``postgresql://…``, or ``memory://``.

        The embedded server is migrated on first use; another server must already be
        migrated unless ``migrate=True`` (otherwise ``MigrationRequired`` says how).
        """
        return _Opener(cls, dsn, home, migrate, config, pool_size)

    @classmethod
    async def _open(
        cls, dsn: str | None, home: str | None, migrate: bool | None,
        config: Mapping[str, Any] | None, pool_size: int,
    ) -> Ledger:
        from pathlib import Path

        config = copy_json(dict(config or {}), "config")
        if dsn == "memory://":
            return cls(MemoryStore(), config=config, dsn=dsn)
        from .ledger import migrate as migrations
        from .ledger.postgres import PostgresStore

        if dsn is None:
            from .ledger import embedded

            dsn = await asyncio.to_thread(embedded.start, Path(home) if home else None)
            migrate = True if migrate is None else migrate
        elif not isinstance(dsn, str) or not is_postgres(dsn):
            raise InvalidArgument(
                "dsn must be None (embedded), 'memory://' or a postgresql:// URL", field="dsn")
        if migrate:
            await migrations.upgrade(dsn)
        store = await PostgresStore.connect(dsn, max_size=pool_size)
        try:
            await store.require_revision(migrations.head_revision())
        except BaseException:
            await store.close()
            raise
        return cls(store, config=config, dsn=dsn)

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerClosed("this ledger is closed")

    def counter_for(self, model: str | None, config: Mapping[str, Any]) -> TokenCounter:
        return CharsCounter()

    async def session(
        self, session_id: str, *, create: bool = True, model: str | None = None,
        config: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
    ) -> Session:
        """Open (or create) a session. A different ``config`` is recorded as an event."""
        self._check_open()
        _check_session_id(session_id)
        if model is not None and (not isinstance(model, str) or not model):
            raise InvalidArgument("model must be a non-empty string", field="model")
        cfg = copy_json(dict(config), "config") if config is not None else None
        meta = copy_json(dict(metadata or {}), "metadata")
        try:
            info = await self.store.session_info(session_id)
        except SessionNotFound:
            if not create:
                raise
            effective = {**self.default_config, **(cfg or {})}
            try:
                info = await self.store.create_session(
                    session_id, SessionCreated(model, effective, meta), created_at=_now())
            except SessionExists:  # created concurrently: open it instead
                info = await self.store.session_info(session_id)
        session = Session(self, info, self.counter_for(info.model, info.config))
        if cfg is not None:
            effective = {**info.config, **cfg}
            if effective != dict(info.config):
                await session.update_config(effective)
        return session

    async def sessions(self) -> list[SessionInfo]:
        self._check_open()
        return await self.store.list_sessions()

    async def verify(self, session_id: str) -> VerifyReport:
        self._check_open()
        return await self.store.verify(_check_session_id(session_id))

    async def verify_all(self) -> list[VerifyReport]:
        return [await self.store.verify(s.session_id) for s in await self.sessions()]

    async def rebuild(self, session_id: str | None = None) -> list[RebuildReport]:
        """Recompute view rows from the events; report (and repair) any difference."""
        self._check_open()
        ids = [_check_session_id(session_id)] if session_id is not None else [
            s.session_id for s in await self.store.list_sessions()]
        return [await self.store.rebuild(i) for i in ids]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.store.close()


class _Opener:
    """``Ledger.open(...)`` works both as ``await`` and as ``async with``."""

    def __init__(self, cls: type[Ledger], *args: Any) -> None:
        self._cls, self._args = cls, args
        self._ledger: Ledger | None = None

    def __await__(self) -> Generator[Any, None, Ledger]:
        return self._cls._open(*self._args).__await__()

    async def __aenter__(self) -> Ledger:
        self._ledger = await self._cls._open(*self._args)
        return self._ledger

    async def __aexit__(self, *exc: object) -> None:
        if self._ledger is not None:
            await self._ledger.close()
