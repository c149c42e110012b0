"""Recall, the pure part: what to ask the ledger, which matches fit, where the block goes.

Compaction leaves messages out of a request; the ledger still holds them. The
shell (``contextledger.recall``) searches the left-out part of the branch for the
latest user turn (and a pending tool call) and hands the ranked matches here.
This module decides, deterministically:

* the query text (``query_text``): the latest human turn plus the arguments of
  tool calls made after it, searched with the other forms of its irregular words
  (``search_text``);
* which matches fit the recall share (``pick``): whole tool units (a call with
  its results), best rank first, a unit that does not fit is skipped whole, the
  chosen ones in their original order, each line marked with its seq;
* where the block goes (``place``): right before the latest human turn, after
  the stable prefix, so the prefix changes no more often than compaction makes
  it and the provider's prompt cache keeps working.

Same inputs, same block: ranks tie-break by seq, and nothing here reads a clock.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_right
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from itertools import accumulate
from operator import attrgetter, itemgetter
from typing import Any

from contextledger.core.tokens import TokenCounter
from contextledger.core.units import is_human_turn, result_ids, tool_calls
from contextledger.core.view import ORD_STRIDE, ViewItem
from contextledger.core.word_forms import with_forms

_KIND, _TOKENS, _REF, _FIRST = (
    attrgetter("kind"),
    attrgetter("tokens"),
    attrgetter("ref"),
    itemgetter(0),
)

RECALL_OPEN = (
    "<recall>\nEarlier in this conversation (left out of the context above to save room; "
    "[#seq date] is where and when each line was said, in order):"
)
RECALL_CLOSE = "</recall>"
#: Longest text taken from one message into a query or a recall line (characters).
MAX_QUERY_CHARS = 4000
#: A recalled line is clipped to this (the whole message is in the ledger at its seq):
#: a grep output that matched must not take the room of five short statements.
MAX_LINE_CHARS = 600


@dataclass(frozen=True, slots=True)
class Recalled:
    """One left-out message the store found (``seq`` of its ``message.appended`` event)."""

    seq: int
    message: Mapping[str, Any]
    #: tokens counted when the message was appended (0: unknown, count it here)
    tokens: int = 0
    #: when it was said (its event's time; None: not known)
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RecallBlock:
    """The recall message for one request (``message`` is None when nothing fit)."""

    message: Mapping[str, Any] | None
    seqs: tuple[int, ...]
    tokens: int
    query: str

    @property
    def empty(self) -> bool:
        return self.message is None


def _block_text(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    if isinstance(value, Sequence):
        for block in value:
            if isinstance(block, Mapping):
                kind = block.get("type")
                if kind == "text" and isinstance(block.get("text"), str):
                    out.append(block["text"])
                elif kind == "tool_use":
                    out.append(json.dumps(block.get("input"), sort_keys=True, ensure_ascii=False))
                elif kind == "tool_result":
                    out.extend(_block_text(block.get("content")))
    return out


def message_text(message: Mapping[str, Any]) -> str:
    """The searchable text of a message: content, tool-call names and arguments, results."""
    content = message.get("content")
    if type(content) is str and message.get("tool_calls") is None:  # prose: most of them
        return content
    parts = _block_text(content)
    calls = message.get("tool_calls")
    if isinstance(calls, Sequence) and not isinstance(calls, str):
        for call in calls:
            fn = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(fn, Mapping):
                name, args = fn.get("name"), fn.get("arguments")
                parts.append(f"{name if isinstance(name, str) else ''}({_args(args)})")
    return "\n".join(p for p in parts if p)


def _args(args: Any) -> str:
    if isinstance(args, str):
        return args
    return json.dumps(args, sort_keys=True, ensure_ascii=False)


#: Words that open a question, and phrases that point back in time: a turn with one asks
#: about the past, and recall may take more of the request (``RecallConfig.max_share``).
_QUESTION_OPENERS = frozenset(
    [
        "what",
        "when",
        "where",
        "who",
        "whom",
        "whose",
        "which",
        "why",
        "how",
        "did",
        "do",
        "does",
        "was",
        "were",
        "is",
        "are",
        "have",
        "has",
        "had",
        "can",
        "could",
        "would",
        "will",
        "should",
        "remind",
        "recall",
        "tell",
    ]
)
_BACK_REFERENCES = (
    "remember", "earlier", "last time", "before", " ago", "previously", "mentioned",
    "you said", "i said", "we said", "told you", "told me", "we discussed", "again",
)  # fmt: skip


def asks_about_past(query: str) -> bool:
    """Whether the latest turn asks something the past may answer: a question (a ``?``, or
    a question word first) or a reference back ("remember", "earlier", "you said")."""
    text = query[:MAX_QUERY_CHARS].strip().lower()
    if not text:
        return False
    if "?" in text:
        return True
    first = text.split(None, 1)[0].strip(",.:;!\"'")
    return first in _QUESTION_OPENERS or any(ref in text for ref in _BACK_REFERENCES)


def leaves_out(view_tokens: int, request: Sequence[ViewItem]) -> bool:
    """Whether a request view leaves out part of the view (``view_tokens``, all of it) or
    carries a summary (which leaves out the detail of what it covers): only then is there
    anything for a wider recall to bring back (a short session's question keeps its whole
    view)."""
    kinds = set(map(_KIND, request))  # at C speed: ~800 items a request at length
    if "summary" in kinds:
        return True
    if "ephemeral" in kinds:
        return view_tokens > sum(i.tokens for i in request if i.kind != "ephemeral")
    carried: int = sum(map(_TOKENS, request))
    return view_tokens > carried


def make_room(view: Sequence[ViewItem], tokens: int) -> int:
    """How many of ``view``'s oldest items (after its leading system messages) to leave
    out so recall gains at most ``tokens``: messages and summaries only, never the latest human
    turn or what follows it, and never a cut that would leave a tool result without its
    call. Returns the end index of that run (its start is ``room_start(view)``).

    The run's sums are taken at C speed and only the items at its end are looked at (one
    by one, 533 items of an 800-item view took 69 µs; so, 41)."""
    start = room_start(view)
    last = latest_turn(view)
    if last is None or tokens <= 0:
        return start
    span = view[start:last]
    kinds = list(map(_KIND, span))
    if not ROOM_KINDS.issuperset(kinds):  # up to the first item that is not one
        span = span[: next(i for i, kind in enumerate(kinds) if kind not in ROOM_KINDS)]
    fits = bisect_right(list(accumulate(map(_TOKENS, span))), tokens)
    for index in range(start + fits, start, -1):  # the longest fitting run ending a unit
        if not result_ids(view[index].message):
            return index
    return start


def room_start(view: Sequence[ViewItem]) -> int:
    """Index of the first item after ``view``'s leading system messages."""
    index = 0
    while index < len(view) and view[index].message.get("role") == "system":
        index += 1
    return index


def give_back(
    view: Sequence[ViewItem], start: int, end: int, spare: int, taken: set[int]
) -> list[ViewItem]:
    """What of the left-out run ``view[start:end]`` comes back into the view with the
    block's unused room (``spare`` tokens): its newest items that fit, newest first, but
    none the block recalled (no line said twice; the block takes tool units whole, so
    skipping them splits none), starting at the start of a unit. In view order.

    Summed at C speed newest first (a recalled item counts nothing), then only the oldest
    items that fit are looked at for the start of a unit (500 items: 54 -> 32 µs)."""
    newest_first = view[start:end][::-1]
    tokens = list(map(_TOKENS, newest_first))
    skip: set[int] = set()
    if not taken.isdisjoint(map(_FIRST, map(_REF, newest_first))):
        skip = {n for n, seq in enumerate(map(_FIRST, map(_REF, newest_first))) if seq in taken}
        for n in skip:
            tokens[n] = 0
    fits = bisect_right(list(accumulate(tokens)), spare)
    for n in range(fits - 1, -1, -1):  # the oldest that fits and starts a unit
        if n not in skip and not result_ids(newest_first[n].message):
            back = view[end - 1 - n : end]
            return [item for item in back if item.ref[0] not in taken] if skip else list(back)
    return []


def latest_turn(view: Sequence[ViewItem]) -> int | None:
    """Index of the latest human user turn in ``view`` (None if there is none)."""
    for index in range(len(view) - 1, -1, -1):
        if view[index].kind != "summary" and is_human_turn(view[index].message):
            return index
    return None


def query_text(view: Sequence[ViewItem]) -> str:
    """What recall asks about: the latest human turn and any tool call made after it."""
    start = latest_turn(view)
    if start is None:
        return ""
    parts = [message_text(view[start].message)[:MAX_QUERY_CHARS]]
    for item in view[start + 1 :]:
        if tool_calls(item.message):
            parts.append(message_text(item.message)[:MAX_QUERY_CHARS])
    return "\n".join(p for p in parts if p)


def search_text(view: Sequence[ViewItem]) -> str:
    """What recall searches for: ``query_text`` with the other forms of the irregular
    words it uses (``word_forms.with_forms``: "where did she go?" finds "I went to
    Lisbon"), when they fit beside its own."""
    return with_forms(query_text(view))


#: View items that stand for ledger messages (a summary's seq is not a message's, an
#: ephemeral message is in no ledger): what a request carries, as recall sees it.
CARRIED_KINDS = frozenset({"message", "synthetic"})
#: What a question's wider recall may take the room of: the oldest messages, and the
#: summaries among them (a question about the past is better served by the turns it
#: matches than by the gist of the oldest ones; unused room gives them back).
ROOM_KINDS = CARRIED_KINDS | {"summary"}


def query_end(view: Sequence[ViewItem]) -> int | None:
    """Index of the last item ``query_text`` reads: the latest tool call after the latest
    human turn, else that turn (None if there is none)."""
    start = latest_turn(view)
    if start is None:
        return None
    end = start
    for index in range(start + 1, len(view)):
        if tool_calls(view[index].message):
            end = index
    return end


def query_anchor(view: Sequence[ViewItem], head: int) -> int:
    """The seq a lexical recall search is taken at: that of the last message its query
    reads (``query_end``), so the search depends on the ledger as of the question, not on
    what came after it (a reply, tool results). A search can then start as soon as that
    message is appended and still be the one the request would make (the request path
    speculates so), and a replay anchors it the same way. ``head`` (the request's seq)
    when that message has no seq (an ephemeral one) or there is no query."""
    return anchor_of(view, query_end(view), head)


def anchor_of(view: Sequence[ViewItem], end: int | None, head: int) -> int:
    """``query_anchor`` with ``query_end(view)`` already known."""
    if end is None:
        return head
    seq = view[end].ref[0] if view[end].kind in CARRIED_KINDS else 0
    return seq if 0 < seq <= head else head


#: Reciprocal rank fusion's constant (Cormack et al. 2009): ranks, not scores, are fused.
#: Small, because a block holds ~10-30 lines: at the paper's 60 (made for deep pools of
#: many rankers) every seq found by both rankers, however far down, outranked each
#: ranker's best found by it alone (a question's best lexical match came 15th of the
#: fused list, below the block's room: ``bench/conversations.py`` with embeddings, 10%
#: budget, 70% any against 80% lexical alone; 81% at 5). Whatever the other ranker says,
#: each ranker's best is among the fused first 2k + 4 (the seqs that can tie or beat it
#: have both ranks a, b with a*b <= (k + 1)^2): 14 at 5, 124 at 60.
RRF_K = 5


def fuse(rankings: Sequence[Sequence[int]], *, k: int = RRF_K) -> list[int]:
    """Reciprocal rank fusion of seq rankings (best first); ties go to the newer seq."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for pos, seq in enumerate(ranking):
            scores[seq] = scores.get(seq, 0.0) + 1.0 / (k + pos + 1)
    return sorted(scores, key=lambda seq: (-scores[seq], -seq))


def strong_matches(
    matches: Sequence[tuple[int, float]], kept: Sequence[int], *, share: float
) -> set[int]:
    """The lexical matches a second hop was found through: those scoring at least ``share``
    of the best (a hop's own finds score below 0), among ``kept`` (a hybrid's fused first
    ``max_matches``: the fused list holds both rankers' candidates, and a strong match far
    down it would put the hop's best below most of the embedding's finds)."""
    best = max((score for _, score in matches), default=0.0)
    among = set(kept)
    return {seq for seq, score in matches if 0 < share * best <= score and seq in among}


def with_hops(
    order: Sequence[int], hops: Sequence[int], strong: Collection[int], *, first: int
) -> list[int]:
    """``order`` with a second hop's finds (best first): its ``first`` best right after the
    last of the ``strong`` matches (what the hop was found through), the rest at the end.
    The strong are lexical matches; after a fusion with an embedding's ranking, those of
    them it kept, wherever the embedding's finds put them (none kept: all at the end)."""
    at = max((n + 1 for n, seq in enumerate(order) if seq in strong), default=len(order))
    return [*order[:at], *hops[:first], *order[at:], *hops[first:]]


def with_neighbours(ranked: Sequence[int], found: Collection[int]) -> list[int]:
    """``ranked`` with the neighbours (seq - 1, seq + 1) of each match that were ``found``,
    each pair right after the next match: the best match, the second, the best's
    neighbours, the third, the second's, and so on (a neighbour is worth less than the
    match it sits by, more than the matches far down the list)."""
    hits = set(ranked)
    out: list[int] = []
    seen: set[int] = set()

    def near(seq: int) -> None:
        for n in (seq - 1, seq + 1):
            if n in found and n not in hits and n not in seen:
                seen.add(n)
                out.append(n)

    for index, seq in enumerate(ranked):
        out.append(seq)
        if index:
            near(ranked[index - 1])
    if ranked:
        near(ranked[-1])
    return out


def recall_budget(budget_tokens: int, share: float) -> int:
    """Tokens reserved for the recall block out of a request budget."""
    return max(0, math.floor(budget_tokens * share))


def units_of(messages: Sequence[Recalled]) -> list[tuple[Recalled, ...]]:
    """Group seq-ordered left-out messages into tool units (call + its direct results).

    Messages must be consecutive in the branch to join a unit; a gap in seq (a
    message in the view, or on another branch) ends it.
    """
    units: list[list[Recalled]] = []
    open_ids: set[str] = set()
    for rec in messages:
        answers = set(result_ids(rec.message))
        if (
            units
            and open_ids
            and answers
            and answers <= open_ids
            and rec.seq == units[-1][-1].seq + 1
        ):
            units[-1].append(rec)
            open_ids -= answers
            continue
        units.append([rec])
        open_ids = {c for c, _ in tool_calls(rec.message)}
    return [tuple(u) for u in units]


#: Longest participant name a recalled line carries (OpenAI's limit for ``name``).
MAX_NAME_CHARS = 64
_NAME_UNSAFE = re.compile(r"[\]\[\s]+")


def speaker(message: Mapping[str, Any]) -> str | None:
    """A message's participant ``name`` as a line can carry it (brackets and whitespace
    runs made one space, at most ``MAX_NAME_CHARS``), None without one: in a conversation
    of several people, who said a line is half of what it says."""
    name = message.get("name")
    if not isinstance(name, str):
        return None
    name = _NAME_UNSAFE.sub(" ", name).strip()[:MAX_NAME_CHARS].strip()
    return name or None


def _role(rec: Recalled) -> str:
    """Who a recalled line names: its role ("tool result" for a result a user message
    carries), and its participant's name where the message has one ("user Caroline")."""
    role = str(rec.message.get("role", ""))
    if role in ("tool", "user") and result_ids(rec.message):
        role = "tool result"
    name = speaker(rec.message)
    return role if name is None else f"{role} {name}"


def _line(rec: Recalled, *, dated: bool = True) -> str:
    text = _clipped(message_text(rec.message))
    # when it was said (isoformat: strftime was a third of a line's cost)
    when = " " + rec.at.date().isoformat() if dated and rec.at is not None else ""
    return f"[#{rec.seq}{when} {_role(rec)}] {text}"


def _dates(recs: Sequence[Recalled]) -> list[bool]:
    """Which of seq-ordered ``recs`` are dated: the first, and each whose day differs
    from the line before's (when something was said, without a date on every line)."""
    out: list[bool] = []
    day = None
    for n, rec in enumerate(recs):
        today = rec.at.date() if rec.at is not None else None
        out.append(n == 0 or today != day)
        day = today
    return out


def _lines(recs: Sequence[Recalled]) -> list[str]:
    """The block's lines in seq order, dated where the day changes (``_dates``)."""
    return [_line(rec, dated=d) for rec, d in zip(recs, _dates(recs), strict=True)]


def _render(lines: Sequence[str]) -> dict[str, Any]:
    return {"role": "user", "content": "\n".join((RECALL_OPEN, *lines, RECALL_CLOSE))}


@lru_cache(maxsize=512)
def _cached_count(counter: TokenCounter, role: str, content: str, name: str) -> int:
    return counter.count_message({"role": role, "content": content, "name": name})


def _fixed(counter: TokenCounter, role: str, content: str = "", name: str = "") -> int:
    """A fixed text's tokens as a message of ``role`` (a frame, an empty message of a
    role and participant name), counted once per counter (the name as ``speaker`` gives
    it: at most 64 characters a key)."""
    try:
        return _cached_count(counter, role, content, name)  # type: ignore[arg-type]
    except TypeError:  # a counter that cannot be a key: counted each time
        return counter.count_message({"role": role, "content": content, "name": name})


#: What clipping may add to a line's tokens over its message's: its marker (" [...]", 3 in
#: o200k) and the word it cuts (1 more at most in o200k, measured on text just past the
#: clip; a tokenizer may split a word's prefix finer), with room to spare.
CLIP_TOKENS = 8
#: Tokens a line's head may take beyond the head counted for its role on the block's
#: newest seq and latest date: another seq's digits and another day's date can take more
#: in some tokenizers (Claude's: up to 2-3 on six digits, 1 on a date).
HEAD_SLACK = 3


class _Costs:
    """Upper bounds of a line's tokens before the block is rendered. Its text: for plain
    prose (a string content, no tool calls: the line holds the text its message was
    counted with at append, ``Recalled.tokens``, or a prefix of it), that count less a
    message's own overhead (plus ``CLIP_TOKENS`` where it is clipped: a prefix estimated
    by its share of the characters was ~16x under for dense text before a sparse tail),
    while that is at most half a token a character the line shows; for anything else
    (content blocks, tool calls, no count, a count far above the line's text), the line's
    text counted (at most ``MAX_LINE_CHARS``: tokenizing every clipped line of
    `bench/turns.py` cost ~2 ms a request). Its head ("[#seq date role] " and the line
    break): counted once per role on the block's newest seq and latest date, with and
    without the date, plus ``HEAD_SLACK``."""

    def __init__(self, counter: TokenCounter, recs: Sequence[Recalled]) -> None:
        self._counter = counter
        self._seq = max((r.seq for r in recs), default=0)
        days = [r.at.date() for r in recs if r.at is not None]  # (naive and aware alike)
        self._day = max(days).isoformat() if days else "2000-01-01"
        self._empty = _fixed(counter, "user")
        self._lines: dict[int, tuple[int, int]] = {}  # seq: its line undated, dated
        self._heads: dict[tuple[str, bool], int] = {}
        #: what dating a line adds (to the line after a unit, whose day it may change)
        self.date = self.head("user", True) - self.head("user", False)

    def head(self, role: str, dated: bool) -> int:
        found = self._heads.get((role, dated))
        if found is None:
            when = f" {self._day}" if dated else ""
            text = f"[#{self._seq}{when} {role}] \n"
            found = self._counter.count_message({"role": "user", "content": text})
            found += HEAD_SLACK - self._empty
            self._heads[role, dated] = found
        return found

    def line(self, rec: Recalled, dated: bool) -> int:
        """A line's tokens: its text (``body``) and its head."""
        found = self._lines.get(rec.seq)
        if found is None:
            role, body = _role(rec), self.body(rec)
            found = self._lines[rec.seq] = (
                body + self.head(role, False),
                body + self.head(role, True),
            )
        return found[dated]

    def body(self, rec: Recalled) -> int:
        message = rec.message
        content = message.get("content")
        if rec.tokens and type(content) is str and message.get("tool_calls") is None:
            name = speaker(message) or ""  # (at least what the count held of the name)
            overhead = _fixed(self._counter, str(message.get("role", "")), "", name)
            body = max(0, rec.tokens - overhead)
            # a clipped line is a prefix of the text counted, and its marker
            body += CLIP_TOKENS if len(content) > MAX_LINE_CHARS else 0
            if body <= min(len(content), MAX_LINE_CHARS) // 2 + CLIP_TOKENS:
                return body
            # the count held far more than the line shows (a long text clipped, a
            # reasoning model's thoughts, a dense script): the line is counted
        text = _clipped(message_text(message))
        return self._counter.count_message({"role": "user", "content": text}) - self._empty

    def unit(self, unit: Sequence[Recalled], dated: bool = True) -> int:
        """A unit's lines, each dated: what it costs wherever it lands, but for the line
        after it, which it may leave with a day of its own (``date``); or undated."""
        if not dated:
            return sum(self.line(r, False) for r in unit)
        return sum(self.line(r, True) for r in unit) + self.date

    def block(self, frame: int, recs: Sequence[Recalled]) -> int:
        """The block's tokens: its frame and its lines, dated as ``_lines`` dates them."""
        dated = _dates(recs)
        return frame + sum(self.line(r, d) for r, d in zip(recs, dated, strict=True))


def pick(
    ranked: Sequence[int],
    messages: Sequence[Recalled],
    *,
    budget_tokens: int,
    counter: TokenCounter,
    query: str = "",
) -> RecallBlock:
    """The recall block: the best-ranked units of ``messages`` that fit ``budget_tokens``.

    ``ranked`` lists matched seqs best first; ``messages`` holds the matches and
    their neighbours (seq order) so tool units can be taken whole. The block's
    own tokens (frame included) never exceed ``budget_tokens``; ``RecallBlock.tokens`` is
    their count, or an upper bound of it (``_Costs``) when that is well within the budget.

    Units are taken best first at their costs dated (``_Costs.unit``); most lines carry
    no date (only where the day changes), so a second pass fills what the dates did not
    take, from the block's own estimate, and a third what its exact count shows: at a
    tight budget the first pass alone left ~30% of the block's room unused
    (``bench/conversations.py``, 10%).
    """
    ordered = sorted({m.seq: m for m in messages}.values(), key=lambda m: m.seq)

    def block(units: Sequence[tuple[Recalled, ...]]) -> dict[str, Any]:
        return _render(_lines([rec for unit in units for rec in unit]))

    unit_of: dict[int, tuple[Recalled, ...]] = {}
    for unit in units_of(ordered):
        for rec in unit:
            unit_of[rec.seq] = unit
    frame = _fixed(counter, "user", _render([])["content"])
    if budget_tokens <= frame:
        return RecallBlock(None, (), 0, query)
    costs = _Costs(counter, ordered)
    chosen: dict[int, tuple[Recalled, ...]] = {}
    cost_of: dict[int, int] = {}
    best = next((unit_of[seq] for seq in ranked if seq in unit_of), None)

    def in_order() -> list[tuple[Recalled, ...]]:
        return [chosen[k] for k in sorted(chosen)]

    def take(used: int, scale: float | None = None) -> bool:
        """Add the best-ranked units not chosen yet that fit beside ``used`` tokens, each
        at its cost (``scale``: undated, times that); the best unit at its count, so a
        bigger budget never leaves it out where a smaller one took it. Whether it left
        any for want of room."""
        left = False
        for seq in ranked:
            unit = unit_of.get(seq)
            if unit is None or unit[0].seq in chosen:
                continue
            if unit is best and not chosen:
                cost = counter.count_message(block([unit])) - frame
            elif scale is None:
                cost = costs.unit(unit)
            else:
                cost = math.ceil(costs.unit(unit, dated=False) * scale)
            if used + cost <= budget_tokens:
                chosen[unit[0].seq] = unit
                cost_of[unit[0].seq] = cost
                used += cost
            else:
                left = True
        return left

    def estimate() -> int:
        return costs.block(frame, [r for unit in in_order() for r in unit])

    left = take(frame)
    if not chosen:
        return RecallBlock(None, (), 0, query)
    used = estimate()
    if left:  # the block as dated, and what the dates left
        left = take(used)
        used = estimate()
    units = in_order()
    message = block(units)
    if used <= budget_tokens * EXACT_ABOVE:
        # The estimate is an upper bound: the block fits without tokenizing it whole
        # again (~1 ms per 2,000 tokens, on every request past the budget).
        return RecallBlock(message, tuple(r.seq for u in units for r in u), used, query)
    tokens = counter.count_message(message)
    late: set[int] = set()  # what the third pass added: shed first
    if left and tokens < used:  # counted: the room the estimates took, at undated costs
        before = set(chosen)  # as the count scales them (a unit that runs over is shed)
        take(tokens, (tokens - frame) / (used - frame))
        late = set(chosen) - before
        if late:
            units = in_order()
            message = block(units)
            tokens = counter.count_message(message)
    while tokens > budget_tokens and len(units) > 1:  # per-line estimates ran over: shed
        excess = tokens - budget_tokens  # the third pass's, then the worst-ranked units,
        while excess > 0 and len(units) > 1:  # as many as cover it
            worst = max(
                range(len(units)),
                key=lambda i: (units[i][0].seq in late, ranked_pos(ranked, units[i])),
            )
            excess -= cost_of[units.pop(worst)[0].seq]
        message = block(units)
        tokens = counter.count_message(message)
    if tokens > budget_tokens:
        return RecallBlock(None, (), 0, query)
    return RecallBlock(message, tuple(r.seq for u in units for r in u), tokens, query)


#: Below this share of its budget a block's tokens are its lines' estimates (upper bounds
#: but for a tokenizer's quirks, which this margin covers); above it, the block is counted
#: exactly (and shed if the estimates were not enough).
EXACT_ABOVE = 0.6


def _clipped(text: str) -> str:
    """A line's text: at most ``MAX_LINE_CHARS`` (the whole message is in the ledger)."""
    return text[:MAX_LINE_CHARS] + " [...]" if len(text) > MAX_LINE_CHARS else text


def ranked_pos(ranked: Sequence[int], unit: Sequence[Recalled]) -> int:
    """Best (lowest) rank position of any message of ``unit`` (len(ranked) if none)."""
    seqs = {r.seq for r in unit}
    return next((i for i, s in enumerate(ranked) if s in seqs), len(ranked))


def place(view: Sequence[ViewItem], block: RecallBlock) -> tuple[ViewItem, ...]:
    """``view`` with the recall block right before the latest human turn."""
    if block.message is None:
        return tuple(view)
    at = latest_turn(view)
    if at is None:
        return tuple(view)
    return (*view[:at], block_item(view[at], block.message, block), *view[at:])


def block_item(turn: ViewItem, message: Mapping[str, Any], block: RecallBlock) -> ViewItem:
    """The recall block as the view item ``place`` puts right before ``turn``."""
    return ViewItem(
        ref=(-turn.seq, -1),
        ord=turn.ord - ORD_STRIDE // 4,
        message=message,
        tokens=block.tokens,
        kind="ephemeral",
        meta={"recall": list(block.seqs)},
    )
