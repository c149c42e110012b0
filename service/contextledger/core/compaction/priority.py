"""Priority truncation (after Vellum's AutoContextManager): drop the least valuable first.

Each message gets a priority - system 100, the first human turn (the anchor, the
task as first stated) 90, the last ``keep_recent`` messages 80, tool units 70,
everything else 30 - and a unit takes the highest of its members. Units go
lowest priority first, oldest first within a priority, only until the target
is met. Summaries and protected units are handled by the engine.
"""

from __future__ import annotations

from contextledger.core.compaction.engine import Layout, Ranking
from contextledger.core.units import is_tool_message

SYSTEM = 100
ANCHOR = 90
RECENT = 80
TOOL_PAIR = 70
NORMAL = 30


def unit_priorities(layout: Layout) -> list[int]:
    """Priority of every unit: the maximum over its members."""
    out: list[int] = []
    for k in range(len(layout.units)):
        best = NORMAL
        for item in layout.members(k):
            if item.role == "system":
                best = max(best, SYSTEM)
            elif is_tool_message(item.message) or item.kind == "synthetic":
                best = max(best, TOOL_PAIR)
        if k == layout.anchor_unit:
            best = max(best, ANCHOR)
        if k >= layout.recent_unit:
            best = max(best, RECENT)
        out.append(best)
    return out


def priority_ranking(layout: Layout) -> Ranking:
    priorities = unit_priorities(layout)
    order = sorted(range(len(layout.units)), key=lambda k: (priorities[k], k))
    return Ranking(order=tuple(order))
