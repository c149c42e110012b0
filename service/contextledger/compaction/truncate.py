"""Truncation: keep the system messages and the recent window, drop the oldest rest.

The window is the last ``keep_recent`` non-system messages, widened backwards to
the start of the unit it begins in, so a tool pair straddling its edge is kept
whole. Everything older is dropped outright (predictable, cache-friendly: the
cut only ever moves forward); if the view is still over target, the window's
units go oldest first. Protected units and summaries are handled by the engine.
"""

from __future__ import annotations

from contextledger.compaction.plan import Layout, Ranking


def truncate_ranking(layout: Layout) -> Ranking:
    units = range(len(layout.units))
    system = [k for k in units if layout.is_system(k)]
    forced = tuple(k for k in units if k < layout.recent_unit and not layout.is_system(k))
    window = [k for k in units if k >= layout.recent_unit and not layout.is_system(k)]
    return Ranking(forced=forced, order=(*window, *system))
