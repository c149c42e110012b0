"""Token counters: exact values checked against an independently built tiktoken encoding."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger.core.tokens import (
    REPLY_PRIMING,
    CallableCounter,
    CharsCounter,
    TiktokenCounter,
    TokenCounter,
    encoding_for_model,
    get_counter,
    get_encoding,
)
from contextledger.errors import ConfigError
from tests.examples import examples
from tests.tiktoken_reference import reference_inputs

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# --- an independent reference: tiktoken's own constructor, loader pointed at the files ---


@pytest.fixture(scope="module")
def reference() -> Callable[[str], Callable[[str], int]]:
    """``reference(encoding)(text)``: a token count from our encoding, once
    test_encoding_is_what_tiktoken_builds has shown it is tiktoken's own (same pattern,
    ranks and special tokens as ``openai_public``'s constructor hands ``Encoding``)."""

    def counter(name: str) -> Callable[[str], int]:
        enc = get_encoding(name)
        return lambda text: len(enc.encode(text, disallowed_special=()))

    return counter


# --- import cost / offline ------------------------------------------------------------------

FRESH_PROCESS = """
import json, os, sys
import contextledger.core.tokens
light = ['litellm' in sys.modules, 'tiktoken' in sys.modules]
from contextledger.core.tokens import get_encoding
counts = [len(get_encoding('cl100k_base').encode('hello world'))]
print(json.dumps({'light': light, 'counts': counts, 'cache': os.environ['TIKTOKEN_CACHE_DIR']}))
"""


@pytest.fixture(scope="module", autouse=True)
def _fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """A new interpreter, started before this module's first test and read by its last
    two (at the end of the file): its start, imports and an encoding (~0.5 s) run
    beside the tests in this process instead of before them."""
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache)}
    process = subprocess.Popen(
        [sys.executable, "-c", FRESH_PROCESS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    yield process, cache
    if process.poll() is None:
        process.kill()
    process.communicate()


@pytest.fixture(scope="module")
def fresh_process(_fresh: tuple[Any, Path]) -> tuple[dict[str, Any], Path]:
    """What the new interpreter found: what importing the counters loads, and what
    building an encoding writes (one: both are built by the same offline path, and the
    bigger one costs ~0.3 s more)."""
    process, cache = _fresh
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return json.loads(out), cache


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_encoding_is_what_tiktoken_builds(name: str) -> None:
    # Everything tiktoken.Encoding is built from, compared whole (200k ranks, not a few
    # samples): what tiktoken's own constructor and loader read from the same file.
    # (Building a second Encoding from them to compare counts cost ~0.3 s a run.)
    ours = get_encoding(name)
    state = ours.__getstate__()  # tiktoken's pickle state: the constructor's arguments
    assert state == reference_inputs(name)
    assert ours.name == name


def test_get_encoding_is_cached_and_thread_safe() -> None:
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(get_encoding("o200k_base")))]
    threads += [threading.Thread(target=lambda: results.append(get_encoding("o200k_base")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] is results[1] is get_encoding("o200k_base")


def test_unknown_encoding_is_config_error() -> None:
    with pytest.raises(ConfigError):
        get_encoding("p50k_base")
    with pytest.raises(ConfigError):
        TiktokenCounter(encoding="r50k_base")


# --- encoding per model -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("azure/gpt-4o", "o200k_base"),
        ("gpt-4o-2024-08-06", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"),
        ("gpt-4.1-2025-04-14", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-5.1-codex", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("openai/o4-mini-2025-04-16", "o200k_base"),
        ("ft:gpt-4o-mini:org:x:1", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("azure/gpt-35-turbo", "cl100k_base"),
        ("olmo-2", "cl100k_base"),  # starts with "o" but is no o-series model
        ("ollama/llama3.1", "cl100k_base"),
        (None, "cl100k_base"),
    ],
)
def test_encoding_for_model(model: str | None, encoding: str) -> None:
    assert encoding_for_model(model) == encoding
    assert TiktokenCounter(model).name == f"tiktoken:{encoding}"


# --- message accounting -----------------------------------------------------------------

# The OpenAI cookbook's example ("How to count tokens with tiktoken"), whose totals
# the cookbook confirmed against the API: 129 prompt tokens for gpt-4-0613 (cl100k),
# 124 for gpt-4o (o200k).
COOKBOOK = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate "
        "jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on "
        "opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client "
        "deliverable.",
    },
]


def test_cookbook_totals_match_openai_api() -> None:
    assert TiktokenCounter("gpt-4-0613").count_messages(COOKBOOK) == 129
    assert TiktokenCounter("gpt-4o").count_messages(COOKBOOK) == 124


def _png(w: int, h: int) -> str:
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    raw = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))
    return base64.b64encode(raw).decode()


TOOL_INPUT = {"city": "Paris", "unit": "c"}


def test_tiktoken_message_shapes(reference: Any) -> None:
    n = reference("o200k_base")
    c = TiktokenCounter("gpt-4o")

    plain = {"role": "user", "content": "hello world"}
    assert c.count_message(plain) == 3 + n("user") + n("hello world")
    assert c.count_messages([plain]) == 3 + n("user") + n("hello world") + 3

    named = {"role": "user", "name": "alice", "content": "hi"}
    assert c.count_message(named) == 3 + n("user") + n("hi") + n("alice") + 1

    openai_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert c.count_message(openai_call) == 3 + n("assistant") + n("get_weather") + n(
        '{"city": "Paris"}'
    )

    tool_result = {"role": "tool", "tool_call_id": "call_1", "content": "22C and sunny"}
    assert c.count_message(tool_result) == 3 + n("tool") + n("22C and sunny")

    anthropic_use = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "The user wants weather.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "EmwKAhgB"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": TOOL_INPUT},
        ],
    }
    assert c.count_message(anthropic_use) == (
        3
        + n("assistant")
        + n("The user wants weather.")
        + n("EmwKAhgB")
        + n("Let me check.")
        + n("get_weather")
        + n('{"city":"Paris","unit":"c"}')  # compact JSON of the input
    )

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png"}}
    image["source"]["data"] = _png(200, 100)  # type: ignore[index]
    anthropic_result = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "22C"}, image],
            },
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "plain string result"},
        ],
    }
    # gpt-4o -> OpenAI image rule: 200x100 is one tile: 85 + 170 = 255
    assert c.count_message(anthropic_result) == (
        3 + n("user") + n("22C") + 255 + n("plain string result")
    )

    unknown = {"type": "document", "source": {"type": "text", "data": "x"}}
    assert c.count_message({"role": "user", "content": [unknown]}) == 3 + n("user") + n(
        json.dumps(unknown, separators=(",", ":"))
    )

    reasoning = {
        "role": "assistant",
        "content": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan."}]}],
    }
    # summary_text is an unknown block type -> its compact JSON
    summary_json = json.dumps({"type": "summary_text", "text": "Plan."}, separators=(",", ":"))
    assert c.count_message(reasoning) == 3 + n("assistant") + n(summary_json)


def test_image_rule_follows_counter_model() -> None:
    block = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_png(200, 100)}"}}
    msg = {"role": "user", "content": [block]}
    base = CharsCounter().count_message({"role": "user", "content": []})
    assert base == 3 + 1  # "user": ceil(4/4) = 1
    assert CharsCounter(model="gpt-4o").count_message(msg) == base + 255  # OpenAI: 1 tile
    # Anthropic: 200*100/750 = 26.67 -> 27
    assert CharsCounter(model="claude-sonnet-4").count_message(msg) == base + 27
    assert CharsCounter(model="gemini-2.5-pro").count_message(msg) == base + 258


# --- chars ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ratio", "expected"),
    [
        ("", 4.0, 0),
        ("hello world", 4.0, 3),  # 11/4 = 2.75 -> 3
        ("abcdefgh", 4.0, 2),  # 8/4 = 2
        ("abcdefgh", 3.5, 3),  # 8/3.5 = 2.29 -> 3
        ("你好世界", 4.0, 4),  # 4 ideographs, 1 each
        ("你好, world", 4.0, 4),  # 2 ideographs + ceil(7/4) = 2
        ("こんにちは", 4.0, 5),  # hiragana
        ("カタカナ", 4.0, 4),  # katakana
        ("안녕하세요", 4.0, 5),  # hangul syllables
        ("你好。", 4.0, 3),  # CJK full stop counts as one
        ("café", 4.0, 1),  # non-ASCII Latin goes by the ratio: 4/4
    ],
)
def test_chars_counter(text: str, ratio: float, expected: int) -> None:
    assert CharsCounter(ratio).count_text(text) == expected


def test_chars_names_and_validation() -> None:
    assert CharsCounter().name == "chars:4"
    assert CharsCounter(chars_per_token=4.0).name == "chars:4"
    assert get_counter("chars:3.5").name == "chars:3.5"
    for bad in (0, -1.0):
        with pytest.raises(ConfigError):
            CharsCounter(bad)
    # {"role": "user", "content": "hello world"}: 3 + ceil(4/4) + ceil(11/4) = 3 + 1 + 3 = 7
    assert CharsCounter().count_message({"role": "user", "content": "hello world"}) == 7
    assert CharsCounter().count_messages([{"role": "user", "content": "hello world"}]) == 10


# --- callable ---------------------------------------------------------------------------


def test_callable_counter() -> None:
    def words(text: str) -> int:
        return len(text.split())

    c = get_counter(words)
    assert isinstance(c, CallableCounter)
    assert c.name == "callable:test_callable_counter.<locals>.words"
    assert CallableCounter(words, name="words:v1").name == "words:v1"
    # 3 + words("user") = 1 + words("a b c") = 3
    assert c.count_message({"role": "user", "content": "a b c"}) == 7
    bad = CallableCounter(lambda text: -1)
    with pytest.raises(ConfigError):
        bad.count_text("x")


# --- factory ----------------------------------------------------------------------------


def test_get_counter_specs() -> None:
    assert get_counter("tiktoken", "gpt-4o").name == "tiktoken:o200k_base"
    assert get_counter("tiktoken").name == "tiktoken:cl100k_base"
    assert get_counter("tiktoken:o200k_base").name == "tiktoken:o200k_base"
    assert get_counter("chars").name == "chars:4"
    assert get_counter(" CHARS:2 ").name == "chars:2"
    existing = CharsCounter(3.0)
    assert get_counter(existing) is existing
    for bad in ("bogus", "chars:abc", "chars:0", "chars:nan", "tiktoken:p50k_base", ""):
        with pytest.raises(ConfigError):
            get_counter(bad, "gpt-4o")
    with pytest.raises(ConfigError):
        get_counter("litellm")  # needs a model
    with pytest.raises(ConfigError):
        get_counter(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("gpt-4o", "tiktoken:o200k_base"),
        ("azure/gpt-4o-2024-08-06", "tiktoken:o200k_base"),
        ("gpt-4", "tiktoken:cl100k_base"),
        ("claude-sonnet-4-20250514", "litellm:anthropic"),
        ("anthropic/claude-3-5-sonnet-20241022", "litellm:anthropic"),
        ("ollama/llama3.1", "tiktoken:cl100k_base"),
        ("some-unknown-model", "tiktoken:cl100k_base"),
        (None, "tiktoken:cl100k_base"),
    ],
)
def test_get_counter_auto(model: str | None, name: str) -> None:
    counter = get_counter("auto", model)
    assert counter.name == name
    assert isinstance(counter, TokenCounter)


# --- properties -------------------------------------------------------------------------

_text = st.text(max_size=40)
_block = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _text),
    st.builds(lambda t: {"type": "thinking", "thinking": t}, _text),
    st.builds(
        lambda name, v: {"type": "tool_use", "id": "x", "name": name, "input": {"v": v}},
        _text,
        st.integers(),
    ),
    st.builds(lambda t: {"type": "tool_result", "tool_use_id": "x", "content": t}, _text),
    st.builds(lambda t: {"type": "mystery", "payload": t}, _text),
)
_message = st.builds(
    lambda role, content, name: {"role": role, "content": content, **name},
    st.sampled_from(["system", "user", "assistant", "tool"]),
    st.one_of(st.none(), _text, st.lists(_block, max_size=3)),
    st.one_of(st.just({}), st.builds(lambda n: {"name": n}, st.text(min_size=1, max_size=8))),
)
_messages = st.lists(_message, max_size=4)


@pytest.mark.parametrize("spec", ["chars", "chars:2.5", "tiktoken:o200k_base", "tiktoken"])
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=_messages, b=_messages)
def test_counts_non_negative_and_additive(spec: str, a: list[Any], b: list[Any]) -> None:
    c = get_counter(spec)
    ca, cb, cab = c.count_messages(a), c.count_messages(b), c.count_messages(a + b)
    assert ca >= REPLY_PRIMING and cb >= REPLY_PRIMING
    assert cab == ca + cb - REPLY_PRIMING
    assert all(c.count_message(m) >= 3 for m in a)


# --- a fresh interpreter (started by _fresh above; last, so it has had time) ----------


def test_import_is_light(fresh_process: tuple[dict[str, Any], Path]) -> None:
    assert fresh_process[0]["light"] == [False, False]


def test_encodings_built_without_touching_tiktoken_cache(
    fresh_process: tuple[dict[str, Any], Path],
) -> None:
    # A read-only-style cache dir must stay empty and the env var unchanged.
    found, cache = fresh_process
    assert found["counts"] == [2]
    assert found["cache"] == str(cache)
    assert list(cache.iterdir()) == []
