"""The ledger's vocabulary: one frozen, versioned type per event kind.

An event's ``data`` is plain JSON written by ``to_data`` and read back by
``from_data(data)``, which reads only the current shape. A type that changes shape
bumps its ``VERSION`` and registers an upcaster ``(type, old_version) -> new data``
in ``UPCASTERS``; ``decode`` applies the chain centrally, so every event ever written
stays readable and no payload class carries old shapes. ``verify`` hashes the data
as stored, never an upcast of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from contextledger.core.view import Ref
from contextledger.errors import EventDecodeError


@dataclass(frozen=True)
class Payload:
    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def to_data(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Payload:
        raise NotImplementedError


@dataclass(frozen=True)
class SessionCreated(Payload):
    TYPE: ClassVar[str] = "session.created"
    model: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        return {"model": self.model, "config": dict(self.config), "metadata": dict(self.metadata)}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SessionCreated:
        return cls(data.get("model"), data.get("config") or {}, data.get("metadata") or {})


@dataclass(frozen=True)
class MessageAppended(Payload):
    TYPE: ClassVar[str] = "message.appended"
    message: Mapping[str, Any]
    tokens: int
    critical: bool = False
    counter: str = ""
    #: "synthetic" marks a result the ledger made up for an unanswered tool call.
    origin: str | None = None
    #: The message as the caller sent it, when it came in another provider's shape
    #: (Responses item, Gemini content) and ``message`` is its OpenAI-chat form. Optional:
    #: events written before it existed decode (and hash) unchanged.
    original: Mapping[str, Any] | None = None

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "message": self.message,
            "critical": self.critical,
            "tokens": self.tokens,
            "counter": self.counter,
        }
        if self.origin:
            data["origin"] = self.origin
        if self.original is not None:
            data["original"] = self.original
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> MessageAppended:
        return cls(
            data["message"],
            int(data.get("tokens", 0)),
            bool(data.get("critical")),
            str(data.get("counter", "")),
            data.get("origin"),
            data.get("original"),
        )


@dataclass(frozen=True)
class MessagesReplaced(Payload):
    """``set_messages``: the branch and the view become exactly these messages."""

    TYPE: ClassVar[str] = "messages.replaced"
    messages: tuple[Mapping[str, Any], ...]
    tokens: tuple[int, ...]
    counter: str = ""

    def to_data(self) -> dict[str, Any]:
        return {
            "messages": list(self.messages),
            "tokens": list(self.tokens),
            "counter": self.counter,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> MessagesReplaced:
        return cls(
            tuple(data["messages"]),
            tuple(int(t) for t in data["tokens"]),
            str(data.get("counter", "")),
        )


@dataclass(frozen=True)
class SessionCleared(Payload):
    TYPE: ClassVar[str] = "session.cleared"

    def to_data(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SessionCleared:
        return cls()


@dataclass(frozen=True)
class CheckpointCreated(Payload):
    TYPE: ClassVar[str] = "checkpoint.created"
    label: str | None = None

    def to_data(self) -> dict[str, Any]:
        return {"label": self.label}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> CheckpointCreated:
        return cls(data.get("label"))


@dataclass(frozen=True)
class RolledBack(Payload):
    """The view becomes exactly the view right after ``to_seq``."""

    TYPE: ClassVar[str] = "session.rolled_back"
    to_seq: int
    checkpoint_seq: int | None = None
    label: str | None = None

    def to_data(self) -> dict[str, Any]:
        return {"to_seq": self.to_seq, "checkpoint_seq": self.checkpoint_seq, "label": self.label}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> RolledBack:
        return cls(int(data["to_seq"]), data.get("checkpoint_seq"), data.get("label"))


@dataclass(frozen=True)
class SessionForked(Payload):
    """The first event of a fork: it stands on ``parent_session_id``'s chain at ``parent_seq``.

    Nothing is copied: seqs ``1..parent_seq`` of the fork are the parent's events (read
    from the parent, recursively for a fork of a fork), this event is ``parent_seq + 1``
    and its hash chains onto ``parent_hash``, so ``verify`` of the fork proves the
    parent prefix it stands on. The view right after it is the parent's view at
    ``parent_seq``.
    """

    TYPE: ClassVar[str] = "session.forked"
    parent_session_id: str
    parent_seq: int
    parent_hash: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        return {
            "parent_session_id": self.parent_session_id,
            "parent_seq": self.parent_seq,
            "parent_hash": self.parent_hash,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SessionForked:
        return cls(
            str(data["parent_session_id"]),
            int(data["parent_seq"]),
            str(data["parent_hash"]),
            data.get("metadata") or {},
        )


@dataclass(frozen=True)
class SummaryRecorded(Payload):
    """One summary item replaces the view items placed in ``from_seq..to_seq``.

    An item's place is ``(seq, part)`` of the message it stands for; a summary stands
    at the first place it covers (``ViewItem.place``), so ranges stay contiguous. The
    parts matter only inside one ``messages.replaced`` event (all its messages share
    a seq): ``from_part``/``to_part`` bound the range there (default: all parts).

    ``audit`` holds what an auditor needs (model that answered, attempts, tokens
    before/after, prompt version, custom instructions, prior summary seq).
    """

    TYPE: ClassVar[str] = "summary.recorded"
    from_seq: int
    to_seq: int
    message: Mapping[str, Any]
    tokens: int
    audit: Mapping[str, Any] = field(default_factory=dict)
    from_part: int = 0
    to_part: int | None = None

    def to_data(self) -> dict[str, Any]:
        data = {
            "from_seq": self.from_seq,
            "to_seq": self.to_seq,
            "message": self.message,
            "tokens": self.tokens,
            "audit": dict(self.audit),
        }
        if self.from_part or self.to_part is not None:
            data["from_part"], data["to_part"] = self.from_part, self.to_part
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SummaryRecorded:
        to_part = data.get("to_part")
        return cls(
            int(data["from_seq"]),
            int(data["to_seq"]),
            data["message"],
            int(data.get("tokens", 0)),
            data.get("audit") or {},
            int(data.get("from_part") or 0),
            None if to_part is None else int(to_part),
        )

    def covers(self, place: tuple[int, int]) -> bool:
        hi = self.to_part if self.to_part is not None else float("inf")
        return (self.from_seq, self.from_part) <= place <= (self.to_seq, hi)


@dataclass(frozen=True)
class Pruned:
    ref: Ref
    message: Mapping[str, Any]
    tokens: int


@dataclass(frozen=True)
class CompactionApplied(Payload):
    """A persisted compaction: view items dropped or replaced by pruned copies."""

    TYPE: ClassVar[str] = "compaction.applied"
    strategy: str
    drop: tuple[Ref, ...] = ()
    prune: tuple[Pruned, ...] = ()
    tokens_before: int = 0
    tokens_after: int = 0

    def to_data(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "drop": [list(r) for r in self.drop],
            "prune": [
                {"ref": list(p.ref), "message": p.message, "tokens": p.tokens} for p in self.prune
            ],
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> CompactionApplied:
        return cls(
            str(data["strategy"]),
            tuple((int(r[0]), int(r[1])) for r in data.get("drop", ())),
            tuple(
                Pruned((int(p["ref"][0]), int(p["ref"][1])), p["message"], int(p["tokens"]))
                for p in data.get("prune", ())
            ),
            int(data.get("tokens_before", 0)),
            int(data.get("tokens_after", 0)),
        )


@dataclass(frozen=True)
class ConfigChanged(Payload):
    TYPE: ClassVar[str] = "config.changed"
    config: Mapping[str, Any]

    def to_data(self) -> dict[str, Any]:
        return {"config": dict(self.config)}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ConfigChanged:
        return cls(data.get("config") or {})


@dataclass(frozen=True)
class ModelChanged(Payload):
    """The session's model (and counter) changed; the current view was recounted once."""

    TYPE: ClassVar[str] = "model.changed"
    model: str | None
    counter: str
    recount: tuple[tuple[Ref, int], ...] = ()

    def to_data(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "counter": self.counter,
            "recount": [[r[0], r[1], t] for r, t in self.recount],
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ModelChanged:
        return cls(
            data.get("model"),
            str(data.get("counter", "")),
            tuple(((int(a), int(b)), int(t)) for a, b, t in data.get("recount", ())),
        )


PAYLOAD_TYPES: dict[str, type[Payload]] = {
    cls.TYPE: cls
    for cls in (
        SessionCreated,
        SessionForked,
        MessageAppended,
        MessagesReplaced,
        SessionCleared,
        CheckpointCreated,
        RolledBack,
        SummaryRecorded,
        CompactionApplied,
        ConfigChanged,
        ModelChanged,
    )
}


Upcaster = Callable[[Mapping[str, Any]], Mapping[str, Any]]

#: ``(type, from_version) -> f(data) -> data at from_version + 1``. Empty while every
#: event type is at version 1; the first shape change adds its entry here.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcast(
    type_: str,
    version: int,
    data: Mapping[str, Any],
    *,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
    target: int | None = None,
) -> Mapping[str, Any]:
    """``data`` written at ``version``, brought step by step to ``target`` (default: current)."""
    chain = UPCASTERS if upcasters is None else upcasters
    want = PAYLOAD_TYPES[type_].VERSION if target is None else target
    while version < want:
        step = chain.get((type_, version))
        if step is None:
            raise EventDecodeError(
                f"no upcaster for {type_} v{version} -> v{version + 1}",
                code="NO_UPCASTER",
                event_type=type_,
                version=version,
            )
        data = step(data)
        version += 1
    return data


def decode(type_: str, version: int, data: Mapping[str, Any]) -> Payload:
    """The payload for stored ``(type, version, data)``: upcast to the current shape first."""
    cls = PAYLOAD_TYPES.get(type_)
    if cls is None:
        raise EventDecodeError(
            f"unknown event type {type_!r}: written by a newer or foreign version of contextledger",
            code="UNKNOWN_EVENT_TYPE",
            event_type=type_,
        )
    if version > cls.VERSION:
        raise EventDecodeError(
            f"{type_} v{version} is newer than this code (v{cls.VERSION}): upgrade contextledger",
            code="EVENT_FROM_NEWER_CODE",
            event_type=type_,
            version=version,
        )
    return cls.from_data(upcast(type_, version, data))


def payload_tokens(payload: Payload) -> int:
    """The ``tokens`` column: what the event adds to the context when it is in the view."""
    if isinstance(payload, MessageAppended | SummaryRecorded):
        return payload.tokens
    if isinstance(payload, MessagesReplaced):
        return sum(payload.tokens)
    return 0


@dataclass(frozen=True)
class Event:
    """An event as stored: envelope plus payload."""

    session_id: str
    seq: int
    payload: Payload
    created_at: datetime
    hash: str
    tokens: int = 0
    idempotency_key: str | None = None
    position: int | None = None
    #: The data exactly as stored (``verify`` hashes this, not a re-encoding).
    data: Mapping[str, Any] | None = None
    #: The schema version it was written with (not the reading code's VERSION).
    stored_version: int | None = None
    #: ``data`` as canonical JSON, when this process encoded it and that text is also the
    #: data as given (no number rewritten for hashing, 1.0 -> 1): reusable on the wire.
    encoded: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def type(self) -> str:
        """The event's type name (``message.appended``, ``summary.recorded`` ...)."""
        return self.payload.TYPE

    @property
    def version(self) -> int:
        """The payload schema version it was written with (upcast on read)."""
        return self.stored_version if self.stored_version is not None else self.payload.VERSION

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-able fields (what ``contextledger events --json`` prints)."""
        return {
            "session_id": self.session_id,
            "seq": self.seq,
            "type": self.type,
            "version": self.version,
            "data": self.payload.to_data(),
            "tokens": self.tokens,
            "created_at": self.created_at.isoformat(),
            "idempotency_key": self.idempotency_key,
            "hash": self.hash,
            "position": self.position,
        }
