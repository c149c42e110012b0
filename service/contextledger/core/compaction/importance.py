"""Importance: score messages by heuristics (open_agent's design) and drop the lowest.

Scores: human turns 1.0 (they state what is wanted), tool calls and results 1.0
(the workflow's facts), system 1.0, assistant replies that state a fact (a
salient term: a number, an identifier, a path, an address) 1.0 like a user who
states one, other long assistant replies 0.6, short ones 0.2 (acknowledgements),
anything else 0.5. A message before the last
few that shares a *salient term* with them - an identifier with ``_``/digits/
camelCase, a file name or path, a number of two digits or more - is referenced
by the current work and scores at least 0.9. A unit scores its best member.

Units under ``min_score`` outside the recent window are dropped outright; the
rest go lowest score first, older first among equal scores (recency as the
tiebreak), only until the target is met.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from contextledger.core.compaction.engine import Layout, Ranking
from contextledger.core.messages import text_of
from contextledger.core.units import is_human_turn, is_tool_message
from contextledger.core.view import ViewItem

HIGH = 1.0
REFERENCED = 0.9
MEDIUM = 0.6
OTHER = 0.5
LOW = 0.2
#: assistant replies shorter than this are acknowledgements
SHORT_CHARS = 120
#: how many of the last messages define "what the work is about now"
REFERENCE_WINDOW = 4

_WORD_RE = re.compile(r"[\w][\w./:-]*")
_CAMEL_RE = re.compile(r"[a-z][A-Z]")


def salient_terms(text: str) -> set[str]:
    """Identifiers, file names, paths and numbers: words that tie messages together."""
    terms: set[str] = set()
    for raw in _WORD_RE.findall(text):
        word = raw.strip("./:-")
        if word.isdigit():
            if len(word) >= 2:
                terms.add(word)
        elif len(word) >= 4 and (
            "_" in word
            or "." in word
            or "/" in word
            or any(c.isdigit() for c in word)
            or _CAMEL_RE.search(word)
        ):
            terms.add(word)
    return terms


def base_score(item: ViewItem) -> float:
    message = item.message
    if item.role == "system" or item.kind == "summary":
        return HIGH
    if is_tool_message(message) or item.kind == "synthetic" or item.role == "tool":
        return HIGH
    if is_human_turn(message):
        return HIGH
    if item.role == "assistant":
        text = text_of(message).strip()
        if salient_terms(text):  # "the limiter now lives in src/net/bucket.py" is a fact
            return HIGH
        return LOW if len(text) < SHORT_CHARS else MEDIUM
    return OTHER


def importance_scores(
    items: Sequence[ViewItem], *, reference_window: int = REFERENCE_WINDOW
) -> list[float]:
    """Score of every item (see the module docstring). O(total text)."""
    scores = [base_score(item) for item in items]
    window: list[int] = []
    for pos in range(len(items) - 1, -1, -1):
        if len(window) >= reference_window:
            break
        if items[pos].role != "system":
            window.append(pos)
    if not window:
        return scores
    recent_terms: set[str] = set()
    for pos in window:
        recent_terms |= salient_terms(text_of(items[pos].message))
    if not recent_terms:
        return scores
    for pos in range(min(window)):
        if scores[pos] < REFERENCED and salient_terms(text_of(items[pos].message)) & recent_terms:
            scores[pos] = REFERENCED
    return scores


def importance_ranking(layout: Layout) -> Ranking:
    scores = importance_scores(layout.items)
    unit_scores = [max(scores[p] for p in range(unit.start, unit.stop)) for unit in layout.units]
    floor = layout.config.min_score
    forced = tuple(k for k, s in enumerate(unit_scores) if s < floor and k < layout.recent_unit)
    order = sorted(range(len(layout.units)), key=lambda k: (unit_scores[k], k))
    return Ranking(forced=forced, order=tuple(order))
