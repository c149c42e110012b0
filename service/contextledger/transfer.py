"""Export a session's events as JSON lines, and import them into another ledger.

A line is one event exactly as stored: ``session_id``, ``seq``, ``type``, ``version``,
``payload`` (the stored data), ``tokens``, ``created_at``, ``idempotency_key``,
``prev_hash`` and ``hash``. Import checks the whole file first (JSON, fields, seq
numbering, every hash recomputed, each ``prev_hash`` the hash before it) and only then
writes, event by event with the original timestamps, through the store's ordinary
append, so the new ledger's chain verifies on its own terms. Under the same session id
the hashes come out identical; under ``--session NEW_ID`` they are recomputed (the
session id is part of what each hash covers).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from contextledger._checks import check_new_session_id
from contextledger.core.chain import GENESIS_HASH, rehash, timestamp
from contextledger.core.events import Event, SessionCreated, decode
from contextledger.errors import ContextLedgerError, InvalidImport, SessionExists, SessionNotFound
from contextledger.ledger import Ledger

#: The fields of a line, with the JSON types they must have.
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "session_id": str,
    "seq": int,
    "type": str,
    "version": int,
    "payload": dict,
    "tokens": int,
    "created_at": str,
    "idempotency_key": (str, type(None)),
    "prev_hash": str,
    "hash": str,
}


@dataclass(frozen=True)
class ImportResult:
    """What an import wrote: the session, how many events, the new chain's last hash."""

    session_id: str
    source_session_id: str
    events: int
    last_hash: str


def event_line(event: Event, prev_hash: str) -> str:
    """One event as an export line (the data as stored, so old events still verify)."""
    data = event.data if event.data is not None else event.payload.to_data()
    return json.dumps(
        {
            "session_id": event.session_id,
            "seq": event.seq,
            "type": event.type,
            "version": event.version,
            "payload": data,
            "tokens": event.tokens,
            "created_at": timestamp(event.created_at),
            "idempotency_key": event.idempotency_key,
            "prev_hash": prev_hash,
            "hash": event.hash,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )


async def export_lines(ledger: Ledger, session_id: str) -> AsyncIterator[str]:
    """The session's events as export lines, in seq order (paged, never all in memory)."""
    session = await ledger.session(session_id, create=False)
    sealed = (await session.refresh()).sealed
    prev = GENESIS_HASH
    async for event in session.events():
        if sealed:
            # the stored chain hashes ciphertext under a key that stays here: the file
            # carries the content in clear, its chain recomputed over it (as --session
            # recomputes it), and an importing ledger with a KEK seals it afresh
            data = event.payload.to_data()
            event = replace(event, data=data, hash=rehash(event, prev, data))
        yield event_line(event, prev)
        prev = event.hash


def _bad(line: int, message: str, **details: Any) -> InvalidImport:
    return InvalidImport(f"line {line}: {message}", line=line, **details)


def _parse_line(number: int, text: str) -> dict[str, Any]:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(number, f"not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise _bad(number, "not a JSON object")
    for name, kind in _FIELDS.items():
        value = record.get(name)
        if name not in record or isinstance(value, bool) or not isinstance(value, kind):
            raise _bad(number, f"field {name!r} is missing or of the wrong type", field=name)
    return record


def parse_export(lines: Iterable[str]) -> list[Event]:
    """The events of an export, checked whole: ``InvalidImport`` names the first bad
    line (bad JSON, a missing field, a gap, an unknown event type, a broken hash)."""
    events: list[Event] = []
    prev = GENESIS_HASH
    source: str | None = None
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        record = _parse_line(number, text)
        if source is None:
            source = record["session_id"]
        elif record["session_id"] != source:
            raise _bad(number, f"session {record['session_id']!r} after {source!r}")
        seq = len(events) + 1
        if record["seq"] != seq:
            raise _bad(number, f"expected seq {seq}, found {record['seq']}")
        try:
            created_at = datetime.fromisoformat(record["created_at"])
            payload = decode(record["type"], record["version"], record["payload"])
        except (ContextLedgerError, ValueError, KeyError, TypeError) as exc:
            raise _bad(number, f"unreadable event ({exc})") from None
        if record["prev_hash"] != prev:
            raise _bad(number, "prev_hash is not the previous event's hash")
        if created_at.tzinfo is None:
            raise _bad(number, "created_at has no time zone")
        if seq == 1 and not isinstance(payload, SessionCreated):
            raise _bad(number, f"the first event must be session.created, not {record['type']}")
        event = Event(
            source,
            seq,
            payload,
            created_at,
            record["hash"],
            record["tokens"],
            record["idempotency_key"],
            None,
            record["payload"],
            record["version"],
        )
        if rehash(event, prev, record["payload"]) != record["hash"]:
            raise _bad(number, "hash mismatch: this event (or the one before) was altered")
        events.append(event)
        prev = record["hash"]
    if not events or source is None:
        raise InvalidImport("the file holds no events", line=0)
    return events


async def import_events(
    ledger: Ledger, events: list[Event], *, session_id: str | None = None
) -> ImportResult:
    """Write checked ``events`` (from ``parse_export``) as a new session (``session_id``,
    default the exported one); ``SessionExists`` if that id is taken, nothing written."""
    source = events[0].session_id
    target = check_new_session_id(session_id or source)
    try:
        await ledger.store.session_info(target)
    except SessionNotFound:
        pass
    else:
        raise SessionExists(
            f"session {target!r} already exists; import under another id (--session)",
            session_id=target,
        )
    first = events[0].payload
    assert isinstance(first, SessionCreated)
    info = await ledger.store.create_session(target, first, created_at=events[0].created_at)
    last = info.last_hash
    for event in events[1:]:
        result = await ledger.store.append(
            target,
            [event.payload],
            created_at=event.created_at,
            expected_seq=event.seq - 1,
            idempotency_key=event.idempotency_key,
        )
        last = result.last_hash
    return ImportResult(target, source, len(events), last)


async def import_lines(
    ledger: Ledger, lines: Iterable[str], *, session_id: str | None = None
) -> ImportResult:
    """``parse_export`` then ``import_events``: the file is checked whole before writing."""
    return await import_events(ledger, parse_export(lines), session_id=session_id)
