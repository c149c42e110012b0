"""What a summarizer should fold: a contiguous range of the view just before the kept tail.

The ledger's summary event replaces an explicit range ``from_seq..to_seq``, so
the selection must be contiguous in the view. Decisions:

* The tail kept verbatim is the last ``preserve_recent_turns`` turns, or - when
  ``preserve_tokens`` is given - the shortest run of final units holding at least
  that many tokens. A *turn* starts at every human user message, and at every
  assistant unit not directly answering one (each further step of an agent
  loop), so a tool-heavy loop with a single human message still has turns.
* The tail starts on a unit boundary, so a tool pair is never split.
* The range runs backwards from the tail to the first *barrier*: a unit holding
  a system message, a critical item or an ephemeral item (not in the ledger, so
  not replaceable). Stopping at the barrier nearest to the tail keeps the range
  contiguous and means the most recent summary - which sits where its range
  began, right after such a barrier or at the start - is folded again (rolling).
* Fewer than ``min_messages`` non-summary messages in the range -> None: folding
  a summary with a message or two is not worth a model call.
"""

from __future__ import annotations

from collections.abc import Sequence

from contextledger.core.units import Unit, group_units, is_human_turn
from contextledger.core.view import Ref, ViewItem


def _is_barrier(items: Sequence[ViewItem], unit: Unit) -> bool:
    return any(
        item.role == "system" or item.critical or item.kind == "ephemeral"
        for item in items[unit.start : unit.stop]
    )


def _turn_starts(items: Sequence[ViewItem], units: Sequence[Unit]) -> list[bool]:
    starts: list[bool] = []
    previous_human = False
    for unit in units:
        first = items[unit.start].message
        human = is_human_turn(first)
        starts.append(human or (first.get("role") == "assistant" and not previous_human))
        previous_human = human
    return starts


def tail_start(
    items: Sequence[ViewItem],
    units: Sequence[Unit],
    *,
    preserve_recent_turns: int,
    preserve_tokens: int | None,
) -> int:
    """Index of the first unit of the preserved tail (``len(units)`` = empty tail)."""
    tail = len(units)
    if preserve_tokens is not None:
        held = 0
        while tail > 0 and held < preserve_tokens:
            tail -= 1
            unit = units[tail]
            held += sum(item.tokens for item in items[unit.start : unit.stop])
        return tail
    if preserve_recent_turns <= 0:
        return tail
    starts = _turn_starts(items, units)
    turns = 0
    for k in range(len(units) - 1, -1, -1):
        if starts[k]:
            turns += 1
            if turns >= preserve_recent_turns:
                return k
    return 0


def select_for_summary(
    items: Sequence[ViewItem],
    *,
    preserve_recent_turns: int = 5,
    preserve_tokens: int | None = None,
    min_messages: int = 4,
) -> tuple[Ref, ...] | None:
    """Refs (in view order, contiguous) a summary should replace, or None if not worth it."""
    units = group_units(items)
    tail = tail_start(
        items, units, preserve_recent_turns=preserve_recent_turns, preserve_tokens=preserve_tokens
    )
    start = tail
    while start > 0 and not _is_barrier(items, units[start - 1]):
        start -= 1
    if start >= tail:
        return None
    chosen = items[units[start].start : units[tail - 1].stop]
    if sum(1 for item in chosen if item.kind != "summary") < min_messages:
        return None
    return tuple(item.ref for item in chosen)
