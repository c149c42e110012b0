"""The postings a process holds and the array search over them (``store/postings.py``),
held to the rules as ``lexical`` writes them out one posting at a time."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.store import lexical
from contextledger.store.postings import Branch, Missing, Postings, search
from tests.examples import examples

WORDS = [f"w{i}" for i in range(12)]


def reference(
    index: Postings,
    lexemes: list[str],
    *,
    upto_seq: int,
    exclude: Collection[int],
    on_branch: Branch | None,
    limit: int,
    hop: bool,
) -> list[tuple[int, float]]:
    """The search one posting at a time, with ``lexical.rank`` (as it was written)."""
    skip = set(exclude)
    top = lexical.read_from(upto_seq, skip)

    def newest(term: str, n: int) -> list[tuple[int, int, int]]:
        seqs, tfs = index.seqs.get(term, []), index.tfs.get(term, [])
        out = []
        for i in range(bisect_right(seqs, top) - 1, -1, -1):
            seq = seqs[i]
            if seq in skip or (on_branch is not None and seq not in on_branch):
                continue
            out.append((seq, tfs[i], index.dls[seq]))
            if len(out) == n:
                break
        return out

    def ranked(terms: list[str], n: int, specific: bool = False) -> list[tuple[int, float]]:
        postings = {}
        for term in terms:
            rows = newest(term, lexical.PER_TERM)
            if rows and not (specific and len(rows) >= lexical.PER_TERM):
                postings[term] = rows
        if not specific:
            for term in lexical.deep_terms(postings, top):
                postings[term] = newest(term, lexical.DEEP_LIMIT)
        return lexical.rank(postings, top=top, total=upto_seq, limit=n)

    terms = lexical.query_lexemes(lexemes)
    found = ranked(terms, limit)
    if not hop or not found:
        return found
    skip.update(seq for seq, _ in found)
    skip.update(seq + d for seq, _ in found[: lexical.HOP_FROM] for d in (-1, 1))
    again = lexical.hop_lexemes([index.lexemes.get(s, ()) for s, _ in found], set(terms))
    return found + [(s, -x) for s, x in ranked(again, lexical.HOP_LIMIT, specific=True)]


@dataclass(frozen=True)
class Asked:
    """A search's arguments: the query, what the request carries, a rollback, how many,
    a hop."""

    query: list[str]
    carried: set[int]
    rolled: set[int] | None
    limit: int
    hop: bool

    def args(self, upto: int) -> dict[str, Any]:
        """``search``'s keyword arguments, anchored at ``upto``."""
        rolled = self.rolled
        branch = None if rolled is None else Branch.of(set(range(1, upto + 1)) - rolled, upto)
        return {
            "upto_seq": upto,
            "exclude": self.carried,
            "on_branch": branch,
            "limit": self.limit,
            "hop": self.hop,
        }


ASKED = st.builds(
    Asked,
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
    carried=st.sets(st.integers(min_value=1, max_value=130), max_size=40),
    rolled=st.one_of(st.none(), st.sets(st.integers(min_value=1, max_value=130))),
    limit=st.integers(min_value=1, max_value=20),
    hop=st.booleans(),
)
docs = st.lists(
    st.one_of(st.none(), st.lists(st.sampled_from(WORDS), max_size=8)), min_size=1, max_size=120
)


def built(messages: list[list[str] | None], *, bulk: bool) -> Postings:
    """``messages`` (None: an event that is no message) at seqs 1.., added one by one or,
    as PostgreSQL loads them, as stored rows by lexeme."""
    index = Postings()
    rows = []
    for seq, words in enumerate(messages, start=1):
        if words is None:
            continue
        counts = {w: words.count(w) for w in dict.fromkeys(words)}
        if bulk:
            rows.append(("", seq, 0, len(words)))
            rows.extend((w, seq, c, len(words)) for w, c in counts.items())
        else:
            index.add(seq, counts, len(words))
    if bulk:
        index.extend(sorted(rows))
    return index


@settings(max_examples=examples(300), deadline=None)
@given(messages=docs, asked=ASKED, cut=st.integers(min_value=0, max_value=20))
def test_the_array_search_is_the_rules_posting_by_posting(
    messages: list[list[str] | None], asked: Asked, cut: int
) -> None:
    """Same seqs, same floats (not approximately: a replay must rebuild the same block),
    whether the postings were added one by one or loaded as rows."""
    query, args = asked.query, asked.args(max(1, len(messages) - cut))
    one_by_one = built(messages, bulk=False)
    expected = reference(one_by_one, query, **args)  # type: ignore[arg-type]
    assert search(one_by_one, query, **args) == expected  # type: ignore[arg-type]
    assert search(built(messages, bulk=True), query, **args) == expected  # type: ignore[arg-type]


def test_deep_reads_reach_past_the_newest_postings_of_a_capped_lexeme() -> None:
    """An old message holding two common lexemes is found below their newest postings."""
    messages: list[list[str] | None] = [["alpha", "beta"]]
    messages += [["alpha"] if i % 2 else ["beta"] for i in range(3 * lexical.PER_TERM)]
    index = built(messages, bulk=False)
    found = search(
        index, ["alpha", "beta"], upto_seq=len(messages), exclude=(), on_branch=None,
        limit=3, hop=False,
    )  # fmt: skip
    assert found[0][0] == 1
    assert index.is_message(1) and not index.is_message(len(messages) + 1)
    assert index.size == sum(len(w) for w in messages if w) + len(messages)


def test_a_branch_keeps_its_seqs_above_the_base_and_those_listed_below() -> None:
    branch = Branch(10, frozenset({3, 4}))
    assert [s in branch for s in (3, 5, 10, 11)] == [True, False, False, True]


def partly(messages: list[list[str] | None], base: int) -> Postings:
    """``messages`` held from seq ``base`` on, as a process that caught up from there."""
    index = Postings(base)
    for seq, words in enumerate(messages, start=1):
        if words is not None and seq >= base:
            index.add(seq, {w: words.count(w) for w in dict.fromkeys(words)}, len(words))
    return index


def load_missing(index: Postings, whole: Postings, missing: Missing, least: int) -> None:
    """What ``warm.fill`` reads from the stored postings, read from ``whole``."""
    for term, wanted in sorted(missing.terms.items()):
        floor = index.floor(term)
        seqs, tfs = whole.seqs.get(term, []), whole.tfs.get(term, [])
        older = [(s, t, whole.dls[s]) for s, t in zip(seqs, tfs, strict=True) if s < floor]
        limit = max(least, wanted, len(index.seqs.get(term, ())))
        rows = older[::-1][:limit]
        index.older(term, rows, whole=len(rows) < limit)
    for seq in missing.forward:
        index.forward(seq, whole.lexemes.get(seq, ()))


@settings(max_examples=examples(300), deadline=None)
@given(
    messages=st.lists(
        st.one_of(st.none(), st.lists(st.sampled_from(WORDS), min_size=1, max_size=8)),
        min_size=10,
        max_size=120,
    ),
    asked=ASKED,
    cut=st.integers(min_value=0, max_value=60),
    held=st.floats(min_value=0, max_value=1),
    least=st.integers(min_value=1, max_value=40),
)
def test_a_search_over_postings_held_in_part_loads_what_it_reads_and_agrees(
    messages: list[list[str] | None], asked: Asked, cut: int, held: float, least: int
) -> None:
    """Held from a seq on, older postings loaded a few at a time as a search asks for
    them (``Missing``): the same seqs and floats as over all of them, a replay's too."""
    query, args = asked.query, asked.args(max(1, len(messages) - cut))
    whole = built(messages, bulk=False)
    index = partly(messages, 1 + round(held * len(messages)))  # (held: the newest part)
    for _ in range(200):
        try:
            found = search(index, query, **args)  # type: ignore[arg-type]
            break
        except Missing as missing:
            load_missing(index, whole, missing, least)
    assert found == search(whole, query, **args)  # type: ignore[arg-type]
    assert index.count <= whole.count


@settings(max_examples=examples(200), deadline=None)
@given(
    messages=st.lists(
        st.one_of(st.none(), st.lists(st.sampled_from(WORDS), max_size=8)),
        min_size=1,
        max_size=120,
    ),
    queries=st.lists(
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=6), min_size=1, max_size=4
    ),
    held=st.floats(min_value=0, max_value=1),
    least=st.integers(min_value=1, max_value=40),
    steps=st.integers(min_value=1, max_value=5),
)
def test_the_rest_of_postings_held_in_part_makes_them_whole(
    messages: list[list[str] | None],
    queries: list[list[str]],
    held: float,
    least: int,
    steps: int,
) -> None:
    """The stored rows below the hold (as PostgreSQL reads them: by lexeme, then seq),
    added a few lexemes at a time while searches load older postings in between, make
    the postings the whole ones: the answers are the same all along, and at the end a
    search needs nothing more."""
    whole = built(messages, bulk=False)
    base = 1 + round(held * len(messages))
    index = partly(messages, base)
    args = {"upto_seq": len(messages), "exclude": (), "on_branch": None, "limit": 5, "hop": True}

    def searched(query: list[str]) -> list[tuple[int, float]]:
        for _ in range(200):
            try:
                return search(index, query, **args)  # type: ignore[arg-type]
            except Missing as missing:
                load_missing(index, whole, missing, least)
        raise AssertionError("a search that never had what it needs")

    rows = []
    for seq, words in enumerate(messages, start=1):
        if words is not None and seq < base:
            rows.append(("", seq, 0, len(words)))
            rows.extend((w, seq, words.count(w), len(words)) for w in dict.fromkeys(words))
    rows.sort()
    lexemes = sorted({r[0] for r in rows})
    cuts = [lexemes[i * len(lexemes) // steps] for i in range(1, steps)] if lexemes else []
    forward: dict[int, list[str]] = {}
    for i, query in enumerate(queries):
        assert searched(query) == search(whole, query, **args)  # type: ignore[arg-type]
        lo = "" if i == 0 else cuts[i - 1] if i - 1 < len(cuts) else None
        hi = cuts[i] if i < len(cuts) else None
        if lo is not None:
            index.below(
                [r for r in rows if r[0] >= lo and (hi is None or r[0] < hi)], base, forward
            )
    index.below(
        [r for r in rows if len(queries) - 1 < len(cuts) and r[0] >= cuts[len(queries) - 1]],
        base,
        forward,
    )
    index.below_done(base, forward)
    assert index.base == 0 and not index.floors
    assert index.seqs == whole.seqs and index.tfs == whole.tfs and index.dls == whole.dls
    assert index.count == whole.count and index.messages == whole.messages
    assert {s: set(t) for s, t in index.lexemes.items()} == {
        s: set(t) for s, t in whole.lexemes.items()
    }
    for query in queries:
        assert search(index, query, **args) == search(whole, query, **args)  # type: ignore[arg-type]
