"""BM25 for memory:// recall (bm25s): stemming, snake_case words, stable ties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.store import lexical
from tests.examples import examples


def _postings(docs: dict[int, list[str]]) -> dict[str, list[tuple[int, int, int]]]:
    out: dict[str, list[tuple[int, int, int]]] = {}
    for seq in sorted(docs, reverse=True):
        for term in dict.fromkeys(docs[seq]):
            out.setdefault(term, []).append((seq, docs[seq].count(term), len(set(docs[seq]))))
    return out


def test_bm25_ranks_deterministically_newest_first_on_ties() -> None:
    docs = {
        s: lexical.tokenize(t, "english")
        for s, t in [(3, "gateway port"), (8, "gateway port"), (5, "cache")]
    }
    query = set(lexical.tokenize("the gateway port?", "english"))
    postings = {t: rows for t, rows in _postings(docs).items() if t in query}
    ranked = lexical.rank(postings, top=8, total=8, limit=5)
    # the same words: the newer statement first (the recency preference); no match, no row
    assert [seq for seq, _ in ranked] == [8, 3]
    assert ranked[0][1] > ranked[1][1]
    assert lexical.tokenize("max_workers", "english") == ["max", "worker"]
    assert lexical.tokenize("Workers", "simple") == ["workers"]
    assert lexical.rank({}, top=8, total=8, limit=5) == []


def test_a_rare_lexeme_outweighs_a_common_one() -> None:
    docs = {s: ["deploy"] for s in range(1, 40)}
    docs[7] = ["deploy", "orchard"]
    ranked = lexical.rank(_postings(docs), top=40, total=40, limit=3)
    assert ranked[0][0] == 7


def test_document_frequency_is_exact_below_the_cap_and_estimated_at_it() -> None:
    assert lexical.estimated_df(10, 3, 1000, 1000) == 10.0
    cap = lexical.PER_TERM
    # cap postings over the newest 2 x cap of 1,000 messages: one in two, so ~500 in all
    assert lexical.estimated_df(cap, 1000 - 2 * cap + 1, 1000, 1000) == pytest.approx(500.0)
    assert lexical.estimated_df(cap, 999, 1000, 1000) == 1000.0  # never above the whole
    assert lexical.idf(1000.0, 1000) < lexical.idf(10.0, 1000)
    assert lexical.idf(2000.0, 1000) > 0


def test_the_search_reads_back_from_below_the_carried_tail() -> None:
    assert lexical.read_from(100, set(range(90, 101)) | {5}) == 89
    assert lexical.read_from(100, {5, 99}) == 100  # the anchor itself not carried
    assert lexical.read_from(3, {1, 2, 3}) == 0


def test_a_long_turn_is_searched_by_its_longest_lexemes() -> None:
    words = [f"longword{i:03d}" for i in range(200)] + ["a1"]
    kept = lexical.query_lexemes(words)
    assert "a1" not in kept and len(kept) == lexical.MAX_QUERY_LEXEMES
    assert lexical.query_lexemes(["a1", "longword", "a1", ""]) == ["longword", "a1"]


@settings(max_examples=examples(60))
@given(
    st.dictionaries(
        st.integers(1, 200),
        st.lists(
            st.sampled_from(["alpha", "beta", "gamma", "delta", "eps"]), min_size=1, max_size=6
        ),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "eps"]), min_size=1, max_size=3),
)
def test_below_the_cap_the_rank_is_plain_bm25_over_every_match(
    docs: dict[int, list[str]], query: list[str]
) -> None:
    """Fewer postings than the cap per lexeme: nothing was estimated, so the ranking is
    BM25 (Lucene's idf, K1, B, distinct lexemes as the length) over all the matches,
    times the recency preference, ties to the newer seq."""
    top = max(docs)
    postings = {t: rows for t, rows in _postings(docs).items() if t in set(query)}
    got = lexical.rank(postings, top=top, total=top, limit=100)
    matched = [s for s in docs if set(docs[s]) & set(query)]
    if not matched:
        assert got == []
        return
    lengths = [len(set(docs[s])) for t in postings for s, _, _ in postings[t]]
    avgdl = sum(lengths) / len(lengths)
    want = {}
    for seq in matched:
        score = 0.0
        for t in set(query) & set(docs[seq]):
            df = sum(1 for d in docs.values() if t in d)
            tf, dl = docs[seq].count(t), len(set(docs[seq]))
            k1, b = lexical.K1, lexical.B
            score += lexical.idf(df, top) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
        want[seq] = score * (1 + lexical.RECENCY * seq / top)
    assert [s for s, _ in got] == sorted(want, key=lambda s: (-want[s], -s))
    for seq, score in got:
        assert score == pytest.approx(want[seq])


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


@settings(max_examples=examples(200), deadline=None)
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
