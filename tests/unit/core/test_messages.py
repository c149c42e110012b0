"""validate_message, copy_json and canonical_json: rejections, accepted shapes, jsonb stability."""

from __future__ import annotations

import copy
import json
import math
from decimal import Decimal
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.core.encoding import canonical_json
from contextledger.core.messages import MAX_DEPTH, MAX_MESSAGE_BYTES, copy_json, validate_message
from contextledger.errors import InvalidMessage
from tests.examples import examples

# --------------------------------------------------------------------------- helpers


def field_of(message: Any) -> str:
    """Validate ``message``, expect a rejection and return the field it names."""
    with pytest.raises(InvalidMessage) as info:
        validate_message(message)
    assert info.value.code == "INVALID_MESSAGE"
    field = info.value.details["field"]
    assert isinstance(field, str)
    return field


def nested(levels: int, leaf: Any = "leaf") -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def container_ids(value: Any) -> set[int]:
    """ids of every dict and list inside ``value`` (including itself)."""
    out: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            out.add(id(v))
            stack.extend(v.values())
        elif isinstance(v, list):
            out.add(id(v))
            stack.extend(v)
    return out


# --------------------------------------------------------------------------- rejections: shape


@pytest.mark.parametrize("message", [None, "hello", ["role", "user"], 3, ("user", "x")])
def test_non_dict_message_is_rejected(message: Any) -> None:
    assert field_of(message) == "message"


@pytest.mark.parametrize("role", ["bot", "User", "", None, 1])
def test_unknown_role_is_rejected(role: Any) -> None:
    assert field_of({"role": role, "content": "hi"}) == "role"


@pytest.mark.parametrize("role", [["user"], {"name": "user"}, []], ids=["list", "dict", "empty"])
def test_unhashable_role_is_rejected_as_invalid_message(role: Any) -> None:
    # Roles come from untrusted JSON; a list or dict role must be an InvalidMessage
    # (field "role"), not a TypeError from the frozenset membership test.
    assert field_of({"role": role, "content": "hi"}) == "role"


def test_missing_role_is_rejected() -> None:
    assert field_of({"content": "hi"}) == "role"


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "function"])
def test_missing_content_is_rejected(role: str) -> None:
    assert field_of({"role": role}) == "content"


def test_missing_content_on_tool_message_is_rejected() -> None:
    assert field_of({"role": "tool", "tool_call_id": "c1"}) == "content"


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "function"])
def test_none_content_is_rejected_without_tool_calls(role: str) -> None:
    assert field_of({"role": role, "content": None}) == "content"


def test_none_content_with_empty_tool_calls_is_rejected() -> None:
    # An empty list is not "having tool calls".
    assert field_of({"role": "assistant", "content": None, "tool_calls": []}) == "content"


def test_none_content_on_user_with_tool_calls_is_still_rejected() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert field_of({"role": "user", "content": None, "tool_calls": [call]}) == "content"


@pytest.mark.parametrize("content", [1, 1.5, True, {"type": "text", "text": "x"}, ("a",)])
def test_content_of_wrong_type_is_rejected(content: Any) -> None:
    assert field_of({"role": "user", "content": content}) == "content"


def test_content_block_not_a_dict_is_rejected() -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "a"}, "plain"]}
    assert field_of(message) == "content[1]"


@pytest.mark.parametrize("block", [{"text": "no type"}, {"type": 3}, {"type": None}])
def test_content_block_without_string_type_is_rejected(block: dict[str, Any]) -> None:
    assert field_of({"role": "user", "content": [block]}) == "content[0]"


@pytest.mark.parametrize("tcid", [None, "", 7, ["c1"]])
def test_tool_message_without_tool_call_id_is_rejected(tcid: Any) -> None:
    message: dict[str, Any] = {"role": "tool", "content": "result"}
    if tcid is not None:
        message["tool_call_id"] = tcid
    assert field_of(message) == "tool_call_id"


def test_tool_calls_on_a_non_assistant_message_are_rejected() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert field_of({"role": "user", "content": "x", "tool_calls": [call]}) == "tool_calls"


@pytest.mark.parametrize("tool_calls", [{"id": "c1"}, "c1", 5])
def test_tool_calls_not_a_list_is_rejected(tool_calls: Any) -> None:
    message = {"role": "assistant", "content": "x", "tool_calls": tool_calls}
    assert field_of(message) == "tool_calls"


def test_tool_call_without_string_id_is_rejected() -> None:
    good = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    bad = {"type": "function", "function": {"name": "g", "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "tool_calls": [good, bad]}
    assert field_of(message) == "tool_calls[1]"


@pytest.mark.parametrize("call", ["c1", ["c1"], {"id": 3}, {"id": None}])
def test_tool_call_that_is_not_a_dict_with_id_is_rejected(call: Any) -> None:
    message = {"role": "assistant", "content": "x", "tool_calls": [call]}
    assert field_of(message) == "tool_calls[0]"


@pytest.mark.parametrize("arguments", [{"path": "/etc"}, ["a"], 3, True])
def test_tool_call_arguments_that_are_not_json_text_are_rejected(arguments: Any) -> None:
    # (rendered for Anthropic or Gemini they failed every later request of the session)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert field_of(message) == "tool_calls[0].function.arguments"


def test_tool_call_arguments_that_do_not_parse_are_kept_as_sent() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert validate_message(message) == message  # a model's broken JSON is still its call


# --------------------------------------------------------------------------- rejections: JSON


class Opaque:
    pass


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        frozenset({"a"}),
        b"bytes",
        bytearray(b"x"),
        Opaque(),
        ("a", "b"),
        Decimal("1.5"),
        1 + 2j,
        range(3),
    ],
    ids=[
        "set",
        "frozenset",
        "bytes",
        "bytearray",
        "object",
        "tuple",
        "decimal",
        "complex",
        "range",
    ],
)
def test_non_json_values_are_rejected_with_their_path(value: Any) -> None:
    assert field_of({"role": "user", "content": "x", "extra": value}) == "message.extra"


def test_non_json_value_deep_inside_a_block_names_its_path() -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "a"},
            {"type": "image", "source": {"data": b"\x89PNG"}},
        ],
    }
    assert field_of(message) == "message.content[1].source.data"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_rejected(value: float) -> None:
    assert field_of({"role": "user", "content": "x", "score": value}) == "message.score"
    assert field_of({"role": "user", "content": "x", "m": {"v": [1, value]}}) == "message.m.v[1]"


@pytest.mark.parametrize("key", [1, 1.5, None, True, ("a",)])
def test_non_string_keys_are_rejected(key: Any) -> None:
    assert field_of({"role": "user", "content": "x", "meta": {key: "v"}}) == "message.meta"


def test_non_string_key_at_top_level_is_rejected() -> None:
    assert field_of({"role": "user", "content": "x", 5: "v"}) == "message"


def test_nul_character_in_content_is_rejected() -> None:
    assert field_of({"role": "user", "content": "a\x00b"}) == "message.content"


def test_nul_character_in_a_key_is_rejected() -> None:
    assert field_of({"role": "user", "content": "x", "meta": {"a\x00": 1}}) == "message.meta.a\x00"


def test_nul_character_in_a_block_text_is_rejected() -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "\x00"}]}
    assert field_of(message) == "message.content[0].text"


def test_lone_surrogate_in_content_is_rejected() -> None:
    assert field_of({"role": "user", "content": "ok \ud800 no"}) == "message.content"


def test_lone_surrogate_in_a_key_is_rejected() -> None:
    message = {"role": "user", "content": "x", "meta": {"\udfff": 1}}
    assert field_of(message) == "message.meta.\udfff"


def test_surrogate_pair_written_as_one_code_point_is_accepted() -> None:
    # U+1F600 is a real code point, not a surrogate: it encodes to 4 UTF-8 bytes.
    message = {"role": "user", "content": "\U0001f600"}
    assert validate_message(message) == message


def test_nesting_at_the_limit_is_accepted_and_one_deeper_is_rejected() -> None:
    # The message is depth 0 and "x" depth 1, so with k wrapping lists the leaf sits at
    # depth k + 1: k = MAX_DEPTH - 1 is the deepest allowed, k = MAX_DEPTH is too deep.
    ok = {"role": "user", "content": "x", "x": nested(MAX_DEPTH - 1)}
    assert validate_message(ok) == ok
    too_deep = {"role": "user", "content": "x", "x": nested(MAX_DEPTH)}
    assert field_of(too_deep) == "message.x" + "[0]" * MAX_DEPTH


def test_very_deep_dict_nesting_is_rejected_not_a_recursion_error() -> None:
    value: Any = {}
    for _ in range(5000):
        value = {"k": value}
    assert field_of({"role": "user", "content": "x", "x": value}).startswith("message.x.k.k")


# '{"content":"' is 12 bytes and '","role":"user"}' is 16: the canonical encoding of a
# user message is its content's byte length plus 28.
OVERHEAD = 28


def test_message_exactly_at_the_size_limit_is_accepted() -> None:
    message = {"role": "user", "content": "a" * (MAX_MESSAGE_BYTES - OVERHEAD)}
    assert len(canonical_json(message)) == MAX_MESSAGE_BYTES
    assert validate_message(message) == message


def test_message_one_byte_over_the_limit_is_rejected() -> None:
    with pytest.raises(InvalidMessage) as info:
        validate_message({"role": "user", "content": "a" * (MAX_MESSAGE_BYTES - OVERHEAD + 1)})
    assert info.value.details == {"field": "message", "size": MAX_MESSAGE_BYTES + 1}


def test_size_limit_counts_utf8_bytes_not_characters() -> None:
    # "é" is two bytes in UTF-8 (and ensure_ascii=False keeps it raw, not \u00e9).
    chars = (MAX_MESSAGE_BYTES - OVERHEAD) // 2
    ok = {"role": "user", "content": "é" * chars}
    assert validate_message(ok) == ok
    with pytest.raises(InvalidMessage) as info:
        validate_message({"role": "user", "content": "é" * (chars + 1)})
    assert info.value.details == {"field": "message", "size": MAX_MESSAGE_BYTES + 2}


# --------------------------------------------------------------------------- accepted shapes

OPENAI_CALL: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
        },
        {"id": "call_2", "type": "function", "function": {"name": "grep", "arguments": "{}"}},
    ],
}
OPENAI_RESULT: dict[str, Any] = {
    "role": "tool",
    "tool_call_id": "call_1",
    "name": "read_file",
    "content": "print('hi')",
}
LEGACY_FUNCTION_CALL: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "function_call": {"name": "f", "arguments": "{}"},
}
FUNCTION_RESULT: dict[str, Any] = {"role": "function", "name": "f", "content": "42"}
ANTHROPIC_CALL: dict[str, Any] = {
    "role": "assistant",
    "content": [
        {"type": "thinking", "thinking": "Let me look.", "signature": "EqQBCkYI"},
        {"type": "text", "text": "Reading the file."},
        {
            "type": "tool_use",
            "id": "toolu_01",
            "name": "read_file",
            "input": {"path": "a.py", "limit": 20, "ratio": 0.5, "flags": [True, None]},
        },
    ],
}
ANTHROPIC_RESULT: dict[str, Any] = {
    "role": "user",
    "content": [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_01",
            "content": [{"type": "text", "text": "print('hi')"}],
            "is_error": False,
        },
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "text", "text": "what does it print?", "cache_control": {"type": "ephemeral"}},
    ],
}
MULTIMODAL_OPENAI: dict[str, Any] = {
    "role": "user",
    "content": [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ],
}


@pytest.mark.parametrize(
    "message",
    [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "Sure.", "name": "bot"},
        {"role": "assistant", "content": "Calling.", "tool_calls": OPENAI_CALL["tool_calls"]},
        OPENAI_CALL,
        OPENAI_RESULT,
        LEGACY_FUNCTION_CALL,
        FUNCTION_RESULT,
        ANTHROPIC_CALL,
        ANTHROPIC_RESULT,
        MULTIMODAL_OPENAI,
        {"role": "user", "content": []},
        {"role": "user", "content": "x", "meta": {"n": 10**30, "f": -1.5e-300, "z": -0.0}},
    ],
    ids=[
        "system",
        "developer",
        "empty",
        "named",
        "text+calls",
        "openai-call",
        "openai-result",
        "function-call",
        "function-result",
        "anthropic-call",
        "anthropic-result",
        "multimodal",
        "no-blocks",
        "numbers",
    ],
)
def test_accepted_shapes_come_back_equal(message: dict[str, Any]) -> None:
    before = copy.deepcopy(message)
    result = validate_message(message)
    assert result == before
    assert type(result) is dict
    assert message == before


def test_assistant_without_content_key_but_with_tool_calls_is_accepted() -> None:
    message = {"role": "assistant", "tool_calls": OPENAI_CALL["tool_calls"]}
    assert validate_message(message) == message


def test_a_read_only_mapping_is_accepted_and_copied_to_a_dict() -> None:
    inner = {"a": [1, 2]}
    proxy = MappingProxyType({"role": "user", "content": "x", "meta": MappingProxyType(inner)})
    result = validate_message(proxy)
    assert result == {"role": "user", "content": "x", "meta": {"a": [1, 2]}}
    assert type(result) is dict and type(result["meta"]) is dict
    result["meta"]["a"].append(3)
    assert inner == {"a": [1, 2]}


def test_result_is_not_aliased_to_the_input() -> None:
    message = copy.deepcopy(ANTHROPIC_CALL)
    result = validate_message(message)
    assert container_ids(result).isdisjoint(container_ids(message))
    # Mutating the result leaves the input alone ...
    result["content"][2]["input"]["flags"].append("new")
    result["content"].pop(0)
    result["extra"] = 1
    assert message == ANTHROPIC_CALL
    # ... and mutating the input leaves the result alone.
    snapshot = copy.deepcopy(result)
    message["content"][2]["input"]["path"] = "b.py"
    message["content"].clear()
    message["role"] = "user"
    assert result == snapshot


def test_copy_json_rejects_with_the_given_path_and_copies() -> None:
    with pytest.raises(InvalidMessage) as info:
        copy_json({"a": [1, {"b": {1, 2}}]}, "config")
    assert info.value.details == {"field": "config.a[1].b"}
    source = {"a": [1, {"b": None}]}
    copied = copy_json(source)
    assert copied == source
    assert container_ids(copied).isdisjoint(container_ids(source))


# --------------------------------------------------------------------------- hypothesis

# Text jsonb can hold: the utf-8 codec excludes lone surrogates; NUL is excluded explicitly.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=15,
)
RESERVED = {"role", "content", "tool_calls", "function_call", "tool_call_id"}
BLOCK = st.builds(
    lambda t, extra: {**extra, "type": t}, TEXT, st.dictionaries(TEXT, JSON, max_size=3)
)
CONTENT = TEXT | st.lists(BLOCK, max_size=3)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"]))
    extra = draw(st.dictionaries(TEXT.filter(lambda k: k not in RESERVED), JSON, max_size=4))
    message: dict[str, Any] = {**extra, "role": role, "content": draw(CONTENT)}
    if role == "tool":
        message["tool_call_id"] = draw(TEXT.filter(bool))
    return message


@settings(max_examples=examples(50), deadline=None)
@given(messages())
def test_any_json_message_comes_back_as_an_equal_unaliased_copy(message: dict[str, Any]) -> None:
    before = copy.deepcopy(message)
    result = validate_message(message)
    assert result == before
    assert message == before
    assert container_ids(result).isdisjoint(container_ids(message))


@settings(max_examples=examples(30), deadline=None)
@given(st.dictionaries(TEXT, JSON, max_size=6), st.randoms(use_true_random=False))
def test_canonical_json_does_not_depend_on_key_order(value: dict[str, Any], rnd: Any) -> None:
    def shuffled(v: Any) -> Any:
        if isinstance(v, dict):
            keys = list(v)
            rnd.shuffle(keys)
            return {k: shuffled(v[k]) for k in keys}
        if isinstance(v, list):
            return [shuffled(x) for x in v]
        return v

    assert canonical_json(shuffled(value)) == canonical_json(value)


def test_canonical_json_literal_encoding() -> None:
    value = {"b": [1, "é", None, True], "a": {"z": 1, "y": 2.5}}
    assert canonical_json(value) == '{"a":{"y":2.5,"z":1},"b":[1,"é",null,true]}'.encode()
    assert canonical_json({"b": 1, "a": 2}) == canonical_json({"a": 2, "b": 1}) == b'{"a":2,"b":1}'


def test_canonical_json_refuses_non_finite_numbers() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


# --------------------------------------------------------------------------- jsonb stability


def pg_numeric_text(number: Decimal) -> str:
    """How PostgreSQL's numeric_out prints a number that jsonb parsed from ``number``'s text.

    numeric_in keeps the digits exactly and sets the display scale to
    ``max(0, digits after the point - exponent)``; numeric_out never uses an exponent
    and prints exactly that many fractional digits. So "1e+16" prints as
    "10000000000000000", "1.0" stays "1.0", "1e-07" prints as "0.0000001" and
    "1.5e-07" as "0.00000015". numeric has no negative zero: "-0.0" prints "0.0".
    ``format(Decimal(text), "f")`` does exactly the same fixed-point expansion.
    """
    text = format(number, "f")
    if number.is_zero():
        text = text.lstrip("-")
    return text


def through_jsonb(value: Any) -> Any:
    """What a driver gives back after ``value`` is written (as Python's JSON) into jsonb.

    Python writes floats with ``repr``; jsonb reads that text as numeric; the driver
    ``json.loads`` the text numeric_out prints (an int when there is no point).
    Key order and duplicate keys do not matter here: canonical_json sorts keys.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.loads(pg_numeric_text(Decimal(json.dumps(value))))
    if isinstance(value, dict):
        return {k: through_jsonb(v) for k, v in value.items()}
    if isinstance(value, list):
        return [through_jsonb(v) for v in value]
    raise TypeError(type(value))


@pytest.mark.parametrize(
    ("number", "db_returns"),
    [
        (1e16, 10**16),  # "1e+16" -> numeric prints 10000000000000000 -> int
        (1.0, 1.0),  # "1.0" keeps scale 1 -> "1.0" -> float
        (-0.0, 0.0),  # "-0.0" -> numeric zero has no sign -> "0.0"
        (1e300, 10**300),  # "1e+300" -> 1 followed by 300 zeros -> int
        (1e-7, 1e-7),  # "1e-07" -> "0.0000001" -> parses back to the same float
        (0.1, 0.1),  # "0.1" -> "0.1"
        (1.5e-7, 1.5e-7),  # "1.5e-07" -> "0.00000015"
        (1e23, 10**23),  # repr "1e+23" (the float is really 99999999999999991611392)
        (123.0, 123.0),
        (2.5, 2.5),
    ],
)
def test_jsonb_model_matches_postgres_output(number: float, db_returns: Any) -> None:
    got = through_jsonb(number)
    assert got == db_returns and type(got) is type(db_returns)


@pytest.mark.parametrize(
    ("number", "encoded"),
    [
        (1e16, b"10000000000000000"),
        (1.0, b"1"),
        (-0.0, b"0"),
        (1e300, b"1" + b"0" * 300),
        (1e-7, b"1e-07"),
        (0.1, b"0.1"),
        (1e23, b"1" + b"0" * 23),
        (-2.0, b"-2"),
        (1.5e16, b"15000000000000000"),
    ],
)
def test_canonical_encoding_of_floats_is_the_jsonb_stable_one(
    number: float, encoded: bytes
) -> None:
    # Integral floats are encoded as the integer their decimal text denotes (what numeric
    # prints, modulo a ".0" that json.loads turns back into an integral float); the
    # others keep their shortest repr, which numeric's fixed-point text parses back to.
    assert canonical_json(number) == encoded
    assert canonical_json(through_jsonb(number)) == encoded
    assert canonical_json({"v": [number]}) == b'{"v":[' + encoded + b"]}"


@pytest.mark.parametrize(
    "number",
    [
        1e16,
        1.0,
        -0.0,
        1e300,
        1e-7,
        0.1,
        1e23,
        5e-324,
        1.7976931348623157e308,
        -123456.789,
        2.0**53 + 2,
    ],
)
def test_canonical_encoding_survives_jsonb(number: float) -> None:
    value = {"n": number, "l": [number, {"m": number}]}
    assert canonical_json(through_jsonb(value)) == canonical_json(value)


@settings(max_examples=examples(120), deadline=None)
@given(JSON)
def test_canonical_encoding_of_any_json_value_survives_jsonb(value: Any) -> None:
    assert canonical_json(through_jsonb(value)) == canonical_json(value)


def test_canonical_json_encodes_tuples_like_lists() -> None:
    # json.dumps writes a tuple as an array, and jsonb hands it back as a list; the number
    # canonicalization must see inside it too, or {"t": (1e16,)} hashes as [1e+16] before
    # storage and as [10000000000000000] after it (verify would then report tampering).
    assert canonical_json({"t": (1e16, 1.0)}) == canonical_json({"t": [1e16, 1.0]})
    assert canonical_json({"t": (1e16, 1.0)}) == b'{"t":[10000000000000000,1]}'


def test_canonical_encoding_survives_a_second_round_trip() -> None:
    value: dict[str, Any] = {"a": 1e16, "b": 1.0, "c": [0.1, -0.0, 1e-7]}
    twice = through_jsonb(through_jsonb(value))
    assert canonical_json(twice) == canonical_json(through_jsonb(value)) == canonical_json(value)
