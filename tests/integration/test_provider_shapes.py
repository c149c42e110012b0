"""Provider shapes in and out (issue 13, findings 7 and 11), through litellm's converters."""

from __future__ import annotations

import json

import pytest

from contextledger import ConcurrencyError, InvalidArgument, InvalidMessage, Ledger

pytestmark = pytest.mark.integration

SYSTEM = {"role": "system", "content": "You are terse."}


async def test_responses_items_and_gemini_contents_are_accepted_with_the_original() -> None:
    """Finding 11: a Responses item or Gemini's role ``model`` was rejected with no hint."""
    async with Ledger.open("memory://") as ledger:
        s = await ledger.session("shapes", model="gpt-4o")
        responses_user = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "weather?"}],
        }
        call = {
            "type": "function_call",
            "call_id": "c1",
            "name": "weather",
            "arguments": '{"city": "Oslo"}',
        }
        output = {"type": "function_call_output", "call_id": "c1", "output": "4 C"}
        gemini = {"role": "model", "parts": [{"text": "It is 4 C in Oslo."}]}
        for m in (responses_user, call, output, gemini):
            await s.add_message(m)
        view = await s.view()
        assert view == [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "content": "4 C", "tool_call_id": "c1"},
            {"role": "assistant", "content": "It is 4 C in Oslo."},
        ]
        originals = [e.payload.to_data().get("original") async for e in s.events()]
        assert originals[1:] == [responses_user, call, output, gemini]  # seq 1: session.created
        assert (await s.verify()).ok


async def test_gemini_function_results_become_tool_messages() -> None:
    async with Ledger.open("memory://") as ledger:
        s = await ledger.session("g", model="gemini-2.0-flash")
        await s.add_message({"role": "user", "parts": [{"text": "two lookups"}]})
        await s.add_message(
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "a", "args": {}}},
                    {"functionCall": {"name": "b", "args": {"x": 1}}},
                ],
            }
        )
        seq = await s.add_message(
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "a", "response": {"content": "A"}}},
                    {"functionResponse": {"name": "b", "response": {"value": 2}}},
                ],
            }
        )
        view = await s.view()
        ids = [c["id"] for c in view[1]["tool_calls"]]
        assert [(m["role"], m.get("tool_call_id")) for m in view[2:]] == [
            ("tool", ids[0]),
            ("tool", ids[1]),
        ]
        assert json.loads(view[3]["content"]) == {"value": 2}
        assert seq == s.head


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (
            {"role": "model", "parts": [{"inlineData": {"mimeType": "image/png", "data": "x"}}]},
            "parts[0]",
        ),
        ({"role": "critic", "parts": []}, "parts"),
    ],
)
async def test_unaccepted_shapes_get_a_hint_and_write_nothing(
    message: dict[str, object], field: str
) -> None:
    async with Ledger.open("memory://") as ledger:
        s = await ledger.session("bad")
        head = s.head
        with pytest.raises(InvalidMessage) as info:
            await s.add_message(message)
        assert info.value.details["field"] == field
        assert "accepted shapes" in str(info.value)
        assert s.head == head


async def _conversation(ledger: Ledger, model: str) -> object:
    s = await ledger.session("render", model=model)
    for m in (
        SYSTEM,
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "4 C"},
        {"role": "assistant", "content": "4 C."},
    ):
        await s.add_message(m)
    return s


async def test_anthropic_rendering_has_system_separate_and_tool_result_blocks() -> None:
    """Finding 7: the request view was always OpenAI-chat shaped."""
    async with Ledger.open("memory://") as ledger:
        s = await _conversation(ledger, "claude-sonnet-4-20250514")
        request = await s.request_for("anthropic")  # type: ignore[attr-defined]
        assert request.system == "You are terse."
        assert [m["role"] for m in request.messages] == ["user", "assistant", "user", "assistant"]
        [use] = request.messages[1]["content"]
        assert (use["type"], use["id"], use["name"], use["input"]) == (
            "tool_use",
            "t1",
            "weather",
            {"city": "Oslo"},
        )
        [result] = request.messages[2]["content"]
        assert (result["type"], result["tool_use_id"]) == ("tool_result", "t1")
        listed = await s.get_messages_for_request(provider="anthropic")  # type: ignore[attr-defined]
        assert listed[0] == {"role": "system", "content": "You are terse."}
        assert listed[1:] == request.messages


async def test_gemini_rendering_and_a_bad_provider_name() -> None:
    async with Ledger.open("memory://") as ledger:
        s = await _conversation(ledger, "gemini-2.0-flash")
        request = await s.request_for("gemini")  # type: ignore[attr-defined]
        assert request.system == "You are terse."
        assert [m["role"] for m in request.messages] == ["user", "model", "user", "model"]
        assert "function_call" in request.messages[1]["parts"][0]
        assert "function_response" in request.messages[2]["parts"][0]
        openai = await s.get_messages_for_request(provider="openai")  # type: ignore[attr-defined]
        assert openai == await s.get_messages_for_request()
        with pytest.raises(InvalidArgument) as info:
            await s.get_messages_for_request(provider="cohere")  # type: ignore[attr-defined]
        assert "anthropic" in str(info.value)


async def test_anthropic_shaped_history_renders_valid_for_every_provider() -> None:
    """Finding 11: Anthropic content blocks went out as they were, where OpenAI rejects them."""
    async with Ledger.open("memory://") as ledger:
        s = await ledger.session("mixed", model="claude-sonnet-4-20250514")
        await s.add_message({"role": "user", "content": "weather?"})
        await s.add_message(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "u1", "name": "weather", "input": {"city": "Oslo"}}
                ],
            }
        )
        await s.add_message(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "u1", "content": "4 C"}],
            }
        )
        openai = await s.get_messages_for_request(provider="openai")  # type: ignore[attr-defined]
        assert openai[1]["tool_calls"][0]["function"]["name"] == "weather"
        assert openai[2] == {"role": "tool", "tool_call_id": "u1", "content": "4 C"}
        claude = await s.request_for("anthropic")  # type: ignore[attr-defined]
        assert claude.messages[1]["content"][0]["type"] == "tool_use"
        assert claude.messages[2]["content"][0]["type"] == "tool_result"
        gemini = await s.request_for("gemini")  # type: ignore[attr-defined]
        assert "function_call" in gemini.messages[1]["parts"][0]


async def test_a_retried_gemini_content_with_several_results_writes_nothing_twice() -> None:
    async with Ledger.open("memory://") as ledger:
        s = await ledger.session("g2", model="gemini-2.0-flash")
        await s.add_message({"role": "user", "parts": [{"text": "two lookups"}]})
        await s.add_message(
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "a", "args": {}}},
                    {"functionCall": {"name": "b", "args": {}}},
                ],
            }
        )
        results = {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "a", "response": {"content": "A"}}},
                {"functionResponse": {"name": "b", "response": {"content": "B"}}},
            ],
        }
        first = await s.add_message(results, idempotency_key="turn-3")
        head = s.head
        again = await s.add_message(results, idempotency_key="turn-3")
        assert again == first
        await s.refresh()
        assert s.head == head  # the retry wrote neither result again
        view = await s.view()
        assert [m["role"] for m in view] == ["user", "assistant", "tool", "tool"]


async def test_expected_seq_covers_every_part_of_a_gemini_content() -> None:
    async with Ledger.open("memory://") as ledger:
        s = await ledger.session("g3", model="gemini-2.0-flash")
        await s.add_message(
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "a", "args": {}}},
                    {"functionCall": {"name": "b", "args": {}}},
                ],
            }
        )
        results = {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "a", "response": {"content": "A"}}},
                {"functionResponse": {"name": "b", "response": {"content": "B"}}},
            ],
        }
        seq = await s.add_message(results, expected_seq=s.head)
        assert seq == s.head == 4  # session.created, the calls, two results
        with pytest.raises(ConcurrencyError):
            await s.add_message(results, expected_seq=2)
        assert s.head == 4
