"""litellm's token counter, offline: the counts it gives for OpenAI and Claude models.

Moved from tests/unit/core/test_tokens.py: the counter is litellm's, so these import
litellm (~1.5 s), more than a unit file may take.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tokenizers import Tokenizer

from contextledger.core.recall import Recalled, pick
from contextledger.core.tokens import LitellmCounter
from tests.tiktoken_reference import litellm_tokenizers, reference_encoding
from tests.unit.core.test_tokens import COOKBOOK


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"network call to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def test_litellm_counter_openai_matches_tiktoken(no_network: None) -> None:
    reference = reference_encoding("o200k_base")
    c = LitellmCounter("openai/gpt-4o")
    assert c.name == "litellm:o200k_base"
    for text in ("hello world", "你好\uff0c世界", '{"k": [1, 2]}'):
        assert c.count_text(text) == len(reference.encode(text, disallowed_special=()))
    assert c.count_messages(COOKBOOK) == 124


def test_litellm_counter_claude_uses_bundled_tokenizer(no_network: None) -> None:
    bundled = Tokenizer.from_file(str(litellm_tokenizers() / "anthropic_tokenizer.json"))
    c = LitellmCounter("claude-sonnet-4-20250514")
    assert c.name == "litellm:anthropic"
    for text in ("hello world", "def f(x):\n    return x * 2\n", "你好\uff0c世界"):
        assert c.count_text(text) == len(bundled.encode(text, add_special_tokens=False).ids)
    assert c.count_text("") == 0


def test_a_recall_block_counted_by_claude_s_tokenizer_stays_in_its_budget(
    no_network: None,
) -> None:
    # Claude's tokenizer takes more tokens for some six-digit seqs and dates than for the
    # newest seq and latest day a block's heads are counted on (``HEAD_SLACK``); with
    # one-token lines the heads are most of the block, and a block estimated well within
    # its budget is not counted again.
    c = LitellmCounter("claude-sonnet-4-20250514")
    day = datetime(2023, 5, 8, tzinfo=UTC)
    msgs = [{"role": "user", "content": "k"} for _ in range(150)]
    msgs.append({"role": "assistant", "content": "Hm.", "reasoning_content": "think " * 3000})
    recs = [
        Recalled(135_791 + n, m, c.count_message(m), day + timedelta(days=n))
        for n, m in enumerate(msgs)
    ]
    for budget in (1000, 1500, 2200, 3000, 5000):
        block = pick([r.seq for r in recs], recs, budget_tokens=budget, counter=c)
        assert block.message is not None
        assert c.count_message(block.message) <= block.tokens <= budget
