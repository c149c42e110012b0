"""Pure compaction: a view + a target + a config -> a ``Plan`` (no DB, no network, no clock).

``plan`` dispatches to a strategy by name (``truncate``, ``priority``, ``importance``:
each module holds only its ranking; ``plan.run`` is the one engine behind them;
``summarize`` returns the range to fold plus a deterministic fallback); the
shared engine in ``plan.py`` enforces the invariants every strategy must keep.
``plan_request`` adds hysteresis and prefix stability for per-request views;
``select_for_summary`` chooses what a summarizer should fold.
"""

from contextledger.compaction.dedupe import duplicate_refs
from contextledger.compaction.importance import importance_scores
from contextledger.compaction.plan import Layout, Plan, Ranking, apply_plan, plan
from contextledger.compaction.priority import unit_priorities
from contextledger.compaction.prune import is_pruned, prune_tool_outputs
from contextledger.compaction.request import RequestState, plan_request
from contextledger.compaction.select import select_for_summary

__all__ = [
    "Layout",
    "Plan",
    "Ranking",
    "RequestState",
    "apply_plan",
    "duplicate_refs",
    "importance_scores",
    "is_pruned",
    "plan",
    "plan_request",
    "prune_tool_outputs",
    "select_for_summary",
    "unit_priorities",
]
