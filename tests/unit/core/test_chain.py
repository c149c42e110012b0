"""The hash chain: what verify hashes, and what must never make old events look altered."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import ClassVar

from contextledger.core.chain import GENESIS_HASH, make_event, verify_chain
from contextledger.core.events import MessageAppended


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
