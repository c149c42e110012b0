"""BM25 ranking for ``memory://`` recall, through the ``bm25s`` library.

PostgreSQL ranks recall candidates with its own full-text search; the memory
store gets the same behaviour here: the same text (``core.recall.message_text``),
stop words dropped, Snowball stemming for the configured language (``simple``
means no stemming, as in PostgreSQL). Ties break by seq, newest first, so the same
candidates always rank the same way.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import lru_cache
from itertools import islice
from typing import Any

K1 = 0.5
B = 0.9
#: A recall search's bounds, the same in both stores (PostgreSQL's ``_SEARCH`` spells these
#: rules in SQL): the ``MAX_QUERY_LEXEMES`` longest lexemes of the turn are looked at (a
#: pasted document is a turn too: estimating hundreds of lexemes costs tens of ms, and
#: long lexemes are the specific ones: names, identifiers); each one's frequency is
#: estimated on the last ``SAMPLE`` messages; at most ``MAX_LEXEMES`` rare ones are
#: searched; the newest ``MAX_CANDIDATES`` matches are ranked. A sample of 64 (it was 128)
#: halves the frequency estimate, the search's largest fixed part (~0.45 of a ~1.1 ms
#: statement at 1,000 turns): the needle bench (bench/recall.py) recalls the same facts.
SAMPLE, KEEP_RAREST, MAX_LEXEMES, MAX_CANDIDATES = 64, 3, 16, 2048
MAX_QUERY_LEXEMES = 64


def rare_terms(query: Sequence[str], sample: Sequence[Collection[str]]) -> list[str]:
    """The query's lexemes worth searching for, rarest first: those in at most a quarter of
    the ``sample`` documents (or 8), plus the ``KEEP_RAREST`` rarest unless in half of them.
    A lexeme in most of the recent history says little about what to recall and matches
    most of it (BM25 gives it almost no weight), so searching for it is work for nothing."""
    n = len(sample)
    looked_at = sorted({t for t in query if t}, key=lambda t: (-len(t), t))[:MAX_QUERY_LEXEMES]
    counted = sorted((sum(1 for doc in sample if t in doc), t) for t in looked_at)
    kept = [
        t
        for rank_, (df, t) in enumerate(counted, start=1)
        if df <= max(8, n // 4) or (rank_ <= KEEP_RAREST and 2 * df < n)
    ]
    return kept[:MAX_LEXEMES]


@lru_cache(maxsize=8)
def _stemmer(text_config: str) -> Any:
    import Stemmer

    name = text_config.rpartition(".")[2]
    return Stemmer.Stemmer(name) if name in Stemmer.algorithms() else None


def tokenize(text: str, text_config: str) -> list[str]:
    """Lexemes of ``text``: lower-cased words (``a_b`` is two), stop words dropped, stemmed."""
    return Lexer(text_config)(text)


class Lexer:
    """``tokenize`` for one session's messages: bm25s's ``Tokenizer`` remembers each word's
    stem, so a word is stemmed once, not once a message (``bm25s.tokenize``, its one-shot
    form, also set up three progress bars a call: ~0.1 ms of a ~0.25 ms message). The
    vocabulary lives as long as the session's index, so it is bounded by what it holds."""

    def __init__(self, text_config: str) -> None:
        from bm25s.tokenization import Tokenizer

        stop = "en" if text_config.rpartition(".")[2] == "english" else []
        self._tokenizer = Tokenizer(stopwords=stop, stemmer=_stemmer(text_config))
        self._names: list[str] = []  # id -> lexeme

    def __call__(self, text: str) -> list[str]:
        # snake_case parts are words, as PostgreSQL's parser has them
        (ids,) = self._tokenizer.streaming_tokenize([text.replace("_", " ")], allow_empty=False)
        tok = self._tokenizer
        vocab = tok.stem_to_sid if tok.stemmer is not None else tok.word_to_id
        # Ids are given in order, so the new words are the dict's last keys, read from its
        # end (``list(vocab)`` copied the whole vocabulary, ~20,000 words at 20,000 turns,
        # whenever a message brought a new word, which is nearly always).
        names = self._names
        new = len(vocab) - len(names)
        if new > 0:
            names.extend(reversed(list(islice(reversed(vocab), new))))
        return [names[i] for i in ids]


def rank(
    query: Sequence[str], docs: Sequence[tuple[int, Sequence[str]]], limit: int
) -> list[tuple[int, float]]:
    """``(seq, score)`` of the ``limit`` best documents matching ``query`` (score > 0)."""
    query_terms = [t for t in query if t]
    docs = [(seq, toks) for seq, toks in docs if toks]
    if not query_terms or not docs:
        return []
    import bm25s

    # As PostgreSQL's ``@@`` does, rank only what shares a term with the query (IDF
    # over those: the terms they all share weigh little). k1 low: a service named on
    # every line of a grep output is not ten times as relevant; b high: short
    # statements of a fact are not buried under long tool output.
    terms = set(query_terms)
    docs = [(seq, toks) for seq, toks in docs if terms.intersection(toks)]
    if not docs:
        return []
    retriever = bm25s.BM25(k1=K1, b=B)
    retriever.index([list(toks) for _, toks in docs], show_progress=False)
    known = [t for t in query_terms if t in retriever.vocab_dict]
    if not known:
        return []
    scores = retriever.get_scores(known)
    ranked = sorted(
        ((seq, float(score)) for (seq, _), score in zip(docs, scores, strict=True) if score > 0),
        key=lambda p: (-p[1], -p[0]),
    )
    return ranked[:limit]
