"""The request-view planner: ephemeral compaction with hysteresis and a stable prefix.

Two failure modes of naive per-request compaction (see amplifier context-simple's
incidents) shape this module:

* the *compaction storm*: a view sitting just above its trigger compacts on
  every request. Here a pass triggers only when the view passes
  ``compact_threshold x budget`` and then goes down to ``compact_target x budget``,
  so the next pass is a whole threshold-target gap of new messages away. If a
  pass could not get under the threshold (the protected core is too big), the
  next one waits for the hard budget instead of running on every request.
* the *cache buster*: re-deciding from scratch changes the start of the prompt
  each time and defeats the provider's prompt cache. ``RequestState`` remembers
  the last decision (dropped refs, pruned replacements, the cut point); the next
  request reuses it and only appends what is new. The returned view changes
  before its end only when a new pass runs.

A state is tied to its budget, its config and the part of the view it saw: if any
changes, planning starts afresh. Pure: the caller keeps the state (e.g. in the session object).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from contextledger.compaction.plan import apply_plan, plan
from contextledger.config import ContextConfig
from contextledger.errors import InvalidArgument
from contextledger.tokens import TokenCounter
from contextledger.units import repair
from contextledger.view import Ref, ViewItem


@dataclass(frozen=True, slots=True)
class RequestState:
    """What the last compaction pass decided, to be reused by the next request."""

    budget_tokens: int
    config: ContextConfig
    dropped: frozenset[Ref] = frozenset()
    #: ref -> the pruned item that replaces it
    pruned: Mapping[Ref, ViewItem] = field(default_factory=lambda: MappingProxyType({}))
    #: the last pass saw the view items ``seen`` up to ``horizon`` (an ord); later items
    #: are new. If that part of the view changed (rewritten here or by another process),
    #: the decision no longer applies and planning starts afresh.
    horizon: int = -1
    seen: frozenset[Ref] = frozenset()
    #: view tokens right after the last pass
    tokens_after: int = 0
    passes: int = 0
    warnings: tuple[str, ...] = ()


def thresholds(budget_tokens: int, config: ContextConfig) -> tuple[int, int, int]:
    """``(budget, trigger, target)`` in tokens; ``max_tokens`` caps the budget."""
    if budget_tokens <= 0:
        raise InvalidArgument(
            f"budget_tokens must be > 0, got {budget_tokens}", key="budget_tokens"
        )
    budget = min(budget_tokens, config.max_tokens) if config.max_tokens else budget_tokens
    trigger = math.floor(config.compact_threshold * budget)
    target = max(1, math.floor(config.compact_target * budget))
    return budget, trigger, target


def plan_request(
    items: Sequence[ViewItem],
    *,
    budget_tokens: int,
    config: ContextConfig,
    counter: TokenCounter,
    previous: RequestState | None = None,
) -> tuple[tuple[ViewItem, ...], RequestState]:
    """The (provider-valid) view to send and the state to pass to the next call."""
    budget, trigger, target = thresholds(budget_tokens, config)
    reuse = (
        previous is not None
        and previous.budget_tokens == budget
        and previous.config == config
        and frozenset(i.ref for i in items if i.ord <= previous.horizon) == previous.seen
    )
    if previous is not None and reuse:
        base = [
            previous.pruned.get(item.ref, item)
            for item in items
            if item.ref not in previous.dropped
        ]
    else:
        base = list(items)
    repaired = repair(base, counter=counter)
    total = sum(item.tokens for item in repaired.items)
    if previous is not None and reuse:
        stuck = previous.tokens_after > trigger
        if total <= trigger or (stuck and total <= budget):
            return repaired.items, previous
    elif total <= trigger:
        return repaired.items, RequestState(
            budget_tokens=budget, config=config, passes=previous.passes if previous else 0
        )

    decided = plan(base, target_tokens=target, budget_tokens=budget, config=config, counter=counter)
    view = apply_plan(base, decided, counter)
    pruned: dict[Ref, ViewItem] = dict(previous.pruned) if previous is not None and reuse else {}
    for item in view:
        if item.ref in decided.prune:
            pruned[item.ref] = item
    dropped = (previous.dropped if previous is not None and reuse else frozenset()) | set(
        decided.drop
    )
    for ref in dropped & pruned.keys():
        del pruned[ref]
    state = RequestState(
        budget_tokens=budget,
        config=config,
        dropped=frozenset(dropped),
        pruned=MappingProxyType(pruned),
        horizon=max((item.ord for item in items), default=-1),
        seen=frozenset(item.ref for item in items),
        tokens_after=decided.tokens_after,
        passes=(previous.passes if previous is not None else 0) + 1,
        warnings=decided.warnings,
    )
    return view, state
