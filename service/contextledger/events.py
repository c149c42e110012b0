"""The ledger's vocabulary: one frozen, versioned type per event kind, and the hash chain.

An event's ``data`` is plain JSON written by ``to_data`` and read back by
``from_data(data, version)``; a type that changes shape bumps its ``VERSION`` and
keeps reading the old one, so every event ever written stays readable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any, ClassVar

from .messages import canonical_json, has_float
from .view import Ref

GENESIS_HASH = "0" * 64


@dataclass(frozen=True)
class Payload:
    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def to_data(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_data(cls, data: Mapping[str, Any], version: int) -> Payload:
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
    def from_data(cls, data: Mapping[str, Any], version: int) -> SessionCreated:
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

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"message": self.message, "critical": self.critical,
                                "tokens": self.tokens, "counter": self.counter}
        if self.origin:
            data["origin"] = self.origin
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any], version: int) -> MessageAppended:
        return cls(data["message"], int(data.get("tokens", 0)), bool(data.get("critical")),
                   str(data.get("counter", "")), data.get("origin"))


@dataclass(frozen=True)
class MessagesReplaced(Payload):
    """``set_messages``: the branch and the view become exactly these messages."""

    TYPE: ClassVar[str] = "messages.replaced"
    messages: tuple[Mapping[str, Any], ...]
    tokens: tuple[int, ...]
    counter: str = ""

    def to_data(self) -> dict[str, Any]:
        return {"messages": list(self.messages), "tokens": list(self.tokens),
                "counter": self.counter}

    @classmethod
    def from_data(cls, data: Mapping[str, Any], version: int) -> MessagesReplaced:
        return cls(tuple(data["messages"]), tuple(int(t) for t in data["tokens"]),
                   str(data.get("counter", "")))


@dataclass(frozen=True)
class SessionCleared(Payload):
    TYPE: ClassVar[str] = "session.cleared"

    def to_data(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_data(cls, data: Mapping[str, Any], version: int) -> SessionCleared:
        return cls()


@dataclass(frozen=True)
class CheckpointCreated(Payload):
    TYPE: ClassVar[str] = "checkpoint.created"
    label: str | None = None

    def to_data(self) -> dict[str, Any]:
        return {"label": self.label}

    @classmethod
    def from_data(cls, data: Mapping[str, Any], version: int) -> CheckpointCreated:
        return cls(data.get("label"))


@dataclass(frozen=True)
class RolledBack(Payload):
    """The view becomes exactly the view right after ``to_seq``."""

    TYPE: ClassVar[str] = "session.rolled_back"
    to_seq: int
    checkpoint_seq: int | None = None
    label: str | None = None

    def to_data(self) -> dict[str, Any]:
        return {"to_seq": self.to_seq, "checkpoint_seq": self.checkpoint_seq,
                "label": self.label}

    @classmethod
    def from_data(cls, data: Mapping[str, Any], version: int) -> RolledBack:
        return cls(int(data["to_seq"]), data.get("checkpoint_seq"), data.get("label"))


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
        data = {"from_seq": self.from_seq, "to_seq": self.to_seq, "message": self.message,
                "tokens": self.tokens, "audit": dict(self.audit)}
        if self.from_part or self.to_part is not None:
            data["from_part"], data["to_part"] = self.from_part, self.to_part
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any], version: int) -> SummaryRecorded:
        to_part = data.get("to_part")
        return cls(int(data["from_seq"]), int(data["to_seq"]), data["message"],
                   int(data.get("tokens", 0)), data.get("audit") or {},
                   int(data.get("from_part") or 0), None if to_part is None else int(to_part))

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
            "prune": [{"ref": list(p.ref), "message": p.message, "tokens": p.tokens}
                      for p in self.prune],
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any], version: int) -> CompactionApplied:
        return cls(
            str(data["strategy"]),
            tuple((int(r[0]), int(r[1])) for r in data.get("drop", ())),
            tuple(Pruned((int(p["ref"][0]), int(p["ref"][1])), p["message"], int(p["tokens"]))
                  for p in data.get("prune", ())),
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
    def from_data(cls, data: Mapping[str, Any], version: int) -> ConfigChanged:
        return cls(data.get("config") or {})


@dataclass(frozen=True)
class ModelChanged(Payload):
    """The session's model (and counter) changed; the current view was recounted once."""

    TYPE: ClassVar[str] = "model.changed"
    model: str | None
    counter: str
    recount: tuple[tuple[Ref, int], ...] = ()

    def to_data(self) -> dict[str, Any]:
        return {"model": self.model, "counter": self.counter,
                "recount": [[r[0], r[1], t] for r, t in self.recount]}

    @classmethod
    def from_data(cls, data: Mapping[str, Any], version: int) -> ModelChanged:
        return cls(data.get("model"), str(data.get("counter", "")),
                   tuple(((int(a), int(b)), int(t)) for a, b, t in data.get("recount", ())))


PAYLOAD_TYPES: dict[str, type[Payload]] = {
    cls.TYPE: cls
    for cls in (SessionCreated, MessageAppended, MessagesReplaced, SessionCleared,
                CheckpointCreated, RolledBack, SummaryRecorded, CompactionApplied,
                ConfigChanged, ModelChanged)
}


def decode(type_: str, version: int, data: Mapping[str, Any]) -> Payload:
    try:
        cls = PAYLOAD_TYPES[type_]
    except KeyError:
        raise ValueError(f"unknown event type {type_!r}") from None
    if version > cls.VERSION:
        raise ValueError(f"{type_} v{version} is newer than this code (v{cls.VERSION})")
    return cls.from_data(data, version)


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
        return self.payload.TYPE

    @property
    def version(self) -> int:
        return self.stored_version if self.stored_version is not None else self.payload.VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "seq": self.seq, "type": self.type,
                "version": self.version, "data": self.payload.to_data(),
                "tokens": self.tokens, "created_at": self.created_at.isoformat(),
                "idempotency_key": self.idempotency_key, "hash": self.hash,
                "position": self.position}


def timestamp(dt: datetime) -> str:
    """Microsecond UTC text: exactly what timestamptz keeps (``%Y-%m-%dT%H:%M:%S.%fZ``)."""
    d = dt.astimezone(UTC)
    return (f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:"
            f"{d.second:02d}.{d.microsecond:06d}Z")


def event_hash(
    prev_hash: str, *, session_id: str, seq: int, type_: str, version: int,
    data: Mapping[str, Any], tokens: int, created_at: datetime, idempotency_key: str | None,
) -> str:
    """sha256(previous hash ‖ canonical encoding of the event), hex."""
    return chain_hash(prev_hash, canonical_body(
        session_id=session_id, seq=seq, type_=type_, version=version,
        data_json=canonical_json(data), tokens=tokens, created_at=created_at,
        idempotency_key=idempotency_key))


def canonical_body(
    *, session_id: str, seq: int, type_: str, version: int, data_json: bytes, tokens: int,
    created_at: datetime, idempotency_key: str | None,
) -> bytes:
    """``canonical_json`` of the event envelope, composed around already-encoded data.

    Byte for byte what ``canonical_json({...})`` gives (keys sorted, no spaces), but
    the message inside ``data`` is encoded once per append instead of twice.
    """
    def s(value: str | None) -> str:
        return "null" if value is None else encode_basestring(value)

    head = f'{{"created_at":{s(timestamp(created_at))},"data":'
    tail = (f',"idempotency_key":{s(idempotency_key)},"seq":{seq},"session_id":{s(session_id)},'
            f'"tokens":{tokens},"type":{s(type_)},"version":{version}}}')
    return head.encode() + data_json + tail.encode()


def chain_hash(prev_hash: str, body: bytes) -> str:
    return hashlib.sha256(bytes.fromhex(prev_hash) + body).hexdigest()


def make_event(
    session_id: str, seq: int, payload: Payload, prev_hash: str, *,
    created_at: datetime, idempotency_key: str | None = None,
) -> Event:
    if created_at.tzinfo is None:
        raise ValueError("created_at must be timezone-aware (a naive time hashes differently "
                         "on machines in other time zones)")
    tokens = payload_tokens(payload)
    data = payload.to_data()
    floats = has_float(data)
    data_json = canonical_json(data, floats=floats)
    digest = chain_hash(prev_hash, canonical_body(
        session_id=session_id, seq=seq, type_=payload.TYPE, version=payload.VERSION,
        data_json=data_json, tokens=tokens, created_at=created_at,
        idempotency_key=idempotency_key))
    return Event(session_id, seq, payload, created_at, digest, tokens, idempotency_key,
                 encoded=None if floats else data_json)


def rehash(event: Event, prev_hash: str, data: Mapping[str, Any]) -> str:
    """The hash ``event`` should have given its stored ``data`` (for ``verify``)."""
    return event_hash(
        prev_hash, session_id=event.session_id, seq=event.seq, type_=event.type,
        version=event.version, data=data, tokens=event.tokens, created_at=event.created_at,
        idempotency_key=event.idempotency_key,
    )
