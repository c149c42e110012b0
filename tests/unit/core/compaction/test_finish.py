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
    finish_marked,
    finish_request_view,
    needs_reasoning_block,
    splice_safe,
    strip_signed_thinking,
)
from contextledger.core.recall import RecallBlock, block_item, latest_turn, place
from contextledger.core.view import ViewItem
from tests.unit.strategies import conversations


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
        assert len(cache["gpt-4o"]) <= len(items) + len(items) // 4 + 8 + window


@given(view=conversations(), model=st.sampled_from(["gpt-4o", "claude-sonnet-4-5", None]))
def test_a_warm_cache_hands_out_copies_equal_to_a_cold_finish(
    view: tuple[ViewItem, ...], model: str | None
) -> None:
    # The same items again (as the planner hands them out) take the cache's fast path:
    # the same messages as finishing without a cache, and copies: what a caller does to
    # one request's messages never reaches the next request.
    cold = finish_request_view(view, target_model=model)
    cache: FinishCache = {}
    for _ in range(3):
        out = finish_request_view(view, target_model=model, cache=cache)
        assert out == cold
        for message in out:
            message["content"] = "changed by the caller"
            message["extra"] = 1
    assert finish_request_view(view, target_model=model, cache=cache) == cold


def test_a_cache_keeps_the_views_of_two_target_models_at_most() -> None:
    cache: FinishCache = {}
    view = [ViewItem((1, 0), 8, {"role": "user", "content": "hi"}, 3)]
    for model in ("gpt-4o", "claude-sonnet-4-5", "gpt-4o", "deepseek-r1"):
        finish_request_view(view, target_model=model, cache=cache)
        assert model in cache and len(cache) <= 2
    assert set(cache) == {"deepseek-r1", "gpt-4o"}  # the least recently used went


def test_an_item_rebuilt_with_the_same_ref_is_finished_afresh() -> None:
    # The cache is keyed by the item itself: a reloaded item (same ref, new message) is
    # never served the finished form of the one it replaced.
    cache: FinishCache = {}
    first = [ViewItem((1, 0), 8, {"role": "user", "content": "old"}, 3)]
    assert finish_request_view(first, target_model="gpt-4o", cache=cache)[0]["content"] == "old"
    again = [ViewItem((1, 0), 8, {"role": "user", "content": "new"}, 3)]
    assert finish_request_view(again, target_model="gpt-4o", cache=cache)[0]["content"] == "new"


@given(
    view=conversations(),
    model=st.sampled_from(["gpt-4o", "claude-sonnet-4-5", "deepseek-r1", None]),
    role=st.sampled_from(["user", "assistant"]),
)
def test_a_block_finished_apart_lands_where_finishing_the_placed_view_puts_it(
    view: tuple[ViewItem, ...], model: str | None, role: str
) -> None:
    # The request path finishes the view while recall's search is out, then splices the
    # block in: the same messages as finishing the view with the block placed, whenever
    # ``splice_safe`` allows it (the one case it refuses is checked to differ below).
    at = latest_turn(view)
    if at is None:
        return
    block = RecallBlock({"role": role, "content": "recalled: port 8443"}, (3,), 7, "q")
    whole = finish_request_view(place(view, block), target_model=model)
    cache: FinishCache = {}
    for _ in range(2):  # cold and warm cache
        out, cut = finish_marked(view, at, target_model=model, cache=cache)
        assert out == finish_request_view(view, target_model=model)
        out[cut:cut] = finish_request_view(
            [block_item(view[at], block.message or {}, block)], target_model=model
        )
        if splice_safe(view, at):
            assert out == whole


def test_splicing_after_a_summary_would_lose_its_bridge() -> None:
    # Why ``splice_safe`` refuses a summary right before the latest turn: finishing the
    # summary looks at its next item, which the block changes.
    summary = ViewItem((1, 0), 8, {"role": "user", "content": "Summary: …"}, 5, kind="summary")
    turn = ViewItem((2, 0), 16, {"role": "user", "content": "and the port?"}, 4)
    view = (summary, turn)
    block = RecallBlock({"role": "assistant", "content": "recalled"}, (1,), 3, "q")
    whole = finish_request_view(place(view, block), target_model="gpt-4o")
    out, cut = finish_marked(view, 1, target_model="gpt-4o")
    out[cut:cut] = finish_request_view(
        [block_item(turn, block.message or {}, block)], target_model="gpt-4o"
    )
    assert not splice_safe(view, 1)
    assert out != whole
