"""The hash chain: each event's hash is sha256(previous hash ‖ its canonical encoding).

``verify_chain`` walks stored events and names the first seq that does not fit; it
hashes the data exactly as stored (never an upcast of it), so old events verify.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any

from contextledger.core.encoding import canonical_json, has_float
from contextledger.core.events import Event, Payload, SessionForked, payload_tokens
from contextledger.errors import InvalidArgument

GENESIS_HASH = "0" * 64
#: ``(seq, type, data) -> data as stored``: a session's sealing of content (``make_event``).
Seal = Callable[[int, str, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` found: ``ok``, how many events it read, and where and why the
    chain breaks when it does (``first_bad_seq``, ``reason``)."""

    session_id: str
    ok: bool
    events: int
    first_bad_seq: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Anchor:
    """A (seq, hash) pair kept outside the database: ``verify`` checks the chain still
    reaches it, which catches a truncated tail with a rewound session row."""

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> Anchor:
        """``SEQ:HASH`` (what ``contextledger anchor`` prints) to an ``Anchor``."""
        seq, sep, digest = str(text).partition(":")
        if not sep or not seq.isdigit() or int(seq) < 1 or not digest:
            raise InvalidArgument(f"an anchor is SEQ:HASH, got {text!r}", field="anchor")
        return cls(int(seq), digest)


def timestamp(dt: datetime) -> str:
    """Microsecond UTC text: exactly what timestamptz keeps (``%Y-%m-%dT%H:%M:%S.%fZ``)."""
    d = dt.astimezone(UTC)
    return (
        f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:"
        f"{d.second:02d}.{d.microsecond:06d}Z"
    )


def event_hash(
    prev_hash: str,
    *,
    session_id: str,
    seq: int,
    type_: str,
    version: int,
    data: Mapping[str, Any],
    tokens: int,
    created_at: datetime,
    idempotency_key: str | None,
) -> str:
    """sha256(previous hash ‖ canonical encoding of the event), hex."""
    return chain_hash(
        prev_hash,
        canonical_body(
            session_id=session_id,
            seq=seq,
            type_=type_,
            version=version,
            data_json=canonical_json(data),
            tokens=tokens,
            created_at=created_at,
            idempotency_key=idempotency_key,
        ),
    )


def canonical_body(
    *,
    session_id: str,
    seq: int,
    type_: str,
    version: int,
    data_json: bytes,
    tokens: int,
    created_at: datetime,
    idempotency_key: str | None,
) -> bytes:
    """``canonical_json`` of the event envelope, composed around already-encoded data.

    Byte for byte what ``canonical_json({...})`` gives (keys sorted, no spaces), but
    the message inside ``data`` is encoded once per append instead of twice.
    """

    def s(value: str | None) -> str:
        return "null" if value is None else encode_basestring(value)

    head = f'{{"created_at":{s(timestamp(created_at))},"data":'
    tail = (
        f',"idempotency_key":{s(idempotency_key)},"seq":{seq},"session_id":{s(session_id)},'
        f'"tokens":{tokens},"type":{s(type_)},"version":{version}}}'
    )
    return head.encode() + data_json + tail.encode()


def chain_hash(prev_hash: str, body: bytes) -> str:
    return hashlib.sha256(bytes.fromhex(prev_hash) + body).hexdigest()


def make_event(
    session_id: str,
    seq: int,
    payload: Payload,
    prev_hash: str,
    *,
    created_at: datetime,
    idempotency_key: str | None = None,
    seal: Seal | None = None,
) -> Event:
    """The hashed event of ``payload`` at ``seq``. ``seal`` (a session's data key, see
    ``store/sealing.py``) turns the data into the form stored: the hash covers that form,
    so the chain verifies after the key is gone."""
    if created_at.tzinfo is None:
        raise ValueError(
            "created_at must be timezone-aware (a naive time hashes differently "
            "on machines in other time zones)"
        )
    tokens = payload_tokens(payload)
    data = payload.to_data()
    if seal is not None:
        data = seal(seq, payload.TYPE, data)
    floats = has_float(data)
    data_json = canonical_json(data, floats=floats)
    digest = chain_hash(
        prev_hash,
        canonical_body(
            session_id=session_id,
            seq=seq,
            type_=payload.TYPE,
            version=payload.VERSION,
            data_json=data_json,
            tokens=tokens,
            created_at=created_at,
            idempotency_key=idempotency_key,
        ),
    )
    return Event(
        session_id,
        seq,
        payload,
        created_at,
        digest,
        tokens,
        idempotency_key,
        data=data if seal is not None else None,
        encoded=None if floats else data_json,
    )


def rehash(event: Event, prev_hash: str, data: Mapping[str, Any]) -> str:
    """The hash ``event`` should have given its stored ``data`` (for ``verify``)."""
    return event_hash(
        prev_hash,
        session_id=event.session_id,
        seq=event.seq,
        type_=event.type,
        version=event.version,
        data=data,
        tokens=event.tokens,
        created_at=event.created_at,
        idempotency_key=event.idempotency_key,
    )


def verify_chain(
    session_id: str, events: Iterable[Event], head: int, last_hash: str
) -> VerifyReport:
    """Walk the hash chain; report the first seq whose hash or numbering is wrong.

    A fork's events start with its parent's (recursively): each ``session.forked``
    must follow the very event it names (parent id, seq and hash), the events before
    it belong to that parent and those after it to the fork, so the walk proves the
    fork's own chain and the prefix it stands on, and the last owner is ``session_id``.
    """
    prev = GENESIS_HASH
    count = 0
    owner: str | None = None
    for event in events:
        count += 1
        if owner is None:
            owner = event.session_id
        if isinstance(event.payload, SessionForked):
            fork = event.payload
            if (fork.parent_session_id, fork.parent_seq, fork.parent_hash) != (
                owner,
                event.seq - 1,
                prev,
            ) or event.session_id == owner:
                return VerifyReport(
                    session_id,
                    False,
                    count,
                    event.seq,
                    f"fork point does not match: it names {fork.parent_session_id!r} at seq "
                    f"{fork.parent_seq}, the chain before it is {owner!r} at {event.seq - 1}",
                )
            owner = event.session_id
        elif event.session_id != owner:
            return VerifyReport(
                session_id,
                False,
                count,
                event.seq,
                f"event of session {event.session_id!r} inside {owner!r}'s part of the chain",
            )
        if event.seq != count:
            return VerifyReport(
                session_id,
                False,
                count,
                count,
                f"expected seq {count}, found {event.seq} (gap or duplicate)",
            )
        data = event.data if event.data is not None else event.payload.to_data()
        if rehash(event, prev, data) != event.hash:
            return VerifyReport(
                session_id,
                False,
                count,
                event.seq,
                "hash mismatch: the event or an earlier one was altered",
            )
        prev = event.hash
    if count != head:
        return VerifyReport(
            session_id,
            False,
            count,
            min(count, head) + 1,
            f"session head is {head} but {count} events exist",
        )
    if count and owner != session_id:
        return VerifyReport(
            session_id, False, count, count, f"the chain ends in session {owner!r}, not this one"
        )
    if count and prev != last_hash:
        return VerifyReport(
            session_id, False, count, count, "session's last_hash does not match the last event"
        )
    return VerifyReport(session_id, True, count)
