"""What makes a summary acceptable, and error texts that must never pass as one."""

from __future__ import annotations

import pytest

from contextledger.core.summary.validate import looks_like_error, validate_summary
from contextledger.core.tokens import CharsCounter
from contextledger.errors import CompactionError

COUNTER = CharsCounter()


def test_validate_summary_codes() -> None:
    with pytest.raises(CompactionError) as info:
        validate_summary("   ", counter=COUNTER, tokens_before=100, model="m")
    assert info.value.code == "INVALID_SUMMARY" and info.value.model == "m"
    with pytest.raises(CompactionError) as info:
        validate_summary("y" * 600, counter=COUNTER, tokens_before=100)
    assert info.value.code == "CONTEXT_GROWTH"
    assert "50% larger" in str(info.value)
    assert info.value.details["resulting_tokens"] == 150
    with pytest.raises(CompactionError, match="0% larger"):  # equal is not smaller
        validate_summary("z" * 400, counter=COUNTER, tokens_before=100)
    text, after = validate_summary(
        "<think>hmm</think>\n## Task overview\n- ok", counter=COUNTER, tokens_before=100
    )
    assert text == "## Task overview\n- ok" and after == COUNTER.count_text(text)


def test_looks_like_error_has_no_false_positive_on_real_summaries() -> None:
    assert looks_like_error("Error: 500")
    assert looks_like_error("I\u2019m sorry, but I can\u2019t do that")
    assert not looks_like_error("## Task overview\n- Fix the error in db.py")
    assert not looks_like_error("## Errors and resolutions\n- ImportError fixed")
