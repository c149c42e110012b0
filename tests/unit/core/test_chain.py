"""The hash chain: what verify hashes, and what must never make old events look altered."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar

from contextledger.core.chain import GENESIS_HASH, make_event, verify_chain
from contextledger.core.events import MessageAppended, SessionCreated, SessionForked


def test_verify_hashes_with_the_stored_version_not_the_code_version() -> None:
    """A future schema bump must not make every older event look tampered with."""

    class MessageAppendedV2(MessageAppended):
        VERSION: ClassVar[int] = 2

    at = datetime(2026, 11, 21, tzinfo=UTC)
    event = make_event(
        "s", 1, MessageAppended({"role": "user", "content": "hi"}, 3), GENESIS_HASH, created_at=at
    )
    read_back = replace(
        event,
        payload=MessageAppendedV2(**event.payload.__dict__),
        stored_version=1,
        data=event.payload.to_data(),
    )
    assert read_back.version == 1
    assert verify_chain("s", [read_back], 1, event.hash).ok


def _fork_chain() -> list[Any]:
    """``p`` (created + 2 messages) and its fork ``f`` at seq 3 with one message."""
    at = datetime(2026, 11, 27, tzinfo=UTC)
    events = [make_event("p", 1, SessionCreated(), GENESIS_HASH, created_at=at)]
    for seq in (2, 3):
        message = MessageAppended({"role": "user", "content": f"m{seq}"}, 1)
        events.append(make_event("p", seq, message, events[-1].hash, created_at=at))
    fork = SessionForked("p", 3, events[-1].hash)
    events.append(make_event("f", 4, fork, events[-1].hash, created_at=at))
    message = MessageAppended({"role": "user", "content": "mine"}, 1)
    events.append(make_event("f", 5, message, events[-1].hash, created_at=at))
    return events


def test_a_fork_verifies_through_its_parent_prefix() -> None:
    events = _fork_chain()
    assert verify_chain("f", events, 5, events[-1].hash).ok
    # the same events are not the parent's chain: it ends in the fork
    report = verify_chain("p", events, 5, events[-1].hash)
    assert not report.ok and "ends in session 'f'" in (report.reason or "")


def test_a_fork_point_that_names_another_place_is_reported() -> None:
    events = _fork_chain()
    for wrong in (
        SessionForked("q", 3, events[2].hash),  # another parent
        SessionForked("p", 2, events[2].hash),  # another seq
        SessionForked("p", 3, events[1].hash),  # another hash
    ):
        forged = make_event("f", 4, wrong, events[2].hash, created_at=events[3].created_at)
        chain = [*events[:3], forged]
        report = verify_chain("f", chain, 4, forged.hash)
        assert not report.ok and report.first_bad_seq == 4
        assert "fork point" in (report.reason or "")


def test_an_event_of_another_session_inside_the_chain_is_reported() -> None:
    events = _fork_chain()
    at = events[0].created_at
    stray = make_event(
        "x",
        5,
        MessageAppended({"role": "user", "content": "mine"}, 1),
        events[3].hash,
        created_at=at,
    )
    report = verify_chain("f", [*events[:4], stray], 5, stray.hash)
    assert not report.ok and report.first_bad_seq == 5
