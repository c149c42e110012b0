"""BM25 for memory:// recall (bm25s): stemming, snake_case words, stable ties."""

from __future__ import annotations

import pytest

from contextledger.store import lexical


def test_bm25_ranks_deterministically_newest_first_on_ties() -> None:
    docs = [
        (s, lexical.tokenize(t, "english"))
        for s, t in [(3, "gateway port"), (8, "gateway port"), (5, "cache")]
    ]
    assert lexical.rank(lexical.tokenize("the gateway port?", "english"), docs, 5) == [
        (8, pytest.approx(lexical.rank(["gateway", "port"], docs, 1)[0][1])),
        (3, pytest.approx(lexical.rank(["gateway", "port"], docs, 1)[0][1])),
    ]
    assert lexical.tokenize("max_workers", "english") == ["max", "worker"]
    assert lexical.tokenize("Workers", "simple") == ["workers"]
    assert lexical.rank([], docs, 5) == [] and lexical.rank(["zebra"], docs, 5) == []
