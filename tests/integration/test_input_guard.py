"""Fuzzed messages and configs: every failure typed, nothing written; the message cap."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger import Ledger
from contextledger.errors import ContextLedgerError, InvalidMessage

text = st.text(alphabet=st.characters(codec=None), max_size=40)
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
messages = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"]), "content": text}
    ),
    st.dictionaries(st.sampled_from(["role", "content", "name", "tool_call_id"]), json_like),
    json_like,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    message=messages,
    config=st.dictionaries(
        st.sampled_from(
            ["keep_recent", "min_score", "model_overrides", "protected_tools", "max_message_bytes"]
        ),
        json_like,
        max_size=2,
    ),
)
async def test_fuzzed_input_is_typed_and_atomic(
    ledger: Ledger, message: Any, config: dict[str, Any]
) -> None:
    session = await ledger.session("fuzz")
    head = (await session.refresh()).head
    try:
        seq = await session.add_message(message)
    except ContextLedgerError as exc:
        assert exc.code
        assert (await session.refresh()).head == head
    else:
        assert seq == head + 1
    try:
        await ledger.session("fuzz", config=config)
    except ContextLedgerError as exc:
        assert exc.code
        assert (await session.refresh()).head in (head, head + 1)
    assert (await ledger.verify("fuzz")).ok


@pytest.mark.parametrize("where", ["\x00", "\ud800"])
async def test_nul_and_lone_surrogates_are_refused_naming_the_field(
    ledger: Ledger, where: str
) -> None:
    session = await ledger.session("s")
    with pytest.raises(InvalidMessage) as info:
        await session.add_message({"role": "user", "content": f"a{where}b"})
    assert info.value.details["field"] == "message.content"
    assert session.head == 1


async def test_per_message_size_cap(ledger: Ledger) -> None:
    session = await ledger.session("s", config={"max_message_bytes": 2048})
    head = session.head
    await session.add_message({"role": "user", "content": "x" * 1900})
    with pytest.raises(InvalidMessage) as info:
        await session.add_message({"role": "user", "content": "x" * 2100})
    assert info.value.details["limit"] == 2048
    assert info.value.details["field"] == "message"
    with pytest.raises(InvalidMessage):
        await session.set_messages([{"role": "user", "content": "y" * 4000}])
    assert (await session.refresh()).head == head + 1


async def test_per_message_size_cap_holds_for_add_messages(ledger: Ledger) -> None:
    """Regression: add_messages skipped max_message_bytes (add_message and set_messages
    enforce it); one message over the cap rejects the whole batch."""
    session = await ledger.session("s", config={"max_message_bytes": 2048})
    head = session.head
    with pytest.raises(InvalidMessage) as info:
        await session.add_messages(
            [{"role": "user", "content": "x" * 100}, {"role": "user", "content": "x" * 2100}]
        )
    assert info.value.details["limit"] == 2048
    assert (await session.refresh()).head == head
    assert await session.add_messages([{"role": "user", "content": "x" * 1900}]) == [head + 1]
