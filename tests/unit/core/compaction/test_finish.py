"""Finishing a request view: reasoning blocks for DeepSeek, signed thinking stripped."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.core.compaction.finish import (
    FinishCache,
    add_reasoning_block,
    finish_request_view,
    needs_reasoning_block,
    strip_signed_thinking,
)
from contextledger.core.view import ViewItem


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("deepseek-r1", True),
        ("deepseek/deepseek-reasoner", True),
        ("DeepSeek-V3", True),
        ("openrouter/deepseek/deepseek-chat", True),
        ("gpt-4o", False),
        ("claude-sonnet-4-5", False),
    ],
)
def test_needs_reasoning_block(model: str, expected: bool) -> None:
    assert needs_reasoning_block(model) is expected


def test_add_reasoning_block_returns_new_dict() -> None:
    msg = {"role": "assistant", "content": [{"type": "text", "text": "summary"}]}
    snapshot = copy.deepcopy(msg)
    out = add_reasoning_block(msg)
    assert msg == snapshot and "reasoning_content" not in msg
    assert out["reasoning_content"] and out["content"] == msg["content"]
    out["content"][0]["text"] = "changed"
    assert msg == snapshot  # deep copy: no aliasing
    assert add_reasoning_block({**msg, "reasoning_content": "real"})["reasoning_content"] == "real"


def test_strip_signed_thinking_never_mutates() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "t", "signature": "s1"},
                {"type": "redacted_thinking", "data": "enc"},
                {"type": "text", "text": "answer"},
                {"type": "tool_use", "id": "t1", "name": "x", "input": {}},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "only", "signature": "s2"}],
        },
        {
            "role": "assistant",
            "content": "ok",
            "thinking_blocks": [{"type": "thinking", "thinking": "t", "signature": "s3"}],
        },
    ]
    snapshot = copy.deepcopy(msgs)
    out = strip_signed_thinking(msgs)
    assert msgs == snapshot
    assert out == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "answer"},
                {"type": "tool_use", "id": "t1", "name": "x", "input": {}},
            ],
        },
        {"role": "assistant", "content": "ok"},
    ]
    out[1]["content"][0]["text"] = "mutated"
    assert msgs == snapshot


@given(
    window=st.integers(min_value=1, max_value=60),
    step=st.integers(min_value=1, max_value=5),
    turns=st.integers(min_value=1, max_value=120),
)
def test_the_finish_cache_holds_what_requests_carry_not_history(
    window: int, step: int, turns: int
) -> None:
    # A sliding view (what a long session's requests look like): every request is
    # finished as without a cache, and the cache never holds much more than one request.
    cache: FinishCache = {}
    for t in range(turns):
        items = [
            ViewItem((s, 0), s * 8, {"role": "user", "content": f"m{s}"}, 3)
            for s in range(t * step, t * step + window)
        ]
        assert finish_request_view(items, target_model="gpt-4o", cache=cache) == (
            finish_request_view(items, target_model="gpt-4o")
        )
        assert len(cache) <= len(items) + len(items) // 4 + 64 + window
