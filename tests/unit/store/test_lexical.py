"""BM25 for memory:// recall (bm25s): stemming, snake_case words, stable ties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_lexemes_common_in_the_recent_messages_are_not_searched_for() -> None:
    sample = [{"deploy", "cache"}] * 40 + [{"deploy", "orchard"}] * 2 + [{"cache"}] * 30
    # 'deploy' is in 42 of 72, 'cache' in 70: both dropped; 'orchard' (2) and the unseen
    # 'gateway' kept, rarest first
    assert lexical.rare_terms(["deploy", "orchard", "cache", "gateway"], sample) == [
        "gateway",
        "orchard",
    ]
    # among few documents, nothing in at most 8 of them is dropped
    assert lexical.rare_terms(["deploy", "cache"], [{"deploy", "cache"}] * 8) == [
        "cache",
        "deploy",
    ]
    # the 3 rarest stay while in under half of the sample, even above a quarter
    half = [{"a"}] * 30 + [{"b"}] * 70
    assert lexical.rare_terms(["a", "b"], half) == ["a"]
    many = [f"t{i:02d}" for i in range(30)]
    assert lexical.rare_terms(many, []) == many[: lexical.MAX_LEXEMES]


def test_a_long_turn_is_searched_by_its_longest_lexemes() -> None:
    words = [f"longword{i:03d}" for i in range(200)] + ["a1"]
    kept = lexical.rare_terms(words, [])
    # 'a1' would sort first, but only the 64 longest lexemes are looked at
    assert "a1" not in kept and len(kept) == lexical.MAX_LEXEMES
    assert lexical.rare_terms(["a1", "longword"], []) == ["a1", "longword"]


_WORDS = [
    "The",
    "running",
    "runners",
    "ran",
    "quickly",
    "to",
    "config.py",
    "parse_args",
    "userId",
    "42",
    "a",
    "of",
    "Über",
    "naïve",
    "café",
    "migrations",
    "migrating",
    "migrated",
    "I'm",
    "don't",
    "__init__",
    "résumé",
    "日本語",
    "x",
]


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(
        st.lists(st.sampled_from(_WORDS) | st.text(max_size=8), max_size=20).map(" ".join),
        min_size=1,
        max_size=12,
    ),
    config=st.sampled_from(["english", "simple", "pg_catalog.english", "german"]),
)
def test_a_session_lexer_gives_what_the_one_shot_tokenizer_gives(
    texts: list[str], config: str
) -> None:
    # the vocabulary a Lexer keeps between messages never changes a message's lexemes
    import bm25s

    lexer = lexical.Lexer(config)
    stop = "en" if config.endswith("english") else None
    for text in texts:
        once = bm25s.tokenize(
            [text.replace("_", " ")],
            stopwords=stop,
            stemmer=lexical._stemmer(config),
            show_progress=False,
            return_ids=False,
        )[0]
        assert lexer(text) == once == lexical.tokenize(text, config)
