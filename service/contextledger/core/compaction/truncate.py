"""Truncation: keep the system messages and the recent window, fill the rest newest-first.

The window - the last ``keep_recent`` non-system messages, widened backwards to
the start of the unit it begins in so a tool pair straddling its edge stays whole -
is a *floor* the engine keeps unless the budget itself cannot hold it. Older
units then go oldest first until the view fits the target, and the engine puts
back any dropped unit that still fits, newest first: the view is filled up to
the target rather than cut down to the window. Protected units and summaries are
handled by the engine.
"""

from __future__ import annotations

from contextledger.core.compaction.engine import Layout, Ranking


def truncate_ranking(layout: Layout) -> Ranking:
    units = range(len(layout.units))
    system = [k for k in units if layout.is_system(k)]
    rest = [k for k in units if not layout.is_system(k)]
    return Ranking(order=(*rest, *system))
