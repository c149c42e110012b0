"""Pure compaction: a view + a target + a config -> a ``Plan`` (no DB, no network, no clock).

``plan`` (``strategies.py``) dispatches to a strategy by name (``truncate``,
``priority``, ``importance``: each module holds only its ranking; ``summarize``
returns the range to fold plus a deterministic fallback); the shared engine in
``engine.py`` enforces the invariants every strategy must keep.
``RequestPlanner`` / ``plan_view`` build per-request views incrementally, with a
stable prefix;
``select_for_summary`` chooses what a summarizer should fold.
"""

from contextledger.core.compaction.dedupe import duplicate_refs
from contextledger.core.compaction.engine import Layout, Plan, Ranking, apply_plan
from contextledger.core.compaction.importance import importance_scores
from contextledger.core.compaction.priority import unit_priorities
from contextledger.core.compaction.prune import is_pruned, prune_tool_outputs
from contextledger.core.compaction.request import (
    RequestPlanner,
    plan_view,
)
from contextledger.core.compaction.select import select_for_summary
from contextledger.core.compaction.strategies import RANKERS, plan

__all__ = [
    "RANKERS",
    "Layout",
    "Plan",
    "Ranking",
    "RequestPlanner",
    "apply_plan",
    "duplicate_refs",
    "importance_scores",
    "is_pruned",
    "plan",
    "plan_view",
    "prune_tool_outputs",
    "select_for_summary",
    "unit_priorities",
]
