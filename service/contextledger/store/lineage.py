"""Where a fork's seqs live: its ancestors' events up to each fork point, then its own.

A fork stands on its parent's chain: seqs ``1..parent_seq`` are the parent's events
(themselves perhaps a fork's), nothing copied. ``Lineage`` lists the ancestors root
first, each with the last seq read from it; ``segments`` cuts a seq range into the
per-session ranges a store reads, one statement per session (never a join of two).
"""

from __future__ import annotations

#: ``((ancestor id, last seq read from it), ...)``, root first; ``()`` for a session
#: that is no fork.
Lineage = tuple[tuple[str, int], ...]


def segments(session_id: str, lineage: Lineage, lo: int, hi: int) -> list[tuple[str, int, int]]:
    """``(session, first, last)`` ranges holding seqs ``lo..hi``, oldest first."""
    out: list[tuple[str, int, int]] = []
    start = 1
    for owner, upto in lineage:
        a, b = max(lo, start), min(hi, upto)
        if a <= b:
            out.append((owner, a, b))
        start = upto + 1
    a = max(lo, start)
    if a <= hi:
        out.append((session_id, a, hi))
    return out


def owner_of(session_id: str, lineage: Lineage, seq: int) -> str:
    """The session whose event is seq ``seq`` of ``session_id``."""
    for owner, upto in lineage:
        if seq <= upto:
            return owner
    return session_id
