"""Payload round-trips, decode, the hash chain (recomputed independently) and verify_chain."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.core.chain import GENESIS_HASH, event_hash, make_event, rehash, verify_chain
from contextledger.core.events import (
    PAYLOAD_TYPES,
    CheckpointCreated,
    CompactionApplied,
    ConfigChanged,
    Event,
    MessageAppended,
    MessagesReplaced,
    ModelChanged,
    Payload,
    Pruned,
    RolledBack,
    SessionCleared,
    SessionCreated,
    SessionForked,
    SummaryRecorded,
    decode,
    payload_tokens,
    upcast,
)
from contextledger.errors import EventDecodeError

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
T0_TEXT = "2024-05-01T12:00:00.000000Z"
SID = "s1"


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


SAMPLES: list[Payload] = [
    SessionCreated("gpt-4o", {"threshold": 0.8, "keep": [1, 2]}, {"owner": "t"}),
    SessionCreated(),
    MessageAppended(user("hi"), 3),
    MessageAppended(
        {"role": "tool", "tool_call_id": "c1", "content": "x"}, 2, True, "chars", "synthetic"
    ),
    MessagesReplaced((user("a"), {"role": "assistant", "content": "b"}), (1, 2), "chars"),
    MessagesReplaced((), ()),
    SessionCleared(),
    CheckpointCreated("before-refactor"),
    CheckpointCreated(),
    RolledBack(4),
    RolledBack(4, 4, "before-refactor"),
    SummaryRecorded(2, 5, user("summary"), 7, {"model": "m", "attempts": 1}),
    CompactionApplied(
        "drop_prune", ((2, 0), (3, 1)), (Pruned((4, 0), user("[pruned]"), 1),), 100, 40
    ),
    CompactionApplied("noop"),
    ConfigChanged({"max_tokens": 1000}),
    ModelChanged("claude", "anthropic", (((2, 0), 10), ((3, 1), 4))),
    ModelChanged(None, ""),
    SessionForked("parent", 7, "ab" * 32, {"owner": "t"}),
    SessionForked("parent", 1, "00" * 32),
]


@pytest.mark.parametrize("payload", SAMPLES, ids=lambda p: type(p).__name__)
def test_payload_round_trips_through_its_data(payload: Payload) -> None:
    data = payload.to_data()
    assert decode(payload.TYPE, payload.VERSION, data) == payload
    # ... and through JSON text, as it is stored.
    stored = json.loads(json.dumps(data))
    assert decode(payload.TYPE, payload.VERSION, stored) == payload


def test_every_payload_type_has_a_sample() -> None:
    assert {p.TYPE for p in SAMPLES} == set(PAYLOAD_TYPES)
    assert len(PAYLOAD_TYPES) == 11


def test_payload_data_is_literal_json() -> None:
    assert CompactionApplied("s", ((2, 0),), (Pruned((4, 1), user("p"), 1),), 9, 3).to_data() == {
        "strategy": "s",
        "drop": [[2, 0]],
        "prune": [{"ref": [4, 1], "message": {"role": "user", "content": "p"}, "tokens": 1}],
        "tokens_before": 9,
        "tokens_after": 3,
    }
    assert ModelChanged("m", "c", (((2, 0), 10),)).to_data() == {
        "model": "m",
        "counter": "c",
        "recount": [[2, 0, 10]],
    }
    assert MessageAppended(user("x"), 2).to_data() == {
        "message": {"role": "user", "content": "x"},
        "critical": False,
        "tokens": 2,
        "counter": "",
    }


def test_decode_rejects_unknown_types() -> None:
    with pytest.raises(EventDecodeError, match="unknown event type") as caught:
        decode("message.deleted", 1, {})
    assert caught.value.code == "UNKNOWN_EVENT_TYPE"


@pytest.mark.parametrize("cls", list(PAYLOAD_TYPES.values()), ids=lambda c: c.TYPE)
def test_decode_rejects_future_versions(cls: type[Payload]) -> None:
    with pytest.raises(EventDecodeError, match="newer") as caught:
        decode(cls.TYPE, cls.VERSION + 1, {})
    assert caught.value.code == "EVENT_FROM_NEWER_CODE"


def test_upcasters_bring_old_shapes_forward_centrally() -> None:
    """A made-up v2 of checkpoint.created renames ``label`` to ``name``: stored v1 data
    reaches the v2 reader through the chain, and a missing step is a typed error."""
    chain = {("checkpoint.created", 1): lambda d: {"name": d["label"]}}
    v1 = {"label": "before-tool"}
    assert upcast("checkpoint.created", 1, v1, upcasters=chain, target=2) == {"name": "before-tool"}
    assert v1 == {"label": "before-tool"}  # the stored data itself is never rewritten
    with pytest.raises(EventDecodeError) as caught:
        upcast("checkpoint.created", 1, v1, upcasters={}, target=2)
    assert caught.value.code == "NO_UPCASTER"


def test_verify_hashes_stored_bytes_not_upcast_data() -> None:
    """An upcaster must never change what verify hashes: rehash uses the stored data."""
    event = make_event("s", 1, CheckpointCreated("x"), GENESIS_HASH, created_at=T0)
    stored = {"label": "x"}
    assert rehash(event, GENESIS_HASH, stored) == event.hash
    assert rehash(event, GENESIS_HASH, {"name": "x"}) != event.hash


def test_payload_tokens() -> None:
    assert payload_tokens(MessageAppended(user("x"), 5)) == 5
    assert payload_tokens(SummaryRecorded(1, 2, user("s"), 7)) == 7
    assert payload_tokens(MessagesReplaced((user("a"), user("b")), (3, 4))) == 7
    assert payload_tokens(CheckpointCreated()) == 0
    assert payload_tokens(CompactionApplied("s", tokens_after=5)) == 0


# --------------------------------------------------------------------------- hashing


def independent_hash(prev: str, envelope: dict[str, Any]) -> str:
    """sha256(prev bytes ‖ sorted-key compact UTF-8 JSON of the envelope), without the library."""
    body = json.dumps(envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(bytes.fromhex(prev) + body.encode("utf-8")).hexdigest()


def test_hash_of_a_simple_event_matches_a_literal_body() -> None:
    event = make_event(SID, 3, SessionCleared(), GENESIS_HASH, created_at=T0)
    body = (
        '{"created_at":"2024-05-01T12:00:00.000000Z","data":{},"idempotency_key":null,'
        '"seq":3,"session_id":"s1","tokens":0,"type":"session.cleared","version":1}'
    )
    expected = hashlib.sha256(b"\x00" * 32 + body.encode()).hexdigest()
    assert event.hash == expected


def test_make_event_hash_is_recomputable_independently() -> None:
    payload = MessageAppended({"role": "user", "content": "héllo ✓", "z": [1, None]}, 4)
    prev = hashlib.sha256(b"previous").hexdigest()
    event = make_event(SID, 2, payload, prev, created_at=T0, idempotency_key="k-1")
    assert event.hash == independent_hash(
        prev,
        {
            "session_id": SID,
            "seq": 2,
            "type": "message.appended",
            "version": 1,
            "data": {
                "message": {"role": "user", "content": "héllo ✓", "z": [1, None]},
                "critical": False,
                "tokens": 4,
                "counter": "",
            },
            "tokens": 4,
            "created_at": T0_TEXT,
            "idempotency_key": "k-1",
        },
    )
    assert (event.session_id, event.seq, event.tokens, event.idempotency_key) == (SID, 2, 4, "k-1")
    assert event.created_at == T0 and event.payload is payload


def test_hash_uses_the_jsonb_stable_encoding_of_floats() -> None:
    payload = ConfigChanged({"a": 1e16, "b": 1.0, "c": 0.5})
    event = make_event(SID, 2, payload, GENESIS_HASH, created_at=T0)
    # 1e16 -> 10000000000000000 and 1.0 -> 1 (integral floats encoded as integers).
    assert event.hash == independent_hash(
        GENESIS_HASH,
        {
            "session_id": SID,
            "seq": 2,
            "type": "config.changed",
            "version": 1,
            "data": {"config": {"a": 10**16, "b": 1, "c": 0.5}},
            "tokens": 0,
            "created_at": T0_TEXT,
            "idempotency_key": None,
        },
    )


def base_envelope() -> dict[str, Any]:
    return {
        "session_id": SID,
        "seq": 5,
        "type_": "message.appended",
        "version": 1,
        "data": {"message": user("a"), "critical": False, "tokens": 1, "counter": ""},
        "tokens": 1,
        "created_at": T0,
        "idempotency_key": None,
    }


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("session_id", "s2"),
        ("seq", 6),
        ("type_", "summary.recorded"),
        ("version", 2),
        ("data", {"message": user("b"), "critical": False, "tokens": 1, "counter": ""}),
        ("data", {"message": user("a"), "critical": True, "tokens": 1, "counter": ""}),
        (
            "data",
            {
                "message": user("a"),
                "critical": False,
                "tokens": 1,
                "counter": "",
                "origin": "synthetic",
            },
        ),
        ("tokens", 2),
        ("created_at", T0 + timedelta(microseconds=1)),
        ("idempotency_key", "k"),
        ("idempotency_key", ""),
    ],
)
def test_changing_any_envelope_field_changes_the_hash(name: str, value: Any) -> None:
    base = base_envelope()
    changed = {**base, name: value}
    assert event_hash(GENESIS_HASH, **changed) != event_hash(GENESIS_HASH, **base)


def test_changing_the_previous_hash_changes_the_hash() -> None:
    base = base_envelope()
    other = "0" * 63 + "1"
    assert event_hash(other, **base) != event_hash(GENESIS_HASH, **base)


def test_make_event_hash_depends_on_every_input() -> None:
    payload = MessageAppended(user("a"), 1)
    base = make_event(SID, 2, payload, GENESIS_HASH, created_at=T0)
    variants = [
        make_event(SID, 2, MessageAppended(user("b"), 1), GENESIS_HASH, created_at=T0),
        make_event(SID, 2, MessageAppended(user("a"), 2), GENESIS_HASH, created_at=T0),
        make_event(SID, 3, payload, GENESIS_HASH, created_at=T0),
        make_event("s2", 2, payload, GENESIS_HASH, created_at=T0),
        make_event(SID, 2, payload, GENESIS_HASH, created_at=T0 + timedelta(seconds=1)),
        make_event(SID, 2, payload, GENESIS_HASH, created_at=T0, idempotency_key="k"),
        make_event(SID, 2, payload, base.hash, created_at=T0),
        # Same data {"label": null}-free shape but another type.
        make_event(SID, 2, CheckpointCreated(), GENESIS_HASH, created_at=T0),
    ]
    hashes = {base.hash, *(v.hash for v in variants)}
    assert len(hashes) == len(variants) + 1


def test_type_alone_changes_the_hash() -> None:
    # SessionCleared and a data-less envelope of another type: same data {}, tokens 0.
    env = {**base_envelope(), "data": {}, "tokens": 0}
    a = event_hash(GENESIS_HASH, **{**env, "type_": "session.cleared"})
    b = event_hash(GENESIS_HASH, **{**env, "type_": "checkpoint.created"})
    assert a != b


def test_created_at_is_hashed_as_utc_microseconds() -> None:
    payload = CheckpointCreated("x")
    utc = make_event(SID, 2, payload, GENESIS_HASH, created_at=T0)
    plus_two = timezone(timedelta(hours=2))
    same_instant = make_event(
        SID, 2, payload, GENESIS_HASH, created_at=datetime(2024, 5, 1, 14, 0, tzinfo=plus_two)
    )
    assert same_instant.hash == utc.hash
    assert utc.hash == independent_hash(
        GENESIS_HASH,
        {
            "session_id": SID,
            "seq": 2,
            "type": "checkpoint.created",
            "version": 1,
            "data": {"label": "x"},
            "tokens": 0,
            "created_at": T0_TEXT,
            "idempotency_key": None,
        },
    )


def chain(payloads: list[Payload], keys: dict[int, str] | None = None) -> list[Event]:
    events: list[Event] = []
    prev = GENESIS_HASH
    for i, payload in enumerate(payloads, start=1):
        key = (keys or {}).get(i)
        event = make_event(
            SID, i, payload, prev, created_at=T0 + timedelta(seconds=i), idempotency_key=key
        )
        events.append(event)
        prev = event.hash
    return events


CHAIN_PAYLOADS: list[Payload] = [
    SessionCreated("m"),
    MessageAppended(user("a"), 1),
    MessageAppended({"role": "assistant", "content": "b", "score": 1e16}, 2),
    CheckpointCreated("c"),
    MessageAppended(user("d"), 3),
]


def test_each_hash_chains_on_the_previous_one() -> None:
    events = chain(CHAIN_PAYLOADS)
    prev = GENESIS_HASH
    for event in events:
        data = event.payload.to_data()
        # Integral floats hash as integers; this chain's only float is 1e16.
        if "score" in data.get("message", {}):
            data = {**data, "message": {**data["message"], "score": 10**16}}
        assert event.hash == independent_hash(
            prev,
            {
                "session_id": SID,
                "seq": event.seq,
                "type": event.type,
                "version": 1,
                "data": data,
                "tokens": event.tokens,
                "created_at": (T0 + timedelta(seconds=event.seq)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "idempotency_key": None,
            },
        )
        prev = event.hash


@pytest.mark.parametrize("payload", SAMPLES, ids=lambda p: type(p).__name__)
def test_rehash_over_stored_data_equals_the_event_hash(payload: Payload) -> None:
    prev = hashlib.sha256(b"x").hexdigest()
    event = make_event(SID, 7, payload, prev, created_at=T0, idempotency_key="key")
    assert rehash(event, prev, payload.to_data()) == event.hash
    # Stored as JSON text and parsed back: lists instead of tuples, same hash.
    assert rehash(event, prev, json.loads(json.dumps(payload.to_data()))) == event.hash
    assert rehash(event, GENESIS_HASH, payload.to_data()) != event.hash


def test_rehash_is_stable_through_jsonb_number_printing() -> None:
    payload = MessageAppended(
        {"role": "user", "content": "x", "n": [1e16, 1.0, -0.0, 0.1, 1e-7, 1e300]}, 1
    )
    event = make_event(SID, 2, payload, GENESIS_HASH, created_at=T0)
    # What jsonb gives back (numeric printed without exponent, see test_messages.py).
    stored = {
        **payload.to_data(),
        "message": {"role": "user", "content": "x", "n": [10**16, 1.0, 0.0, 0.1, 1e-7, 10**300]},
    }
    assert rehash(event, GENESIS_HASH, stored) == event.hash


def test_rehash_detects_changed_data() -> None:
    event = make_event(SID, 2, MessageAppended(user("a"), 1), GENESIS_HASH, created_at=T0)
    tampered = {**event.payload.to_data(), "message": user("A")}
    assert rehash(event, GENESIS_HASH, tampered) != event.hash


def test_event_to_dict() -> None:
    event = make_event(
        SID, 2, CheckpointCreated("x"), GENESIS_HASH, created_at=T0, idempotency_key="k"
    )
    assert event.to_dict() == {
        "session_id": SID,
        "seq": 2,
        "type": "checkpoint.created",
        "version": 1,
        "data": {"label": "x"},
        "tokens": 0,
        "created_at": "2024-05-01T12:00:00+00:00",
        "idempotency_key": "k",
        "hash": event.hash,
        "position": None,
    }


# --------------------------------------------------------------------------- verify_chain


def test_verify_clean_chain_is_ok() -> None:
    events = chain(CHAIN_PAYLOADS, keys={3: "k3"})
    report = verify_chain(SID, events, 5, events[-1].hash)
    assert (report.ok, report.events, report.first_bad_seq, report.reason) == (True, 5, None, None)
    assert report.session_id == SID


def test_verify_clean_chain_with_stored_data_is_ok() -> None:
    events = [
        replace(e, data=json.loads(json.dumps(e.payload.to_data()))) for e in chain(CHAIN_PAYLOADS)
    ]
    assert verify_chain(SID, events, 5, events[-1].hash).ok


def test_verify_empty_chain_is_ok() -> None:
    report = verify_chain(SID, [], 0, GENESIS_HASH)
    assert report.ok and report.events == 0


def test_verify_finds_tampered_data() -> None:
    events = chain(CHAIN_PAYLOADS)
    stored = dict(events[2].payload.to_data())
    stored["message"] = {**stored["message"], "content": "B"}
    events[2] = replace(events[2], data=stored)
    report = verify_chain(SID, events, 5, events[-1].hash)
    assert not report.ok
    assert report.first_bad_seq == 3
    assert report.events == 3


def test_verify_finds_tampered_tokens_in_data() -> None:
    events = chain(CHAIN_PAYLOADS)
    events[1] = replace(events[1], data={**events[1].payload.to_data(), "tokens": 99})
    report = verify_chain(SID, events, 5, events[-1].hash)
    assert (report.ok, report.first_bad_seq) == (False, 2)


def test_verify_finds_a_tampered_envelope() -> None:
    events = chain(CHAIN_PAYLOADS)
    events[3] = replace(events[3], created_at=events[3].created_at + timedelta(microseconds=1))
    report = verify_chain(SID, events, 5, events[-1].hash)
    assert (report.ok, report.first_bad_seq) == (False, 4)


def test_verify_finds_a_rewritten_hash() -> None:
    events = chain(CHAIN_PAYLOADS)
    events[1] = replace(events[1], hash="f" * 64)
    report = verify_chain(SID, events, 5, events[-1].hash)
    assert (report.ok, report.first_bad_seq) == (False, 2)


def test_verify_finds_a_gap() -> None:
    events = chain(CHAIN_PAYLOADS)
    del events[2]  # seqs 1, 2, 4, 5
    report = verify_chain(SID, events, 5, events[-1].hash)
    assert (report.ok, report.first_bad_seq, report.events) == (False, 3, 3)


def test_verify_finds_a_duplicate_seq() -> None:
    events = chain(CHAIN_PAYLOADS)
    events.insert(2, events[1])  # seqs 1, 2, 2, 3, 4, 5
    report = verify_chain(SID, events, 5, events[-1].hash)
    assert (report.ok, report.first_bad_seq) == (False, 3)


def test_verify_finds_a_chain_not_starting_at_one() -> None:
    events = chain(CHAIN_PAYLOADS)[1:]
    report = verify_chain(SID, events, 5, events[-1].hash)
    assert (report.ok, report.first_bad_seq) == (False, 1)


def test_verify_finds_a_head_beyond_the_events() -> None:
    events = chain(CHAIN_PAYLOADS)
    report = verify_chain(SID, events, 7, events[-1].hash)
    assert (report.ok, report.first_bad_seq, report.events) == (False, 6, 5)


def test_verify_finds_events_beyond_the_head() -> None:
    events = chain(CHAIN_PAYLOADS)
    report = verify_chain(SID, events, 3, events[2].hash)
    assert (report.ok, report.first_bad_seq) == (False, 4)


def test_verify_finds_a_truncated_tail() -> None:
    events = chain(CHAIN_PAYLOADS)
    report = verify_chain(SID, events[:4], 5, events[-1].hash)
    assert (report.ok, report.first_bad_seq) == (False, 5)


def test_verify_finds_a_wrong_last_hash() -> None:
    events = chain(CHAIN_PAYLOADS)
    report = verify_chain(SID, events, 5, events[3].hash)
    assert (report.ok, report.first_bad_seq) == (False, 5)
    assert report.reason is not None and "last_hash" in report.reason


@given(
    data=st.dictionaries(
        st.text(max_size=5),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=10),
        ),
        max_size=5,
    ),
    seq=st.integers(1, 2**40),
    tokens=st.integers(0, 2**31 - 1),
    key=st.none() | st.text(max_size=8),
    session_id=st.text(min_size=1, max_size=8),
)
def test_composed_body_is_the_canonical_encoding_of_the_envelope(
    data: dict[str, object], seq: int, tokens: int, key: str | None, session_id: str
) -> None:
    """The hot path composes the envelope around pre-encoded data; it must equal the
    canonical encoding of the whole envelope, or verify would disagree with append."""
    from contextledger.core.chain import canonical_body, timestamp
    from contextledger.core.encoding import canonical_json

    at = datetime(2026, 11, 21, 6, 7, 8, 901234, tzinfo=UTC)
    composed = canonical_body(
        session_id=session_id,
        seq=seq,
        type_="message.appended",
        version=1,
        data_json=canonical_json(data),
        tokens=tokens,
        created_at=at,
        idempotency_key=key,
    )
    whole = canonical_json(
        {
            "session_id": session_id,
            "seq": seq,
            "type": "message.appended",
            "version": 1,
            "data": data,
            "tokens": tokens,
            "created_at": timestamp(at),
            "idempotency_key": key,
        }
    )
    assert composed == whole
    assert timestamp(at) == at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
