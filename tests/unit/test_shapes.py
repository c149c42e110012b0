"""Pure provider-shape logic: detection and the lossless conversions (issue 13, 7 and 11)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.core.messages import validate_message
from contextledger.core.shapes import anthropic_to_openai, from_gemini, shape_of, to_openai
from contextledger.errors import InvalidMessage

text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)
args = st.dictionaries(st.text(min_size=1, max_size=8), st.integers() | text, max_size=3)


@pytest.mark.parametrize(
    ("message", "shape"),
    [
        ({"role": "user", "content": "hi"}, "openai"),
        ({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}, "openai"),
        ({"role": "model", "parts": [{"text": "hi"}]}, "gemini"),
        ({"role": "user", "parts": [{"text": "hi"}]}, "gemini"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, "responses"),
        ({"type": "message", "role": "user", "content": "hi"}, "responses"),
        ({"role": "user", "content": [{"type": "input_text", "text": "hi"}]}, "responses"),
    ],
)
def test_shape_detection(message: dict[str, Any], shape: str) -> None:
    assert shape_of(message) == shape


@given(st.lists(text, min_size=1, max_size=4), st.lists(st.tuples(text, args), max_size=3))
def test_gemini_model_turns_keep_text_and_calls(texts: list[str], calls: list[Any]) -> None:
    parts: list[dict[str, Any]] = [{"text": t} for t in texts]
    parts += [{"functionCall": {"name": n, "args": a}} for n, a in calls]
    [out] = from_gemini({"role": "model", "parts": parts})
    validate_message(out)
    assert out["content"] == ("\n".join(texts) or (None if calls else ""))
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in out.get("tool_calls", [])
    ]
    assert got == [(n, a) for n, a in calls]
    assert len({c["id"] for c in out.get("tool_calls", [])}) == len(calls)  # ids distinct


@given(args, text, st.lists(text, max_size=3))
def test_anthropic_blocks_to_openai_lose_no_call_or_result(
    tool_input: dict[str, Any], result: str, extra: list[str]
) -> None:
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "t"},
            {"type": "tool_use", "id": "u1", "name": "f", "input": tool_input},
        ],
    }
    user = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "u1", "content": result}]
        + [{"type": "text", "text": e} for e in extra],
    }
    converted = to_openai([assistant, user])
    for m in converted:
        validate_message(m)
    call = converted[0]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == tool_input
    assert converted[1] == {"role": "tool", "tool_call_id": "u1", "content": result}
    if extra:
        assert [b["text"] for b in converted[2]["content"]] == extra
    else:
        assert len(converted) == 2


def test_plain_messages_pass_through_and_images_become_data_urls() -> None:
    plain = {"role": "user", "content": "hi", "name": "ada"}
    assert anthropic_to_openai(plain) == [plain]
    [image] = anthropic_to_openai(
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAA"},
                }
            ],
        }
    )
    assert image["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAA"}}
    ]


def test_unaccepted_gemini_parts_name_the_field_and_the_shapes() -> None:
    with pytest.raises(InvalidMessage) as info:
        from_gemini({"role": "user", "parts": [{"executableCode": {}}]})
    assert info.value.details["field"] == "parts[0]"
    assert "accepted shapes" in str(info.value)
