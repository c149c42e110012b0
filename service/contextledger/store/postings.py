"""A session's postings held in a process, and recall's lexical search over them.

``memory://`` fills them from its lexer; PostgreSQL's warm path from the stored postings
(``store/postgres/warm.py``); both search them with ``search``, by ``lexical``'s rules
(the newest ``PER_TERM`` postings of each query lexeme below what the request carries,
the rarest capped ones read further, BM25, a second hop). Per lexeme the seqs and counts
are arrays, read as numpy views: a search's work is a few array operations per lexeme,
not a Python step per posting (2.3 ms a search at 1,000 turns, 16.6 at 20,000, in
Python; the deep read is what grows). The floats are those ``lexical.rank`` computes,
operation for operation and summed in the same order (a property test holds them equal).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextledger.store.lexical import (
    DEEP_LIMIT,
    DEEP_TERMS,
    HOP_FROM,
    HOP_LIMIT,
    K1,
    PER_TERM,
    RECENCY,
    B,
    estimated_df,
    hop_lexemes,
    idf,
    query_lexemes,
    read_from,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Branch:
    """Which seqs are the branch's: every one above ``base``, and those in ``below``."""

    base: int
    below: Collection[int]

    @classmethod
    def of(cls, seqs: Collection[int], upto: int) -> Branch:
        """The branch as its seqs up to ``upto`` (a replay's, or ``memory://``'s)."""
        return cls(upto, seqs)

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and (seq > self.base or seq in self.below)


class Missing(Exception):
    """What a search over partly held postings must have first (``Postings.base``): per
    lexeme, its postings older than those held (how many the search wanted), and the
    lexemes of messages a second hop starts from."""

    def __init__(self, terms: dict[str, int], forward: set[int]) -> None:
        super().__init__(f"{len(terms)} lexemes, {len(forward)} messages")
        self.terms = terms
        self.forward = forward


class Postings:
    """Per lexeme the seqs of the messages holding it (ascending) and its count in each;
    per seq the message's length (-1: no message) and its lexemes (a second hop's
    words). Added in seq order. ~20 bytes a posting (a dict of counts per message: ~50).

    Held whole (``base`` 0), or from seq ``base`` on (PostgreSQL's warm path: a process
    holds what it caught up with, and loads a lexeme's older postings, newest first, as
    far as a search reads them, ``older``): ``floors`` says from which seq each lexeme
    is held whole, and a search that would read past it raises ``Missing``."""

    __slots__ = ("base", "count", "dls", "floors", "lexemes", "messages", "seqs", "tfs", "upto")

    def __init__(self, base: int = 0) -> None:
        #: every message up to this seq has been added (and none after it)
        self.upto = 0
        self.seqs: dict[str, array[int]] = {}
        self.tfs: dict[str, array[int]] = {}
        self.dls: array[int] = array("h", [-1])
        self.lexemes: dict[int, tuple[str, ...]] = {}
        self.messages = 0
        #: postings held (counted as they come: summing the arrays is O(vocabulary))
        self.count = 0
        #: every posting and message from this seq on is held (0 or 1: all of them)
        self.base = base
        #: lexemes held whole from an earlier seq than ``base`` (1: all of its postings)
        self.floors: dict[str, int] = {}

    def floor(self, term: str) -> int:
        """The seq from which ``term``'s postings are all held."""
        return self.floors.get(term, self.base)

    def is_message(self, seq: int) -> bool:
        """Whether ``seq`` is a message held here."""
        return 0 < seq < len(self.dls) and self.dls[seq] >= 0

    def may_be_message(self, seq: int) -> bool:
        """``is_message``, or not known here (a seq below ``base`` no posting read held)."""
        return self.is_message(seq) or 0 < seq < self.base

    def older(self, term: str, rows: Sequence[tuple[int, int, int]], whole: bool) -> None:
        """``term``'s postings ``(seq, tf, dl)`` just older than those held, newest first
        (``whole``: all of its older ones; else the oldest of them is its new floor)."""
        if rows:
            if rows[0][0] >= self.floor(term):
                raise ValueError(f"postings of {term!r} from seq {rows[0][0]} are held")
            self._room(rows[0][0])
            for seq, _, dl in rows:
                self._length(seq, dl)
            self._prepend(
                sys.intern(term), [r[0] for r in reversed(rows)], [r[1] for r in reversed(rows)]
            )
        self.floors[term] = 1 if whole or not rows else rows[-1][0]

    def _length(self, seq: int, dl: int) -> None:
        """Message ``seq``'s length, as a row read back says (counted once)."""
        if self.dls[seq] < 0:
            self.messages += 1
            self.dls[seq] = min(dl, 32767)

    def _prepend(self, term: str, seqs: list[int], tfs: list[int]) -> None:
        """``term``'s postings older than those held (ascending) put before them."""
        held_seqs, held_tfs = array("q", seqs), array("h", (min(tf, 32767) for tf in tfs))
        if term in self.seqs:
            held_seqs.extend(self.seqs[term])
            held_tfs.extend(self.tfs[term])
        self.seqs[term], self.tfs[term] = held_seqs, held_tfs
        self.count += len(seqs)

    def whole_below(self, rows: Iterable[tuple[str, int, int, int]], base: int) -> None:
        """The stored postings ``(lexeme, seq, tf, dl)`` below ``base`` (this one's), by
        lexeme then seq, the empty lexeme marking each message: those not held yet are
        added, and the postings are held whole from then on (``below`` then
        ``below_done``, which a caller may call a few lexemes at a time)."""
        forward: dict[int, list[str]] = {}
        self.below(rows, base, forward)
        self.below_done(base, forward)

    def below(
        self, rows: Iterable[tuple[str, int, int, int]], base: int, forward: dict[int, list[str]]
    ) -> None:
        """Of ``whole_below``'s rows, those of some lexemes (each lexeme's all there, its
        seqs ascending): its postings not held yet added, then held whole; ``forward``
        gathers each message's lexemes (for ``below_done``)."""
        if base != self.base:
            raise ValueError(f"held from seq {self.base}, not {base}")
        lexemes = self.lexemes
        older: dict[str, tuple[list[int], list[int]]] = {}
        for lexeme, seq, tf, dl in rows:
            if seq >= base:
                continue
            self._room(seq)
            self._length(seq, dl)
            known = seq in lexemes
            if not known and seq not in forward:
                forward[seq] = []
            if not lexeme:
                continue
            lexeme = sys.intern(lexeme)
            if not known:
                forward[seq].append(lexeme)
            got = older.get(lexeme)
            if got is None:
                got = older[lexeme] = ([], [])
            if seq < self.floor(lexeme):
                got[0].append(seq)
                got[1].append(tf)
        for term, (seqs, tfs) in older.items():
            if seqs:
                self._prepend(term, seqs, tfs)
            self.floors[term] = 1

    def below_done(self, base: int, forward: Mapping[int, Sequence[str]]) -> None:
        """``whole_below``'s end: every message's lexemes known, every posting held."""
        if base != self.base:
            raise ValueError(f"held from seq {self.base}, not {base}")
        for seq, terms in forward.items():
            if seq not in self.lexemes:
                self.lexemes[seq] = tuple(terms)
        self.base = 0
        self.floors.clear()

    def forward(self, seq: int, lexemes: Iterable[str]) -> None:
        """The lexemes of message ``seq`` (below ``base``: a second hop starts from it)."""
        self.lexemes[seq] = tuple(sys.intern(t) for t in lexemes if t)

    def _room(self, seq: int) -> None:
        if seq >= len(self.dls):
            self.dls.extend([-1] * (seq + 1 - len(self.dls)))

    def add(self, seq: int, counts: Mapping[str, int], length: int) -> None:
        """Message ``seq`` (newer than any added) with each lexeme's count and its length."""
        self._room(seq)
        self.dls[seq] = min(length, 32767)
        self.messages += 1
        self.lexemes[seq] = tuple(counts)
        self.count += len(counts)
        seqs, tfs = self.seqs, self.tfs
        for term, tf in counts.items():
            held = seqs.get(term)
            if held is None:
                held = seqs[term] = array("q")
                tfs[term] = array("h")
            held.append(seq)
            tfs[term].append(min(tf, 32767))

    def extend(self, rows: Iterable[tuple[str, int, int, int]]) -> None:
        """Stored postings ``(lexeme, seq, tf, dl)`` of messages newer than any held, in an
        order that keeps each lexeme's seqs ascending (by lexeme then seq, or by seq); the
        empty lexeme marks a message (one without words has only that row)."""
        rows = rows if isinstance(rows, list) else list(rows)
        if not rows:
            return
        self._room(max(r[1] for r in rows))
        seqs, tfs, dls = self.seqs, self.tfs, self.dls
        forward: dict[int, list[str]] = {}
        for lexeme, seq, tf, dl in rows:
            terms = forward.get(seq)
            if terms is None:
                terms = forward[seq] = []
                self.messages += dls[seq] < 0
                dls[seq] = min(dl, 32767)
            if not lexeme:
                continue
            lexeme = sys.intern(lexeme)  # one string per lexeme, however many messages
            held = seqs.get(lexeme)
            if held is None:
                held = seqs[lexeme] = array("q")
                tfs[lexeme] = array("h")
            held.append(seq)
            tfs[lexeme].append(tf)
            terms.append(lexeme)
            self.count += 1
        for seq, terms in forward.items():
            self.lexemes[seq] = tuple(terms)

    @property
    def size(self) -> int:
        """Postings held (what a process's budget of warm indexes counts)."""
        return self.count + self.messages


def search(
    index: Postings,
    lexemes: Sequence[str],
    *,
    upto_seq: int,
    exclude: Collection[int],
    on_branch: Branch | None,
    limit: int,
    hop: bool,
) -> list[tuple[int, float]]:
    """The lexical search over ``index``: the query's ``lexemes`` (``query_lexemes`` picks
    them), each one's newest ``PER_TERM`` postings below what the request carries
    (``exclude``; ``on_branch``: which seqs are the branch's, None: all), the rarest
    capped ones read further, BM25; with ``hop``, a second hop after them (negated
    scores). ``(seq, score)``, best first, ties to the newer seq. Over postings held in
    part, ``Missing`` says what to load first (the answer is then the one the whole
    postings give: a search reads only a lexeme's newest postings)."""
    import numpy as np

    skip = set(exclude)
    top = read_from(upto_seq, skip)
    # Copies, never views of the index's arrays: a view (kept by a traceback, say) would
    # make the next append to that array fail (BufferError). The lengths are ~2 bytes a
    # seq; a lexeme's postings are copied by the stretch read.
    dls = np.frombuffer(index.dls, dtype=np.int16).copy()
    skipped = _below(skip, top)

    terms_wanted: dict[str, int] = {}

    def read(term: str, n: int) -> tuple[Ints, Ints] | None:
        """The newest ``n`` postings of ``term`` a search may read: seqs and tfs, newest
        first. Past the postings held of it (``Postings.floor``), what more it wants is
        noted in ``terms_wanted``."""
        held = index.seqs.get(term)
        partial = index.floor(term) > 1
        if held is None:
            if partial:
                terms_wanted[term] = max(n, terms_wanted.get(term, 0))
            return None
        end = bisect_right(held, top)
        want = n
        while True:
            lo = max(0, end - want)
            if lo == end:
                if partial:
                    terms_wanted[term] = max(n, terms_wanted.get(term, 0))
                return None
            seqs = np.frombuffer(held[lo:end], dtype=np.int64)  # (the slice is a copy)
            tfs = np.frombuffer(index.tfs[term][lo:end], dtype=np.int16)
            if on_branch is None and bisect_left(skipped, held[lo]) == len(skipped):
                # nothing to leave out of this stretch: the usual read, no mask
                if partial and end - lo < n:
                    terms_wanted[term] = max(n, terms_wanted.get(term, 0))
                return seqs[::-1], tfs[::-1].astype(np.int64)
            keep = _kept(seqs, skipped, on_branch)
            kept = int(keep.sum())
            if kept >= n or lo == 0:
                break
            want *= 4
        if partial and kept < n:
            terms_wanted[term] = max(n + end - kept, terms_wanted.get(term, 0))
        at = np.flatnonzero(keep)[::-1][:n]
        if not len(at):
            return None
        return seqs[at], tfs[at].astype(np.int64)

    def ranked(terms: list[str], n: int, *, specific: bool = False) -> list[tuple[int, float]]:
        postings: dict[str, tuple[Ints, Ints]] = {}
        for term in terms:
            rows = read(term, PER_TERM)
            if rows is not None and not (specific and len(rows[0]) >= PER_TERM):
                postings[term] = rows
        if not specific:
            capped = [
                (len(s) / max(1, top - int(s[-1]) + 1), t)
                for t, (s, _) in postings.items()
                if len(s) >= PER_TERM
            ]
            for _, term in sorted(capped)[:DEEP_TERMS]:
                deep = read(term, DEEP_LIMIT)
                assert deep is not None
                postings[term] = deep
        return _bm25(postings, dls, top=top, total=upto_seq, limit=n)

    terms = query_lexemes(lexemes)
    found = ranked(terms, limit)
    if terms_wanted:
        raise Missing(terms_wanted, set())
    if not hop or not found:
        return found
    # the second hop finds other messages than the matches and their neighbours
    starts = [seq for seq, _ in found[:HOP_FROM]]
    unknown = {seq for seq in starts if seq < index.base and seq not in index.lexemes}
    if unknown:
        raise Missing({}, unknown)
    skip.update(seq for seq, _ in found)
    skip.update(seq + d for seq in starts for d in (-1, 1))
    skipped = _below(skip, top)
    again = hop_lexemes([index.lexemes.get(seq, ()) for seq in starts], set(terms))
    hopped = ranked(again, HOP_LIMIT, specific=True)
    if terms_wanted:
        raise Missing(terms_wanted, set())
    return found + [(seq, -score) for seq, score in hopped]


def _below(skip: Collection[int], top: int) -> list[int]:
    """The skipped seqs a search's reads can meet (at most ``top``), sorted."""
    return sorted(s for s in skip if s <= top)


def _kept(window: Ints, skipped: Sequence[int], on_branch: Branch | None) -> Any:
    """Which seqs of ``window`` a search may read: not skipped, on the branch."""
    import numpy as np

    keep = np.ones(len(window), dtype=bool)
    near = skipped[bisect_left(skipped, int(window[0])) :] if len(window) else ()
    if near:  # a few: each found in the window by bisection
        wanted = np.array(near, dtype=np.int64)
        at = np.searchsorted(window, wanted)
        inside = at < len(window)
        at, wanted = at[inside], wanted[inside]
        keep[at[window[at] == wanted]] = False
    if on_branch is not None and len(window):
        below = window <= on_branch.base
        if below.any():
            held = on_branch.below
            inside = np.fromiter(
                (int(s) in held for s in window[below]), dtype=bool, count=int(below.sum())
            )
            keep[below] &= inside
    return keep


def _bm25(
    postings: Mapping[str, tuple[Ints, Ints]],
    dls: Any,
    *,
    top: int,
    total: int,
    limit: int,
) -> list[tuple[int, float]]:
    """``lexical.rank`` over arrays: the same operations, summed per seq in the same
    (lexeme) order, so the same floats."""
    import numpy as np

    if not postings:
        return []
    weights: list[float] = []
    for seqs, _ in postings.values():
        cap = DEEP_LIMIT if len(seqs) > PER_TERM else PER_TERM
        weights.append(idf(estimated_df(len(seqs), int(seqs[-1]), top, total, cap), total))
    all_seqs = np.concatenate([s for s, _ in postings.values()])
    tf = np.concatenate([t for _, t in postings.values()]).astype(np.float64)
    dl = dls[all_seqs].astype(np.float64)
    avgdl = max(int(dls[all_seqs].astype(np.int64).sum()) / len(all_seqs), 1.0)
    w = np.repeat(np.array(weights), [len(s) for s, _ in postings.values()])
    parts = w * tf * (K1 + 1) / (tf + K1 * ((1 - B) + B * dl / avgdl))
    uniq, inverse = np.unique(all_seqs, return_inverse=True)
    scores = np.bincount(inverse, weights=parts) * (1 + RECENCY * uniq / max(top, 1))
    order = np.lexsort((-uniq, -scores))[:limit]
    return [(int(uniq[i]), float(scores[i])) for i in order if scores[i] > 0]
