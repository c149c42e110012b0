"""Recall's lexical search rules, shared by both stores, and ``memory://``'s lexer.

Both stores keep postings (lexeme -> the messages holding it, newest first) and search
the same way: each query lexeme's newest postings, up to a fixed count, scored by BM25
with a small preference for the newer statement. PostgreSQL spells it in SQL over
``event_terms``; ``memory://`` in ``rank`` here, tokenizing like PostgreSQL's ``english``
configuration (bm25s's tokenizer: stop words dropped, Snowball stems; ``simple`` means no
stemming). Ties break by seq, newest first, so the same postings always rank the same way.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from itertools import islice
from typing import Any

from contextledger.core.config import ts_config_name
from contextledger.core.word_forms import MAX_QUERY_LEXEMES as MAX_QUERY_LEXEMES

K1 = 0.5
B = 0.9
#: A recall search's bounds, the same in both stores (PostgreSQL's ``_SEARCH`` spells these
#: rules in SQL). The ``MAX_QUERY_LEXEMES`` longest lexemes of the query are looked up (a
#: pasted document is a turn too; long lexemes are the specific ones: names, identifiers);
#: each one's newest ``PER_TERM`` postings the request does not carry are read, backwards
#: from the request's tail, and nothing more: the work is bounded by the query, not the
#: history (16 lexemes x 64 postings read ~730 rows a search at 5,000 turns, 7 ms of
#: statement on a busy machine; 12 x 32, 3.3 ms, and bench/conversations.py found the same
#: evidence). A lexeme with fewer postings was read whole (its frequency is exact); one
#: with ``PER_TERM`` has its frequency estimated from how far back they reach, so a word in
#: every other message weighs what BM25 would give it without being read whole.
#: (``MAX_QUERY_LEXEMES`` is defined in ``core.word_forms``, whose forms must fit it.)
PER_TERM = 32
#: The newest postings alone lose an old fact about a thing named often since: the
#: ``DEEP_TERMS`` rarest lexemes (by their estimated frequency) whose newest ``PER_TERM``
#: did not hold them all are read further, up to ``DEEP_LIMIT`` postings (the needle bench,
#: bench/recall.py: 32/60 facts with the newest 32 only, 59/60 with every posting).
DEEP_TERMS, DEEP_LIMIT = 6, 1024
#: The best matches whose neighbours (the message before and after, when the request left
#: them out) come with them: a reply that echoes a question's words sits next to the
#: statement that answers it, and a statement next to the question it answers.
NEIGHBOURED = 8
#: A question's second hop (``hop=True``): the words of its ``HOP_FROM`` best matches that
#: the question did not use (their ``HOP_LEXEMES`` longest) are searched the same way, and
#: the ``HOP_LIMIT`` best of what they find come too; only specific words are followed
#: (fewer than ``PER_TERM`` postings: read whole, never estimated). "Which city did she
#: drive to?" finds "I drove to see my aunt"; the hop finds "my aunt lives in Perth".
HOP_FROM, HOP_LEXEMES, HOP_LIMIT = 2, 8, 6
#: A newer statement of the same thing outranks an older one by up to this share (the
#: value that changed comes back before, or with, the one it replaced).
RECENCY = 0.15


def estimated_df(read: int, oldest: int, top: int, total: int, cap: int = PER_TERM) -> float:
    """A lexeme's document frequency among ``total`` messages, from ``read`` postings the
    oldest of which is at ``oldest``, read backwards from ``top``: exact below ``cap``
    (what was read at most), else the rate over the stretch read, times the whole."""
    if read < cap:
        return float(read)
    return min(float(total), read * total / max(1, top - oldest + 1))


def idf(df: float, total: int) -> float:
    """BM25's inverse document frequency (Lucene's, never negative)."""
    n = max(float(total), df)
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def read_from(upto_seq: int, carried: Collection[int]) -> int:
    """The seq a search reads postings back from: below the run of carried seqs that ends
    the request (its tail), so the postings it reads are ones the request left out."""
    seq = upto_seq
    while seq > 0 and seq in carried:
        seq -= 1
    return seq


def neighbours(ranked: Sequence[int], upto_seq: int, carried: Collection[int]) -> list[int]:
    """The seqs next to the ``NEIGHBOURED`` best of ``ranked`` that a search brings too:
    up to ``upto_seq``, neither carried nor matched (whether each is a message of the
    branch is for the store to check)."""
    matched = set(ranked)
    out = {
        n
        for seq in ranked[:NEIGHBOURED]
        for n in (seq - 1, seq + 1)
        if 1 <= n <= upto_seq and n not in carried and n not in matched
    }
    return sorted(out)


def hop_lexemes(found: Sequence[Collection[str]], query: Collection[str]) -> list[str]:
    """The lexemes a second hop searches: those of the best matches (``found``, best
    first, ``HOP_FROM`` of them) the query did not have, the longest first."""
    words = {t for lexemes in found[:HOP_FROM] for t in lexemes if t and t not in query}
    return sorted(words, key=lambda t: (-len(t), t))[:HOP_LEXEMES]


def deep_terms(postings: Mapping[str, Sequence[tuple[int, int, int]]], top: int) -> list[str]:
    """The lexemes read further (``DEEP_TERMS``): of those whose newest ``PER_TERM``
    postings did not hold them all, the rarest by the rate of those postings."""
    capped = [
        (len(r) / max(1, top - r[-1][0] + 1), t) for t, r in postings.items() if len(r) >= PER_TERM
    ]
    return [t for _, t in sorted(capped)[:DEEP_TERMS]]


def query_lexemes(lexemes: Sequence[str]) -> list[str]:
    """The distinct lexemes a search looks up: the ``MAX_QUERY_LEXEMES`` longest."""
    return sorted({t for t in lexemes if t}, key=lambda t: (-len(t), t))[:MAX_QUERY_LEXEMES]


def rank(
    postings: Mapping[str, Sequence[tuple[int, int, int]]],
    *,
    top: int,
    total: int,
    limit: int,
) -> list[tuple[int, float]]:
    """BM25 over what a search read: ``postings[lexeme]`` = its newest ``(seq, tf, dl)``,
    newest first, at most ``PER_TERM``; ``top`` the seq they were read back from, ``total``
    the messages in all. ``(seq, score)`` of the ``limit`` best, ties to the newer seq.
    PostgreSQL's statement computes the same in SQL (the store contract tests hold both
    to it)."""
    weights: dict[str, float] = {}
    lengths: list[int] = []
    for lexeme, rows in postings.items():
        if rows:
            cap = DEEP_LIMIT if len(rows) > PER_TERM else PER_TERM
            df = estimated_df(len(rows), rows[-1][0], top, total, cap)
            weights[lexeme] = idf(df, total)
            lengths.extend(dl for _, _, dl in rows)
    if not lengths:
        return []
    avgdl = max(sum(lengths) / len(lengths), 1.0)
    k1p1, free = K1 + 1, 1 - B  # (the same operations as written out in full)
    scores: dict[int, float] = {}
    get = scores.get
    for lexeme, rows in postings.items():
        w = weights.get(lexeme, 0.0)
        for seq, tf, dl in rows:
            scores[seq] = get(seq, 0.0) + w * tf * k1p1 / (tf + K1 * (free + B * dl / avgdl))
    span = max(top, 1)
    best = heapq.nsmallest(
        limit,
        ((seq, score * (1 + RECENCY * seq / span)) for seq, score in scores.items()),
        key=lambda p: (-p[1], -p[0]),
    )
    return [(seq, score) for seq, score in best if score > 0]


@lru_cache(maxsize=8)
def _stemmer(text_config: str) -> Any:
    import Stemmer

    name = ts_config_name(text_config)
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

        stop = "en" if ts_config_name(text_config) == "english" else []
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
